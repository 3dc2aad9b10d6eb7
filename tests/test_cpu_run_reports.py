"""A CPU run's reports say what it measured (issue 48): each report's first sentences name it a
CPU/interpreter run and answer at the shapes it did measure; the per-device summary (06, the
index) shows no CPU "saving" beside a GPU's figures."""

import pandas as pd
import pytest

from rope_kernels.study import summaries as S
from rope_kernels.study.reports import _summary_frame
from rope_kernels.study.specs import CORRECTNESS_CSV, ENCODER_LATENCY_CSV, LAUNCHES_CSV, MICROBENCH_CSV
from rope_kernels.study.summary import CPU_TIMING, device_summary


def _cpu_files(kind="cpu"):
    micro, enc = [], []
    for tokens in (16, 33):
        for head_dim in (8, 72):
            for v, us in (("native", 900.0), ("fused", 400.0), ("vllm_packed_qk", 700.0), ("liger", 650.0)):
                micro.append({"variant": v, "tokens": tokens, "heads": 2, "head_dim": head_dim,
                              "dtype": "bfloat16", "mode": "eager", "median_us": us * tokens / 16,
                              "device_kind": kind, "device_name": kind, "git_commit": "a" * 12})
    for res in ("56x56", "112x84"):
        for images in (1, 2):
            for v, ms in (("native", 20.0), ("fused", 39.0), ("none", 15.0)):
                enc.append({"variant": v, "resolution": res, "images": images, "mode": "eager",
                            "median_ms": ms * images, "device_kind": kind, "device_name": kind,
                            "vit_tokens": 16 * images, "git_commit": "b" * 12})
    corr = pd.DataFrame([{"variant": v, "tokens": 7, "heads": 3, "head_dim": 72, "dtype": "bfloat16",
                          "supported": True, "passed": True, "max_abs_err": e, "native_max_abs_err": 0.01,
                          "device_kind": kind} for v, e in (("native", 0.01), ("fused", 0.012))])
    launches = pd.DataFrame([{"variant": v, "recorded": n, "tokens": 64, "heads": 4, "head_dim": 72,
                              "layers": 27, "device_kind": kind} for v, n in (("native", 6), ("fused", 1))])
    micro, enc = pd.DataFrame(micro), pd.DataFrame(enc)
    return {"microbench": micro, MICROBENCH_CSV: micro, "encoder": enc, ENCODER_LATENCY_CSV: enc,
            "qkv_gemm": pd.DataFrame(), "correctness": corr, CORRECTNESS_CSV: corr, LAUNCHES_CSV: launches}


@pytest.mark.parametrize("stem", list(S.REPORTS))
def test_a_cpu_runs_report_opens_by_saying_so(stem):
    lines = S.report_lines(stem, _cpu_files())
    assert lines[0] == S.CPU_RUN
    assert "not measured" not in " ".join(lines[:2]), lines[:2]


def test_a_gpu_runs_report_does_not():
    for stem in S.REPORTS:
        assert S.CPU_RUN not in S.report_lines(stem, _cpu_files("cuda"))


def test_cpu_kernel_line_answers_at_the_largest_measured_shape():
    line = S.report_lines("02_microbench", _cpu_files())[1]
    assert "33 tokens x 2 x 72" in line and "4 variants ran" in line
    assert f"{S.name('native')} {S.fmt_us(900.0 * 33 / 16)}" in line
    assert "1 more in the tables below" in line  # liger: not ours, native or shipped


def test_cpu_encoder_line_answers_at_the_largest_measured_bucket():
    line = S.report_lines("04_ttft", _cpu_files())[1]
    assert "at 2 images of 112x84 (eager, medians)" in line
    assert f"{S.name('native')} 40.0 ms" in line and "RoPE skipped 30.0 ms" in line
    assert "%" not in line  # no saving on interpreter timings


def test_cpu_summary_names_what_the_run_wrote():
    line = S.report_lines("06_summary", _cpu_files())[1]
    assert f"`{MICROBENCH_CSV}` (16 rows)" in line and f"`{ENCODER_LATENCY_CSV}` (12 rows)" in line
    assert f"`{LAUNCHES_CSV}` (2 rows)" in line


def test_no_cpu_saving_beside_a_gpus():
    cpu = _cpu_files()
    gpu = _cpu_files("cuda")
    rows = [{"device": "cpu", **device_summary(cpu["microbench"], cpu["encoder"])},
            {"device": "big-gpu", **device_summary(gpu["microbench"], gpu["encoder"])}]
    assert rows[0]["timed_on"] == CPU_TIMING and rows[1]["timed_on"] == "GPU"
    assert "encoder_saving_pct" not in rows[0] and "encoder_saving_pct" in rows[1]
    assert rows[0]["encoder_native_ms"] == 40.0  # its own times stay, labelled
    table = _summary_frame(pd.DataFrame(rows))
    assert list(table["timed on"]) == [CPU_TIMING, "GPU"]
    assert table.filter(like="saving").iloc[0].eq("-").all()
