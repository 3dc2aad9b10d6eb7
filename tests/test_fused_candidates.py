"""The fused kernel's launch candidates (persistent grid, in-kernel angles) against
float64 on the CPU tier (Triton interpreter, tiny shapes), each with a deliberately
wrong twin the same check must reject."""

import pytest
import torch

from rope_kernels import cos_sin_views, native_rope, rope_reference
from rope_kernels.correctness import make_inputs
from rope_kernels.kernels.freqs import vision_freqs_cis, vision_patch_coords, vision_rope_frequencies
from rope_kernels.kernels.fused import FusedConfig
from rope_kernels.kernels.fused_candidates import (fused_qk_rope_angles, fused_qk_rope_persistent,
                                                   persistent_grid)


def _err(outs, ref):
    return max((o.double() - r).abs().max().item() for o, r in zip(outs, ref))


def _within(outs, xq, xk, freqs_cis):
    """The rule every variant meets: at most 2x the native path's error (+ a floor)."""
    ref = rope_reference(xq, xk, freqs_cis)
    nat = native_rope(xq, xk, freqs_cis)
    scale = max(r.abs().max().item() for r in ref)
    return _err(outs, ref) <= 2 * _err(nat, ref) + 1e-6 * scale


def _packed(tokens, heads, head_dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, 3, heads, head_dim, generator=g).to(dtype)
    return qkv


GRIDS = [[(1, 3, 4), (1, 2, 5)], [(1, 5, 7)], [(2, 2, 3), (1, 1, 9)]]  # 22, 35, 21 tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads,head_dim", [(3, 72), (2, 8), (4, 80)])
@pytest.mark.parametrize("programs_per_sm", [1, 3, 64])  # fewer programs than tiles, and more
@pytest.mark.parametrize("inplace", [False, True])
def test_persistent_matches_float64(dtype, heads, head_dim, programs_per_sm, inplace):
    inp = make_inputs(37, heads, head_dim, dtype, "cpu", seed=1)
    q0, k0 = inp.xq.clone(), inp.xk.clone()
    v0 = inp.qkv[:, 2].clone()
    cos, sin = cos_sin_views(inp.freqs_cis)
    cfg = FusedConfig(block_t=2, block_h=1, num_warps=4)  # many tiles for a few programs
    outs = fused_qk_rope_persistent(inp.xq, inp.xk, cos, sin, inplace=inplace, config=cfg,
                                    programs_per_sm=programs_per_sm)
    assert _within(outs, q0, k0, inp.freqs_cis)
    assert torch.equal(inp.qkv[:, 2], v0)
    if inplace:
        assert outs[0].data_ptr() == inp.xq.data_ptr()
    else:
        assert torch.equal(inp.xq, q0) and torch.equal(inp.xk, k0)


def test_persistent_wrong_twin_is_rejected():
    """The inverse rotation (sin negated) through the same kernel fails the same check."""
    inp = make_inputs(37, 3, 72, torch.bfloat16, "cpu", seed=2)
    cos, sin = cos_sin_views(inp.freqs_cis)
    outs = fused_qk_rope_persistent(inp.xq, inp.xk, cos, -sin, programs_per_sm=1)
    assert not _within(outs, inp.xq, inp.xk, inp.freqs_cis)


def test_persistent_grid_is_capped_by_the_tiles():
    cfg = FusedConfig(block_t=4, block_h=2, num_warps=4)
    assert persistent_grid(5, 4, cfg, 64, "cpu") == (4,)  # 2 token blocks x 2 head blocks
    assert persistent_grid(4000, 4, cfg, 1, "cpu")[0] < 2000


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("grids", GRIDS, ids=lambda g: "+".join(f"{t}x{h}x{w}" for t, h, w in g))
@pytest.mark.parametrize("heads,head_dim", [(3, 72), (2, 8), (4, 80)])
@pytest.mark.parametrize("inplace", [False, True])
def test_angles_match_kimis_table_in_float64(dtype, grids, heads, head_dim, inplace):
    freqs_cis = vision_freqs_cis(grids, head_dim)
    coords = vision_patch_coords(grids)
    freqs = vision_rope_frequencies(head_dim)
    qkv = _packed(freqs_cis.shape[0], heads, head_dim, dtype)
    xq, xk, _ = qkv.unbind(1)
    q0, k0 = xq.clone(), xk.clone()
    outs = fused_qk_rope_angles(xq, xk, coords, freqs, inplace=inplace)
    assert _within(outs, q0, k0, freqs_cis)
    if not inplace:
        assert torch.equal(xq, q0) and torch.equal(xk, k0)


def test_angles_wrong_twin_is_rejected():
    """Rows and columns swapped (the classic 2D RoPE mix-up) fails the same check."""
    grids = [(1, 3, 4), (1, 2, 5)]
    freqs_cis = vision_freqs_cis(grids, 72)
    coords = vision_patch_coords(grids)
    xq, xk, _ = _packed(freqs_cis.shape[0], 3, 72, torch.bfloat16).unbind(1)
    outs = fused_qk_rope_angles(xq, xk, coords[:, [1, 0]].contiguous(), vision_rope_frequencies(72))
    assert not _within(outs, xq, xk, freqs_cis)


def test_candidates_refuse_bad_inputs_with_one_line():
    inp = make_inputs(6, 2, 72, torch.bfloat16, "cpu")
    cos, sin = cos_sin_views(inp.freqs_cis)
    coords = vision_patch_coords([(1, 2, 3)])
    freqs = vision_rope_frequencies(72)
    with pytest.raises(ValueError, match="programs_per_sm"):
        fused_qk_rope_persistent(inp.xq, inp.xk, cos, sin, programs_per_sm=0)
    with pytest.raises(TypeError, match="int32"):
        fused_qk_rope_angles(inp.xq, inp.xk, coords.long(), freqs)
    with pytest.raises(ValueError, match="shape"):
        fused_qk_rope_angles(inp.xq, inp.xk, coords[:5].contiguous(), freqs)
    with pytest.raises(ValueError, match="head_dim/4"):
        fused_qk_rope_angles(inp.xq, inp.xk, coords, freqs[:-1].contiguous())
    with pytest.raises(TypeError, match="FusedConfig"):
        fused_qk_rope_angles(inp.xq, inp.xk, coords, freqs, config=(1, 2, 4))
    xq = inp.xq.clone().requires_grad_()
    with pytest.raises(ValueError, match="autograd"):
        fused_qk_rope_angles(xq, inp.xk, coords, freqs)


# -- the sweep times them beside the default; old sweep files migrate ----------------
def test_sweep_times_the_candidates_beside_the_default(tmp_path):
    from pathlib import Path

    from rope_kernels.bench.microbench import Shape, sweep_fused_configs
    from rope_kernels.kernels.fused import fused_launch_config
    from rope_kernels.study.results import upsert_csv

    shape = Shape(6, 1, 8)  # tiny: every config runs in the interpreter
    default = fused_launch_config(1, 8, 2)
    df = sweep_fused_configs([shape], [default], torch.bfloat16, device="cpu", copy_gbps=1.0,
                             mode="eager", samples=1, progress=False)
    assert set(df.strategy) == {"grid", "persistent", "angles"}
    assert df.is_default.sum() == 1 and df[df.is_default].strategy.item() == "grid"
    assert (df[df.strategy == "persistent"].programs_per_sm > 0).all()
    assert (df[df.strategy != "persistent"].programs_per_sm == 0).all()
    # a sweep file from before the candidates (the committed H200 rows of the default grid
    # strategy, without the strategy columns) takes these rows: its rows become "grid"
    import pandas as pd

    committed = Path(__file__).resolve().parents[1] / "data/nvidia-h200/fused_configs.csv"
    target = tmp_path / "fused_configs.csv"
    rows = pd.read_csv(committed, keep_default_na=False)
    if "strategy" in rows:
        rows = rows[rows.strategy == "grid"].drop(columns=["strategy", "programs_per_sm"])
    rows.to_csv(target, index=False)
    before = len(rows)
    from rope_kernels.study.devices import provenance

    merged = upsert_csv(target, df.assign(**provenance("cpu")).assign(device_name="cpu-test"))
    old = merged[merged.device_name != "cpu-test"]
    assert len(old) == before and set(old.strategy) == {"grid"} and (old.programs_per_sm == 0).all()


def test_candidate_settings_are_checked():
    from rope_kernels.kernels.fused_candidates import FusedCandidate, fused_candidates

    cfg = FusedConfig(1, 16, 4)
    with pytest.raises(ValueError, match="strategy"):
        FusedCandidate("grid", cfg)
    with pytest.raises(ValueError, match="programs_per_sm"):
        FusedCandidate("angles", cfg, programs_per_sm=4)
    with pytest.raises(ValueError, match="programs_per_sm"):
        FusedCandidate("persistent", cfg)
    assert {c.strategy for c in fused_candidates(16, 72, 2)} == {"persistent", "angles"}
