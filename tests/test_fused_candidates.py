"""The fused kernel's launch settings and candidates (the default's whole-token rows
under other settings, the tiles kernel, persistent grid, in-kernel angles, cache hints)
against float64 on the CPU tier (Triton interpreter, tiny shapes), each with a
deliberately wrong twin the same check must reject."""

from pathlib import Path

import pytest
import torch

from rope_kernels import cos_sin_views, native_rope, rope_reference
from rope_kernels.correctness import lowp_tolerance, make_inputs
from rope_kernels.kernels.freqs import vision_freqs_cis, vision_patch_coords, vision_rope_frequencies
from rope_kernels.kernels.fused import RowsConfig, fused_qk_rope, rows_launch_config
from rope_kernels.bench.fused_candidates import (TilesConfig, fused_qk_rope_angles,
                                                   fused_qk_rope_persistent, fused_qk_rope_tiles,
                                                   persistent_grid)


def _err(outs, ref):
    return max((o.double() - r).abs().max().item() for o, r in zip(outs, ref))


def _within(outs, xq, xk, freqs_cis):
    """The rule every variant meets: at most 2x the native path's error (+ a floor)."""
    ref = rope_reference(xq, xk, freqs_cis)
    nat = native_rope(xq, xk, freqs_cis)
    scale = max(r.abs().max().item() for r in ref)
    return _err(outs, ref) <= lowp_tolerance(_err(nat, ref), scale, outs[0].dtype)


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
    cfg = TilesConfig(block_t=2, block_h=1, num_warps=4)  # many tiles for a few programs
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
    cfg = TilesConfig(block_t=4, block_h=2, num_warps=4)
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
    with pytest.raises(TypeError, match="TilesConfig"):
        fused_qk_rope_angles(inp.xq, inp.xk, coords, freqs, config=(1, 2, 4))
    with pytest.raises(TypeError, match="TilesConfig"):
        fused_qk_rope_tiles(inp.xq, inp.xk, cos, sin, config=RowsConfig(1, 4))
    xq = inp.xq.clone().requires_grad_()
    with pytest.raises(ValueError, match="autograd"):
        fused_qk_rope_angles(xq, inp.xk, coords, freqs)
    with pytest.raises(ValueError, match="autograd"):
        fused_qk_rope_tiles(xq, inp.xk, cos, sin)


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
    assert set(df.strategy) == {"tiles", "persistent", "angles", "rows", "rows_padded"}
    # what fused_qk_rope launches by default, out of place and in place (fused_inplace)
    assert df.is_default.sum() == 2 and set(df[df.is_default].strategy) == {"rows"}
    assert (df[df.is_default].block_t == default.block_t).all()
    assert set(df[df.is_default].in_place) == {False, True}
    assert (df[df.strategy == "persistent"].programs_per_sm > 0).all()
    assert (df[df.strategy != "persistent"].programs_per_sm == 0).all()
    # in place and out of place for the default (rows) and the tiles kernel; hints on both
    for strategy in ("tiles", "rows", "rows_padded"):
        assert set(df[df.strategy == strategy].in_place) == {False, True}, strategy
    hinted = df[df.load_eviction_policy != "none"]
    assert set(hinted.strategy) == {"tiles", "rows"} and set(hinted.in_place) == {False, True}
    assert set(df.store_cache_modifier) == {"none", ".cs"}
    assert (df[df.strategy.str.startswith("rows")].block_h == shape.heads).all()
    # one row per key: the candidates differ in what the file's key names
    from rope_kernels.study.specs import RESULT_FILES

    key = [c for c in RESULT_FILES["fused_configs.csv"].key if c != "device_name"]
    assert not df.duplicated(key).any(), df[df.duplicated(key, keep=False)][key]
    # a sweep file from before the candidates (the committed H200 rows of the then default,
    # the tiles kernel, without the strategy columns) takes these rows: its rows become
    # "tiles"
    import pandas as pd

    from test_kernels import SWEEP as committed  # the committed H200 sweep, wherever it lives
    target = tmp_path / "fused_configs.csv"
    rows = pd.read_csv(committed, keep_default_na=False)
    if "strategy" in rows:
        rows = rows[rows.strategy.isin(["grid", "tiles"])].drop(columns=["strategy", "programs_per_sm"])
    for column, plain in (("in_place", False), ("load_eviction_policy", "none"),
                          ("store_cache_modifier", "none")):
        if column in rows:  # a file from after the hint columns: keep its plain grid rows
            rows = rows[rows[column].astype(str) == str(plain)].drop(columns=[column])
    rows.to_csv(target, index=False)
    before = len(rows)
    from rope_kernels.study.devices import provenance

    merged = upsert_csv(target, df.assign(**provenance("cpu")).assign(device_name="cpu-test"))
    old = merged[merged.device_name != "cpu-test"]
    assert len(old) == before and set(old.strategy) == {"tiles"} and (old.programs_per_sm == 0).all()
    assert set(old.in_place) == {False} and set(old.load_eviction_policy) == {"none"}
    assert set(old.store_cache_modifier) == {"none"}
    # the committed file as it is, where the tiles kernel is still called "grid": those
    # rows are read as "tiles", so a new sweep's tiles rows replace them (same key)
    whole = pd.read_csv(committed, keep_default_na=False)
    target.write_text(committed.read_text())
    merged = upsert_csv(target, df.assign(**provenance("cpu")).assign(device_name="cpu-test"))
    old = merged[merged.device_name != "cpu-test"]
    assert len(old) == len(whole) and "grid" not in set(merged.strategy)
    assert (old.strategy == "tiles").sum() == whole.strategy.isin(["grid", "tiles"]).sum()


def test_candidate_settings_are_checked():
    from rope_kernels.bench.fused_candidates import FusedCandidate, fused_candidates

    cfg = TilesConfig(1, 16, 4)
    with pytest.raises(ValueError, match="strategy"):
        FusedCandidate("grid", cfg)  # the tiles kernel's name while it was the default
    with pytest.raises(ValueError, match="programs_per_sm"):
        FusedCandidate("angles", cfg, programs_per_sm=4)
    with pytest.raises(ValueError, match="programs_per_sm"):
        FusedCandidate("persistent", cfg)
    with pytest.raises(TypeError, match="RowsConfig"):
        FusedCandidate("rows", cfg)
    with pytest.raises(TypeError, match="TilesConfig"):
        FusedCandidate("tiles", RowsConfig(1, 4))
    with pytest.raises(TypeError, match="in_place"):
        FusedCandidate("tiles", cfg, in_place=1)
    cands = fused_candidates(16, 72, 2)
    assert {c.strategy for c in cands} == {"tiles", "persistent", "angles", "rows"}
    assert len(set(cands)) == len(cands)  # no candidate timed twice
    # the small grid that keeps the sweep within ~1.5x of its time before the rows
    assert all(len(fused_candidates(h, d, 2)) <= 20 for h, d in ((16, 72), (2, 72), (12, 128)))


# -- whole-token rows and cache hints --------------------------------------------------
ROWS_SHAPES = [(37, 3, 72), (5, 2, 80), (9, 1, 128), (13, 4, 64)]  # odd token counts
ROWS_CONFIGS = {  # name -> (heads, head_dim) -> RowsConfig
    "default": lambda h, d: None,  # fused_launch_config: 4 KB tiles
    "1k": lambda h, d: rows_launch_config(h, d, 2, 1024),
    "8k": lambda h, d: rows_launch_config(h, d, 2, 8192),  # many tokens a program, masked tail
    "padded": lambda h, d: rows_launch_config(h, d, 2, padded=True),
    "hints": lambda h, d: rows_launch_config(h, d, 2, eviction_policy="evict_first",
                                             store_cache_modifier=".cs"),
    "one_warp": lambda h, d: RowsConfig(block_t=4, num_warps=1),
}


@pytest.mark.parametrize("shape", ROWS_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", list(ROWS_CONFIGS))
@pytest.mark.parametrize("inplace", [False, True])
def test_rows_match_float64(shape, config, inplace):
    tokens, heads, head_dim = shape
    inp = make_inputs(tokens, heads, head_dim, torch.bfloat16, "cpu", seed=3)
    q0, k0, v0 = inp.xq.clone(), inp.xk.clone(), inp.qkv[:, 2].clone()
    cos, sin = cos_sin_views(inp.freqs_cis)  # interleaved: one contiguous cos|sin fetch
    outs = fused_qk_rope(inp.xq, inp.xk, cos, sin, inplace=inplace,
                         config=ROWS_CONFIGS[config](heads, head_dim))
    assert _within(outs, q0, k0, inp.freqs_cis)
    assert torch.equal(inp.qkv[:, 2], v0)
    if inplace:
        assert outs[0].data_ptr() == inp.xq.data_ptr() and outs[1].data_ptr() == inp.xk.data_ptr()
    else:
        assert torch.equal(inp.xq, q0) and torch.equal(inp.xk, k0)


@pytest.mark.parametrize("padded", [False, True])
def test_rows_general_strides_and_separate_cos_sin(padded):
    """Heads not next to each other (head stride != head_dim) take the div/mod addressing;
    cos and sin as two tensors (not freqs_cis's views) take the per-pair gather; fp32."""
    tokens, heads, head_dim = 7, 3, 72
    base = torch.randn(heads, tokens, 2, head_dim, generator=torch.Generator().manual_seed(4))
    xq, xk = base[:, :, 0].transpose(0, 1), base[:, :, 1].transpose(0, 1)
    assert xq.stride(1) != head_dim
    f = make_inputs(tokens, heads, head_dim, device="cpu").freqs_cis
    cos, sin = f.real.contiguous(), f.imag.contiguous()
    outs = fused_qk_rope(xq, xk, cos, sin, config=rows_launch_config(heads, head_dim, 4,
                                                                     padded=padded))
    assert _within(outs, xq, xk, f)


def test_rows_wrong_twins_are_rejected():
    """The same check rejects the inverse rotation, and the angles a gather by the row's
    pair index without "mod head_dim/2" would read (each head a pair further on)."""
    inp = make_inputs(37, 3, 72, torch.bfloat16, "cpu", seed=5)
    cos, sin = cos_sin_views(inp.freqs_cis)
    assert not _within(fused_qk_rope(inp.xq, inp.xk, cos, -sin), inp.xq, inp.xk,
                       inp.freqs_cis)
    shifted = torch.roll(inp.freqs_cis, 1, dims=1)
    outs = fused_qk_rope(inp.xq, inp.xk, *cos_sin_views(shifted))
    assert not _within(outs, inp.xq, inp.xk, inp.freqs_cis)


@pytest.mark.parametrize("hints", [("evict_first", ""), ("", ".cs"), ("evict_last", ".cg")])
@pytest.mark.parametrize("inplace", [False, True])
def test_the_tiles_kernel_with_cache_hints_matches_float64(hints, inplace):
    inp = make_inputs(37, 3, 72, torch.bfloat16, "cpu", seed=6)
    q0, k0 = inp.xq.clone(), inp.xk.clone()
    cos, sin = cos_sin_views(inp.freqs_cis)
    outs = fused_qk_rope_tiles(inp.xq, inp.xk, cos, sin, inplace=inplace,
                               config=TilesConfig(2, 1, 4, *hints))
    assert _within(outs, q0, k0, inp.freqs_cis)
    if not inplace:  # the wrong twin: the inverse rotation through the same kernel
        assert not _within(fused_qk_rope_tiles(q0, k0, cos, -sin, config=TilesConfig(2, 1, 4)),
                           q0, k0, inp.freqs_cis)


def test_the_default_launches_the_rows_kernel_with_out_and_autograd():
    """fused_qk_rope launches the rows kernel (one launch, nothing else), with out= and
    autograd (the backward: the inverse rotation, the same kernel)."""
    from rope_kernels.bench.launches import count_launches
    from rope_kernels.variants import fused_rope, fused_rope_inplace

    inp = make_inputs(11, 3, 72, torch.float32, "cpu", seed=7)
    for fn in (fused_rope, fused_rope_inplace):
        total, per_kernel = count_launches(fn, inp.xq.clone(), inp.xk.clone(), inp.freqs_cis)
        assert total == 1 and list(per_kernel) == ["triton:_fused_qk_rope_rows_kernel"], fn
    cos, sin = cos_sin_views(inp.freqs_cis)
    ref = rope_reference(inp.xq, inp.xk, inp.freqs_cis)
    out = (torch.empty_like(inp.xq), torch.empty_like(inp.xk))
    fused_qk_rope(inp.xq, inp.xk, cos, sin, out=out)
    assert _err(out, ref) <= 1e-5
    xq, xk = inp.xq.clone().requires_grad_(), inp.xk.clone().requires_grad_()
    q, k = fused_qk_rope(xq, xk, cos, sin)
    assert _err((q, k), ref) <= 1e-5
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    torch.autograd.backward((q, k), (gq, gk))
    # the gradient of a rotation is the inverse rotation of the incoming gradient
    back = rope_reference(gq, gk, inp.freqs_cis.conj())
    assert _err((xq.grad, xk.grad), back) <= 1e-5


def test_rows_refuse_bad_inputs_with_one_line():
    inp = make_inputs(6, 2, 72, torch.bfloat16, "cpu")
    cos, sin = cos_sin_views(inp.freqs_cis)
    cases = [
        (TypeError, "RowsConfig",
         lambda: fused_qk_rope(inp.xq, inp.xk, cos, sin, config=TilesConfig(1, 2, 4))),
        (ValueError, "block_t", lambda: RowsConfig(block_t=3, num_warps=4)),
        (ValueError, "num_warps", lambda: RowsConfig(block_t=1, num_warps=0)),
        (TypeError, "padded", lambda: RowsConfig(1, 4, padded=1)),
        (ValueError, "eviction_policy", lambda: RowsConfig(1, 4, eviction_policy="evict_most")),
        (ValueError, "store_cache_modifier", lambda: TilesConfig(1, 2, 4, store_cache_modifier="cs")),
        (ValueError, "tile_bytes", lambda: rows_launch_config(2, 72, 2, 0)),
        (TypeError, "float32", lambda: fused_qk_rope(inp.xq, inp.xk, cos.double(), sin)),
        (TypeError, "inplace", lambda: fused_qk_rope(inp.xq, inp.xk, cos, sin, inplace="yes")),
        (ValueError, "autograd", lambda: fused_qk_rope(inp.xq.clone().requires_grad_(),
                                                       inp.xk, cos, sin, inplace=True)),
    ]
    for exc, words, call in cases:
        with pytest.raises(exc, match=words) as err:
            call()
        assert "\n" not in str(err.value), words


def test_rows_launch_config_fills_the_tile_with_whole_tokens():
    assert rows_launch_config(16, 72, 2, 1024).block_t == 1  # a 2304-byte row: one token
    assert rows_launch_config(16, 72, 2, 8192).block_t == 2
    assert rows_launch_config(2, 72, 2, 2048).block_t == 4  # 288-byte rows
    assert rows_launch_config(2, 72, 2, 8192).block_t == 16
    for heads, tile in ((16, 2048), (2, 1024), (2, 8192), (12, 4096)):
        c = rows_launch_config(heads, 72, 2, tile)
        assert 1 <= c.num_warps <= 8
        assert c.block_t * heads * 72 * 2 <= tile or c.block_t == 1


def test_fused_explore_runs_on_the_cpu(tmp_path, monkeypatch):
    """The lead's GPU script, as a CPU smoke test (interpreter, tiny shape): every
    candidate passes its float64 check, is timed beside the peers, and lands in the CSV."""
    import runpy

    import pandas as pd

    monkeypatch.setenv("OUT", str(tmp_path))
    tool = Path(__file__).resolve().parents[1] / "tools" / "fused_explore.py"
    module = runpy.run_path(str(tool), run_name="fused_explore")
    assert module["main"](["--quick"]) == 0
    df = pd.read_csv(tmp_path / "fused_explore.csv")
    quick = {n for n, (q, _) in module["CANDIDATES"].items() if q}
    assert quick | {"fused", "fused_inplace"} <= set(df.variant)
    assert set(df.in_place) == {False, True}
    like = df[df.like_for_like_peer.notna() & (df.like_for_like_peer != "")]
    assert set(like.like_for_like_peer) <= {"sglang_vision", "vllm_packed_qk"}
    assert (like.like_for_like_peer == like.in_place.map(
        {True: "vllm_packed_qk", False: "sglang_vision"})).all()


# -- compiled for Hopper (sm_90) with Triton's real compiler, no GPU needed ----------------
SM90_SCRIPT = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature
from rope_kernels.bench.compile_matrix import (KernelEntry, TARGETS, _packed_qk,
                                               compile_for_target, recorded_launch)
from rope_kernels.bench.fused_candidates import fused_candidates
from rope_kernels.kernels.reference import cos_sin_views

sm90 = next(t for t in TARGETS if t.label == "sm_90")
gpu = GPUTarget("cuda", 90, 32)
rows = []
for heads, head_dim in ((16, 72), (2, 72), (4, 80), (3, 128)):
    for cand in fused_candidates(heads, head_dim, 2):
        # in place launches the same kernel with the outputs = the inputs (and meta
        # tensors, which share address 0, fail the in-place overlap check): compiled once
        if cand.strategy not in ("rows", "tiles") or cand.in_place:
            continue
        def launch(t, h, d, dtype, _c=cand):
            q, k, f = _packed_qk(t, h, d, dtype)
            _c(q, k, *cos_sin_views(f))
        where = (("rope_kernels.kernels.fused", "_fused_qk_rope_rows_kernel")
                 if cand.strategy == "rows"
                 else ("rope_kernels.bench.fused_candidates", "_fused_qk_rope_tiles_kernel"))
        kernel, args, kwargs = recorded_launch(KernelEntry("c", *where, launch), 4099, heads,
                                               head_dim, "bfloat16")
        row = compile_for_target(kernel, args, kwargs, sm90)
        backend = make_backend(gpu)
        bound, spec, options = create_function_from_signature(
            kernel.signature, kernel.params, backend)(*args, **kwargs)
        options, sig, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, options)
        ptx = triton.compile(ASTSource(kernel, sig, constexprs, attrs), target=gpu,
                             options=options.__dict__).asm["ptx"]
        rows.append({"heads": heads, "head_dim": head_dim, "strategy": cand.label,
                     "in_place": cand.in_place, "eviction": cand.config.eviction_policy,
                     "store": cand.config.store_cache_modifier, "registers": row["registers"],
                     "spills": row["spills"], "shared": row["shared_bytes"],
                     "evict_first_loads": len(re.findall(r"ld\.global\.L1::evict_first", ptx)),
                     "cs_stores": len(re.findall(r"st\.global\.cs", ptx)),
                     "v4_loads": len(re.findall(r"ld\.global[.\w:]*\.v4", ptx))})
print(json.dumps(rows))
"""


def _ptxas_available() -> bool:
    import os
    import shutil

    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return bool(os.environ.get("TRITON_PTXAS_PATH")) or bundled.exists() or bool(
        shutil.which("ptxas"))


def test_rows_and_hints_compile_for_sm90(tmp_path):
    """Every rows and tiles candidate the sweep times (rows tiles, padded, hints; in place
    is the same kernel) compiles for sm_90 without spills; the hints reach the PTX; rows
    of a packed qkv move q/k in 16-byte vectors."""
    import json
    import os
    import subprocess
    import sys

    if not _ptxas_available():
        pytest.skip("ptxas not found (Triton's bundled one or TRITON_PTXAS_PATH)")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", SM90_SCRIPT], env=env, cwd=root, text=True,
                          capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {r["strategy"] for r in rows} == {"tiles", "rows", "rows_padded"}
    assert not [r for r in rows if r["spills"] or not r["registers"]]
    for r in rows:
        assert (r["evict_first_loads"] > 0) == (r["eviction"] == "evict_first"), r
        assert (r["cs_stores"] > 0) == (r["store"] == ".cs"), r
        if r["strategy"].startswith("rows"):
            assert r["v4_loads"] >= 2, r  # q and k of the first chunk at least


def test_sweep_grid_holds_the_tokens_inside_kimis_table():
    """A prime token count (4099) used to become one 4099 x 1 image, past the 512 x 512
    table (the GPU tier's candidate test failed in vision_freqs_cis)."""
    from rope_kernels.bench.fused_candidates import sweep_grid

    for tokens in (4099, 5476 * 2, 1024, 262147, 300000):
        grids = sweep_grid(tokens)
        assert sum(t * h * w for t, h, w in grids) == tokens
        assert all(h <= 512 and w <= 512 for _, h, w in grids), grids
