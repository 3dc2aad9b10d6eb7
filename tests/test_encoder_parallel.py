"""The encoder parallel modes (issue 42): one GPU's shard, the modelled collectives, vLLM's
chunked prefill, and the rows they give (encoder_parallel.py, prefill.py)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from rope_kernels import encoder_parallel as ep
from rope_kernels import prefill as pf
from rope_kernels.encoder_config import EncoderConfig
from rope_kernels.prefill import PrefillModel


@pytest.mark.parametrize("mode", ["tp4", "TP8", "", None, 8, "weights"])
def test_a_mode_that_is_not_one_of_the_three_is_refused_with_the_list(mode):
    with pytest.raises(ValueError, match="encoder_parallel must be one of 1gpu, tp8, dp8"):
        ep.check_mode(mode)
    with pytest.raises(ValueError, match="1gpu, tp8, dp8"):
        ep.layer_gemms(1152, 16, 4304, mode)
    with pytest.raises(ValueError, match="1gpu, tp8, dp8"):
        ep.COMM_MODEL.comm_ms(mode, vit_tokens=5476, images=1, hidden=1152, layers=27, merged_hidden=7168)


def test_a_bad_mode_is_refused_by_the_encoder_and_the_notebook_parameters():
    from rope_kernels.model.vit import MoonViTEncoder
    from rope_kernels.study.specs import SPECS

    with pytest.raises(ValueError, match="1gpu, tp8, dp8"):
        MoonViTEncoder(EncoderConfig.small(), encoder_parallel="tp2")
    rule = SPECS["04_ttft"].parameters["encoder_parallel"].rule
    assert rule(["1gpu", "tp8", "dp8"], "cuda") is None
    assert "1gpu, tp8, dp8" in rule(["1gpu", "ep8"], "cuda")
    assert "1gpu" in rule(["tp8"], "cuda")  # the whole encoder's rows are the other sections'
    check = next(c for c in SPECS["04_ttft"].checks if c.__name__ == "_ttft_settings_fit")
    assert "4 heads" in check({"encoder": "small", "encoder_parallel": ["1gpu", "tp8"], "resolutions": ["56x56"]},
                              "cpu")
    assert check({"encoder": "kimi_k25", "encoder_parallel": ["1gpu", "tp8"], "resolutions": ["56x56"]}, "cpu") is None


def test_the_shards_gemm_shapes_are_what_the_mode_implies():
    kimi = EncoderConfig.kimi_k25()
    whole = ep.layer_gemms(kimi.hidden, kimi.heads, kimi.mlp, "1gpu")
    assert whole == {"qkv": (1152, 3456), "proj": (1152, 1152), "fc1": (1152, 4304), "fc2": (4304, 1152),
                     "heads": (16, 72)}
    assert ep.layer_gemms(kimi.hidden, kimi.heads, kimi.mlp, "dp8") == whole  # full weights on every GPU
    # tp8: QKV and fc1 column parallel (N / 8), proj and fc2 row parallel (K / 8), 2 of 16 heads
    assert ep.layer_gemms(kimi.hidden, kimi.heads, kimi.mlp, "tp8") == {
        "qkv": (1152, 432), "proj": (144, 1152), "fc1": (1152, 538), "fc2": (538, 1152), "heads": (2, 72)}
    with pytest.raises(ValueError, match="divide by 8"):
        ep.layer_gemms(64, 4, 96, "tp8")
    # the images: dp8's slowest GPU takes ceil(n / 8), the other modes all of them
    assert [ep.gpu_images("dp8", n) for n in (1, 4, 8, 9, 16)] == [1, 1, 1, 2, 2]
    assert [ep.gpu_images(m, 16) for m in ("1gpu", "tp8")] == [16, 16]
    assert [ep.world_size(m) for m in ep.ENCODER_PARALLEL_MODES] == [1, 8, 8]


def _tiny(**kw):
    return EncoderConfig(hidden=128, heads=8, layers=1, mlp=64, text_hidden=48, pos_grid=8, **kw)


def test_the_tp8_encoder_is_one_gpus_shard_and_runs():
    from rope_kernels.model.vit import MoonViTEncoder, encoder_inputs

    cfg = _tiny()
    shard = MoonViTEncoder(cfg, dtype=torch.float32, encoder_parallel="tp8")
    whole = MoonViTEncoder(cfg, dtype=torch.float32)
    g = ep.layer_gemms(cfg.hidden, cfg.heads, cfg.mlp, "tp8")
    blk = shard.blocks[0]
    # nn.Linear's weight is (out, in): (N, K)
    for lin, name in ((blk.wqkv, "qkv"), (blk.wo, "proj"), (blk.fc0, "fc1"), (blk.fc1, "fc2")):
        assert tuple(lin.weight.shape) == g[name][::-1]
    assert shard.heads == 1 and whole.heads == 8
    assert sum(p.numel() for p in shard.blocks.parameters()) < sum(p.numel() for p in whole.blocks.parameters()) / 4
    inp = encoder_inputs([(1, 4, 4), (1, 2, 4)], cfg, dtype=torch.float32, seed=1)
    out = shard(inp.patches, inp.grids, rope="native", attention="sdpa_per_image")
    assert out.shape == (6, cfg.text_hidden) and torch.isfinite(out).all()
    # RoPE matters in the shard too: skipping it changes the output
    skipped = shard(inp.patches, inp.grids, rope="none", attention="sdpa_per_image")
    assert not torch.allclose(out, skipped)


def test_comm_ms_is_zero_for_1gpu_and_follows_the_stated_bandwidth():
    m = ep.COMM_MODEL
    kw = dict(vit_tokens=16 * 5476, images=16, hidden=1152, layers=27, merged_hidden=7168)
    assert m.comm_ms("1gpu", **kw) == 0.0
    # tp8: two all-reduces a layer of tokens x 1152 bf16, 2 (n-1)/n of the bytes over each link
    per = 2 * 7 / 8 * 16 * 5476 * 1152 * 2 / (m.bus_gbps * 1e9) * 1e3
    assert m.comm_ms("tp8", **kw) == pytest.approx(2 * 27 * per)
    # dp8: one all-gather of 8 x the slowest GPU's merged tokens (2 images x 1369) x 7168
    assert m.comm_ms("dp8", **kw) == pytest.approx(7 / 8 * 8 * 2 * 1369 * 7168 * 2 / (m.bus_gbps * 1e9) * 1e3)
    faster = ep.CommModel(bus_gbps=900.0)
    assert faster.comm_ms("tp8", **kw) == pytest.approx(m.comm_ms("tp8", **kw) / 2)
    assert "modelled" in m.describe() and "450 GB/s" in m.describe() and "datasheet" in m.describe()
    cols = ep.parallel_columns("1gpu", images=2, vit_tokens=64, gpu_vit_tokens=64, hidden=128, layers=1,
                               merged_hidden=48)
    assert cols["comm_ms"] == 0.0 and cols["world_size"] == 1 and cols["comm_model"] == "none (one GPU)"
    dp = ep.parallel_columns("dp8", images=9, vit_tokens=9 * 16, gpu_vit_tokens=32, hidden=128, layers=1,
                             merged_hidden=48)
    assert dp["gpu_images"] == 2 and dp["images"] == 9 and dp["comm_ms"] > 0 and dp["llm_tokens"] == 36


def test_the_vllm_facts_are_read_from_the_pinned_source():
    assert ep.VLLM_VERSION == "0.34.0"
    assert ep.VLLM_DEFAULT_ENCODER_PARALLEL == "tp8"  # "weights" is vLLM's default
    assert ep.VLLM_MAX_NUM_BATCHED_TOKENS == 8192
    for fact in ep.VLLM_FACTS.values():
        assert fact.file.startswith("vllm/") and fact.line > 0 and fact.where.endswith(f":{fact.line}")


def test_chunked_prefill_math_on_a_small_case():
    assert ep.prefill_chunks(20, 8) == [(0, 8), (8, 8), (16, 4)]  # 3 chunks, the last 4 tokens
    assert ep.prefill_chunks(16, 8) == [(0, 8), (8, 8)]
    assert ep.prefill_chunks(5, 8) == [(0, 5)] and ep.prefill_chunks(0, 8) == []
    with pytest.raises(ValueError, match="chunk"):
        ep.prefill_chunks(5, 0)
    assert pf.chunk_note(20, 8) == "chunked (3 chunks of 8, the last 4)"
    assert pf.chunk_note(16, 8) == "chunked (2 chunks of 8)"
    assert pf.chunk_note(5, 8) == "one chunk (at most 8 tokens)"
    assert pf.chunk_note(22104, 8192, 16384) == ("chunked (3 chunks of 8192, the last 5720); unchunked: "
                                                 "extrapolated past 16,384")
    assert "extrapolated" not in pf.chunk_note(16384, 8192, 16384)


class _Tables:
    """A prefill whose tables are a formula: a chunk of m tokens after p costs m + m (p + m) / 100."""

    backend, system, parallelism, batch = "vllm", "h100_sxm", "TP8 + EP8 (MoE TP1), batch 1", 1

    def chunked_prefill_ms(self, n, chunk):
        return sum(m + m * (p + m) / 100 for p, m in ep.prefill_chunks(n, chunk))

    def prefill_ms(self, n):
        return n + n * n / 100

    def tables_version(self):
        return "0.24.0"

    def coverage(self, n):
        return "measured tables"


def _rows(device="NVIDIA H100 80GB HBM3", parallel=("1gpu", "tp8", "dp8")):
    rows = []
    for par in parallel:
        for n in (1, 16):
            for variant, ms in (("native", 25.0), ("fused", 23.0)):
                gpu = ep.gpu_images(par, n)
                rows.append({"variant": variant, "resolution": "1024x1024", "images": n, "vit_tokens": 5476 * n,
                             "mode": "eager", "median_ms": ms * gpu / (8 if par == "tp8" else 1),
                             "device_name": device, "device_kind": "cuda", "timer": "cuda_events_eager",
                             **{k: v for k, v in ep.parallel_columns(
                                 par, images=n, vit_tokens=5476 * n, gpu_vit_tokens=5476 * gpu, hidden=1152,
                                 layers=27, merged_hidden=7168).items() if k not in ("images", "vit_tokens")}})
    return pd.DataFrame(rows)


def test_ttft_per_mode_adds_the_modelled_collectives_and_the_chunked_prefill(monkeypatch):
    monkeypatch.setattr(pf, "_moe_end", lambda aic: 16384)
    monkeypatch.setattr(pf, "aiconfigurator_version", lambda: "0.12.0")
    rows = pf.ttft_rows(_rows(), text_tokens=200, hand=PrefillModel(), aic=_Tables(), chunk_tokens=8192)
    assert set(rows.encoder_parallel) == {"1gpu", "tp8", "dp8"}
    r = rows.set_index(["encoder_parallel", "images", "variant"])
    for par in ("1gpu", "tp8", "dp8"):
        row = r.loc[(par, 16, "native")]
        assert row.ttft_ms == pytest.approx(row.encoder_ms + row.comm_ms + row.prefill_ms)
        assert row.ttft_unchunked_ms == pytest.approx(row.encoder_ms + row.comm_ms + row.prefill_unchunked_ms)
        n = 16 * 1369 + 200
        assert row.prefill_ms == pytest.approx(_Tables().chunked_prefill_ms(n, 8192))
        assert row.prefill_unchunked_ms == pytest.approx(n + n * n / 100)
        assert row.prefill_note == "chunked (3 chunks of 8192, the last 5720); unchunked: extrapolated past 16,384"
        assert row.prefill_system == "h100_sxm"
    assert r.loc[("1gpu", 16, "native")].comm_ms == 0.0 and r.loc[("tp8", 16, "native")].comm_ms > 0
    assert r.loc[("dp8", 16, "native")].encoder_ms == pytest.approx(2 * 25.0)  # the slowest GPU's 2 images
    assert r.loc[("1gpu", 1, "native")].prefill_note == "one chunk (at most 8192 tokens)"
    buys = pf.ttft_savings(rows).set_index(["encoder_parallel", "images", "variant"])
    assert buys.loc[("dp8", 16, "fused")].saving_ms == pytest.approx(2 * 2.0)
    assert buys.loc[("tp8", 16, "fused")].saving_ms == pytest.approx(16 * 2.0 / 8)
    with pytest.raises(ValueError, match="chunk_tokens"):
        pf.ttft_rows(_rows(), text_tokens=0, hand=PrefillModel(), why_hand="t", chunk_tokens=0)


def test_cpu_runs_produce_the_same_columns(monkeypatch):
    """A CPU's rows (the hand model: no tables for a CPU) carry the columns an H100's do."""
    monkeypatch.setattr(pf, "_moe_end", lambda aic: 16384)
    gpu = pf.ttft_rows(_rows(), text_tokens=200, hand=PrefillModel(), aic=_Tables())
    cpu = pf.device_ttft(_rows(device="cpu"), text_tokens=200, hand=PrefillModel())
    assert list(cpu.columns) == list(gpu.columns)
    assert set(cpu.prefill_source) == {"hand model"} and (cpu.prefill_ms == cpu.prefill_unchunked_ms).all()
    assert cpu[cpu.images == 16].prefill_note.str.contains(r"chunked \(3 chunks of 8192").all()
    # rows from before the modes (no encoder_parallel, no comm_ms) are the whole encoder on one GPU
    old = pf.device_ttft(_rows(device="cpu", parallel=("1gpu",)).drop(
        columns=["encoder_parallel", "comm_ms", "comm_model", "world_size", "gpu_images", "gpu_vit_tokens"]),
        text_tokens=200, hand=PrefillModel())
    assert list(old.columns) == list(cpu.columns) and set(old.encoder_parallel) == {"1gpu"}
    assert (old.comm_ms == 0).all()


def test_a_ttft_file_from_before_the_modes_reads_and_takes_new_rows(tmp_path):
    from rope_kernels.study.results import read_table, upsert_csv

    new = pf.device_ttft(_rows(device="cpu"), text_tokens=200, hand=PrefillModel())
    old = new[new.encoder_parallel == "1gpu"].drop(columns=[
        "encoder_parallel", "comm_ms", "comm_model", "prefill_unchunked_ms", "ttft_unchunked_ms",
        "prefill_chunk_tokens", "prefill_chunks"])
    path = tmp_path / "time_to_first_token.csv"
    old.to_csv(path, index=False)
    read = read_table(path)
    assert set(read.encoder_parallel) == {"1gpu"}  # the key column its rows imply
    merged = upsert_csv(path, new[new.encoder_parallel != "1gpu"])
    assert len(merged) == len(new)
    was_old = merged[merged.encoder_parallel == "1gpu"]
    assert (was_old.comm_ms == 0).all() and (was_old.prefill_unchunked_ms == was_old.prefill_ms).all()


def test_the_targets_and_the_first_finding_read_the_modes(tmp_path, monkeypatch):
    from rope_kernels.study import summaries as S
    from rope_kernels.study.targets import load_tables

    monkeypatch.setattr(pf, "_moe_end", lambda aic: 16384)
    monkeypatch.setattr(pf, "aiconfigurator_version", lambda: "0.12.0")
    rows = _rows()
    ttft = pf.ttft_rows(rows, text_tokens=200, hand=PrefillModel(), aic=_Tables())
    rows.to_csv(tmp_path / "encoder_latency.csv", index=False)
    ttft.to_csv(tmp_path / "time_to_first_token.csv", index=False)
    assert set(load_tables(tmp_path, None)["encoder"].encoder_parallel) == {"1gpu"}  # targets: whole encoder
    files = S.load(tmp_path)
    first = S.served_lines(files)[0]
    assert 'mm_encoder_tp_mode="weights"' in first and "vllm/config/multimodal.py:384" in first
    nat = ttft[(ttft.encoder_parallel == "tp8") & (ttft.images == 16) & (ttft.variant == "native")].ttft_ms.iloc[0]
    assert f"`tp8` at 16 images of 1024x1024: fused (ours) saves {16 * 2.0 / 8:.1f} ms of native's {nat:.0f} ms" in first
    assert first.index("`tp8`") < first.index("`dp8`")  # the default mode first
    without = S.served_lines({"time_to_first_token.csv": ttft[ttft.encoder_parallel == "1gpu"]})[0]
    assert "no `tp8` rows" in without


def test_encoder_rows_without_the_mode_are_written_as_the_whole_encoder(tmp_path):
    """A writer that predates the modes (no encoder_parallel) still upserts: its rows are 1gpu."""
    from rope_kernels.study.results import upsert_csv

    row = {"variant": "native", "resolution": "448x448", "images": 1, "mode": "eager", "device_name": "X",
           "median_ms": 2.0, "vit_tokens": 1024}
    merged = upsert_csv(tmp_path / "encoder_latency.csv", [row])
    assert merged.encoder_parallel.tolist() == ["1gpu"]
    shard = pd.DataFrame([{**row, "median_ms": 0.5, "encoder_parallel": "tp8"}])
    assert sorted(upsert_csv(tmp_path / "encoder_latency.csv", shard).encoder_parallel) == ["1gpu", "tp8"]
