"""Correctness rows for every variant the encoder benchmark times (issue 44:
``gemm_epilogue_cute_norot`` had encoder rows and no correctness rows): the sweep's
names cover every encoder RoPE mode and every variant any profile's 04_ttft times, and
the encoder-only modes' rows are real float64 checks where they run, a reason where not."""

from pathlib import Path

import torch
import yaml

from rope_kernels.bench.correctness_sweep import correctness_rows, encoder_mode_rows, sweep_names
from rope_kernels.variants import encoder_only_absent, peer_status
from rope_kernels.vocabulary import ENCODER_ONLY_ROPE, KNOWN_VARIANTS

ROOT = Path(__file__).resolve().parents[1]


def test_the_sweep_covers_every_encoder_variant():
    covered = set(sweep_names([], peer_status()))
    assert set(ENCODER_ONLY_ROPE) <= covered and set(KNOWN_VARIANTS) <= covered
    assert {"gemm_epilogue_cute_norot", "gemm_epilogue_cute", "gemm_epilogue", "none"} <= covered
    for profile in sorted((ROOT / "params").glob("*.yaml")):
        params = yaml.safe_load(profile.read_text()) or {}
        timed = set(params.get("04_ttft", {}).get("variants", []))
        named = params.get("01_kernels", {}).get("variants", [])
        assert timed <= set(sweep_names(named, peer_status())), (profile.name, timed - covered)


def test_encoder_modes_rows_on_the_cpu():
    """gemm_epilogue (Triton, interpreted) checked against float64 in bf16 and fp16 with the
    inputs intact; fp32 and the modes that cannot run here say why; none says it has no
    RoPE; a broken kernel fails its row."""
    shapes = [[7, 2, 72], [5, 1, 8]]
    rows = correctness_rows(list(ENCODER_ONLY_ROPE), ["bfloat16", "float16", "float32"], shapes,
                            device="cpu")
    assert all("encoder runs at Kimi's 72" in r["reason"] and not r["supported"]
               for r in rows if r["head_dim"] == 8 and r["variant"] != "none"
               and r["variant"] not in encoder_only_absent())
    by = {(r["variant"], r["dtype"]): r for r in rows if r["head_dim"] == 72}
    assert {v for v, _ in by} == set(ENCODER_ONLY_ROPE)
    for dt in ("bfloat16", "float16"):
        r = by[("gemm_epilogue", dt)]
        assert r["supported"] and r["passed"] and r["inputs_intact"], r
        assert 0 < r["max_abs_err"] <= r["tolerance"]
    assert not by[("gemm_epilogue", "float32")]["supported"]
    assert "no RoPE" in by[("none", "bfloat16")]["reason"]
    for mode, why in encoder_only_absent().items():
        assert not by[(mode, "bfloat16")]["supported"] and why in by[(mode, "bfloat16")]["reason"]


def test_a_wrong_epilogue_fails_its_row(monkeypatch):
    """The check can fail: gemm_epilogue's kernel with its rotation left out fails its row."""
    import rope_kernels.qkv as qkv

    real = qkv.qkv_rope
    monkeypatch.setattr(qkv, "qkv_rope", lambda *a, **kw: real(*a, **{**kw, "epilogue": "none"}))
    [row] = encoder_mode_rows("gemm_epilogue", [torch.bfloat16], [[7, 2, 72]], device="cpu")
    assert row["supported"] and not row["passed"] and row["max_abs_err"] > row["tolerance"]
