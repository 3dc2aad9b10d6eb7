"""GPU tier: large shapes, int64 offsets, one compile for all token counts,
CUDA-graph capture, and launch counts measured by the profiler."""

import pytest
import torch

from rope_kernels import VARIANTS, cos_sin_views, fused_qk_rope, native_rope, rope_reference
from rope_kernels.correctness import check_variant, make_inputs
from rope_kernels.kernels.fused import _fused_qk_rope_rows_kernel
from rope_kernels.bench.microbench import Shape, make_arg_sets
from rope_kernels.vocabulary import KNOWN_VARIANTS

pytestmark = pytest.mark.gpu


def _err(outs, refs):
    return max((o.double() - r).abs().max().item() for o, r in zip(outs, refs))


@pytest.mark.parametrize("name", KNOWN_VARIANTS)
@pytest.mark.parametrize("shape", [(65536, 16, 72), (8192, 12, 128), (4099, 2, 72)],
                         ids=lambda s: "x".join(map(str, s)))
def test_large_shapes(name, shape, registered):
    res = check_variant(registered(name), tokens=shape[0], heads=shape[1], head_dim=shape[2],
                        dtype=torch.bfloat16, device="cuda")
    if not res.supported:
        pytest.skip(res.reason)  # e.g. FlashInfer at head_dim 72: refused, not run
    assert res.passed, res


def test_int64_offsets_and_huge_grid():
    """q/k offsets past 2^31 elements and a grid far past 65535 programs."""
    tokens, heads, head_dim = 1_100_000, 16, 128
    qkv = torch.randn(tokens, 3, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    assert qkv.numel() > 2**32
    xq, xk, _ = qkv.unbind(1)
    angles = torch.rand(tokens, head_dim // 2, device="cuda") * 6.28
    f = torch.polar(torch.ones_like(angles), angles)
    q, k = fused_qk_rope(xq, xk, *cos_sin_views(f))
    for sl in (slice(0, 512), slice(tokens // 2, tokens // 2 + 512), slice(tokens - 512, tokens)):
        ref = rope_reference(xq[sl], xk[sl], f[sl])
        nat = native_rope(xq[sl], xk[sl], f[sl])
        assert _err((q[sl], k[sl]), ref) <= 2 * _err(nat, ref) + 1e-6


def test_one_compile_serves_every_token_count():
    def n_compiled():
        caches = getattr(_fused_qk_rope_rows_kernel, "device_caches", None)
        if caches is None:
            pytest.skip("this Triton keeps no device_caches")
        return sum(len(c[0]) for c in caches.values())

    sets = make_arg_sets(Shape(3, 5, 72), torch.bfloat16, "cuda", 1)
    fused_qk_rope(sets[0][0], sets[0][1], *cos_sin_views(sets[0][2]))
    before = n_compiled()
    for tokens in (1, 2, 17, 256, 1000, 4097, 65536):
        xq, xk, f = make_arg_sets(Shape(tokens, 5, 72), torch.bfloat16, "cuda", 1)[0]
        fused_qk_rope(xq, xk, *cos_sin_views(f))
    assert n_compiled() == before


@pytest.mark.parametrize("inplace", [False, True])
def test_cuda_graph_capture(inplace):
    inp = make_inputs(4096, 16, 72, torch.bfloat16, "cuda")
    cos, sin = cos_sin_views(inp.freqs_cis)
    qkv0 = inp.qkv.clone()
    fused_qk_rope(inp.xq.clone(), inp.xk.clone(), cos, sin)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fused_qk_rope(inp.xq, inp.xk, cos, sin, inplace=inplace)
    for _ in range(2):  # new data in the same buffers, replayed
        fresh = torch.randn_like(qkv0, dtype=torch.float32).to(qkv0.dtype)
        inp.qkv.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        ref = rope_reference(fresh[:, 0], fresh[:, 1], inp.freqs_cis)
        nat = native_rope(fresh[:, 0], fresh[:, 1], inp.freqs_cis)
        assert _err(outs, ref) <= 2 * _err(nat, ref) + 1e-6
        assert torch.equal(inp.qkv[:, 2], fresh[:, 2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", KNOWN_VARIANTS)
def test_profiler_launch_counts(name, dtype, registered):
    from rope_kernels.bench.profiling import profile_call

    variant = registered(name)
    if why := variant.unsupported(dtype, head_dim=72):
        pytest.skip(why)

    xq, xk, f = make_arg_sets(Shape(1024, 16, 72), dtype, "cuda", 1)[0]
    kernels = profile_call(variant, (xq, xk, f))
    assert len(kernels) == variant.launch_count(dtype), kernels.kernel.tolist()


def test_compiled_does_not_fall_back_past_the_recompile_limit():
    from rope_kernels.bench.profiling import profile_call

    for tokens in range(100, 100 + 12):  # more shapes than dynamo's default limit of 8
        xq, xk, f = make_arg_sets(Shape(tokens, 4, 72), torch.bfloat16, "cuda", 1)[0]
        res = check_variant(VARIANTS["compiled"], tokens=tokens, heads=4, head_dim=72,
                            dtype=torch.bfloat16, device="cuda")
        assert res.passed, res
    kernels = profile_call(VARIANTS["compiled"], (xq, xk, f))
    assert len(kernels) == VARIANTS["compiled"].launches  # eager would launch several


# -- the CUDA-only peers (JIT through tvm-ffi, CuTe DSL): each wrapper against float64 --
CUDA_PEERS = ("sglang_kimi_k25", "flashinfer", "quack_qkv", "quack_rotary")


def _cuda_peer(name):
    from rope_kernels.variants import peer_status

    if name not in VARIANTS:
        why = {r["name"]: r["reason"] for r in peer_status()}.get(name, "not registered")
        pytest.skip(f"{name} absent here: {why}")
    return VARIANTS[name]


def _kimi_or_taken_head_dim(v) -> int:
    """Kimi's head_dim 72, or 128 for a peer that does not rotate 72 (FlashInfer)."""
    return 128 if v.unsupported(torch.bfloat16, head_dim=72) else 72


@pytest.mark.parametrize("name", CUDA_PEERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(21904, 16, 72), (5476, 2, 72), (4099, 12, 128), (7, 3, 72)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_peer_matches_float64(name, dtype, shape):
    res = check_variant(_cuda_peer(name), tokens=shape[0], heads=shape[1], head_dim=shape[2],
                        dtype=dtype, device="cuda")
    if not res.supported:
        pytest.skip(res.reason)  # FlashInfer at 72: refused (its kernel overruns the head)
    assert res.passed, res


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(4099, 12, 128), (7, 3, 128), (1023, 2, 80), (5476, 16, 80)],
                         ids=lambda s: "x".join(map(str, s)))
def test_flashinfer_matches_float64_in_place_where_it_rotates(dtype, shape):
    """Its fast path (128) and its RopeQuantize path at a whole number of vectors (80),
    in place on the packed qkv's q/k views: every head right (an overrun would wreck the
    next head's first elements) and v untouched (k's last head is followed by v's first)."""
    v = _cuda_peer("flashinfer")
    res = check_variant(v, tokens=shape[0], heads=shape[1], head_dim=shape[2], dtype=dtype,
                        device="cuda")
    assert res.supported and res.packed and res.inputs_intact and res.passed, res


def test_flashinfer_launches_one_kernel_where_it_rotates():
    from rope_kernels.bench.profiling import profile_call

    v = _cuda_peer("flashinfer")
    xq, xk, f = make_arg_sets(Shape(1024, 16, 128), torch.bfloat16, "cuda", 1)[0]
    kernels = profile_call(v, (xq, xk, f))
    assert len(kernels) == v.launch_count(torch.bfloat16), kernels.kernel.tolist()


@pytest.mark.parametrize("name", CUDA_PEERS)
def test_cuda_peer_packed_call_rotates_like_the_reference(name):
    v = _cuda_peer(name)
    inp = make_inputs(4096, 16, _kimi_or_taken_head_dim(v), torch.bfloat16, "cuda")
    ref = rope_reference(inp.xq, inp.xk, inp.freqs_cis)
    nat = native_rope(inp.xq, inp.xk, inp.freqs_cis)
    v_before = inp.qkv[:, 2].clone()
    q, k, v_out = v.packed(inp.qkv, inp.freqs_cis, *cos_sin_views(inp.freqs_cis))
    assert _err((q, k), ref) <= 2 * _err(nat, ref) + 1e-6
    assert torch.equal(v_out, v_before)


@pytest.mark.parametrize("name", CUDA_PEERS)
def test_cuda_peer_replays_in_a_cuda_graph(name):
    """Tables built once per freqs_cis before capture; replays see new q/k data."""
    v = _cuda_peer(name)
    inp = make_inputs(2048, 16, _kimi_or_taken_head_dim(v), torch.bfloat16, "cuda")
    qkv0 = inp.qkv.clone()
    warm_q, warm_k, _ = inp.qkv.clone().unbind(1)  # packed like the real call
    v(warm_q, warm_k, inp.freqs_cis)  # tables built and kernels compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = v(inp.xq, inp.xk, inp.freqs_cis)
    for _ in range(2):
        fresh = torch.randn_like(qkv0, dtype=torch.float32).to(qkv0.dtype)
        inp.qkv.copy_(fresh)
        ref = rope_reference(fresh[:, 0], fresh[:, 1], inp.freqs_cis)
        nat = native_rope(fresh[:, 0], fresh[:, 1], inp.freqs_cis)
        graph.replay()
        torch.cuda.synchronize()
        assert _err(outs, ref) <= 2 * _err(nat, ref) + 1e-6


# -- the fused kernel's launch candidates at the study's sizes --------------------------
@pytest.mark.parametrize("shape", [(87616, 16, 72), (8192, 12, 128), (4099, 2, 72)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_candidates_match_float64_at_size(shape, inplace):
    from rope_kernels.kernels.freqs import (vision_freqs_cis, vision_patch_coords,
                                            vision_rope_frequencies)
    from rope_kernels.bench.fused_candidates import (fused_qk_rope_angles,
                                                       fused_qk_rope_persistent, sweep_grid)

    tokens, heads, head_dim = shape
    grids = sweep_grid(tokens)
    freqs_cis = vision_freqs_cis(grids, head_dim, device="cuda")
    coords = vision_patch_coords(grids, device="cuda")
    freqs = vision_rope_frequencies(head_dim, device="cuda")
    qkv = torch.randn(tokens, 3, heads, head_dim, device="cuda").to(torch.bfloat16)
    xq, xk, _ = qkv.unbind(1)
    ref = rope_reference(xq, xk, freqs_cis)
    nat = native_rope(xq, xk, freqs_cis)
    for pps in (1, 4):
        q, k = fused_qk_rope_persistent(xq.clone(), xk.clone(), *cos_sin_views(freqs_cis),
                                        programs_per_sm=pps, inplace=inplace)
        assert _err((q, k), ref) <= 2 * _err(nat, ref) + 1e-6, ("persistent", pps)
    q, k = fused_qk_rope_angles(xq.clone(), xk.clone(), coords, freqs, inplace=inplace)
    assert _err((q, k), ref) <= 2 * _err(nat, ref) + 1e-6, "angles"
    # every rows / cache-hint / tiles candidate the sweep times, at the study's sizes
    from rope_kernels.bench.fused_candidates import fused_candidates

    for cand in fused_candidates(heads, head_dim, xq.element_size()):
        if cand.strategy in ("rows", "tiles"):
            q, k = cand(xq.clone(), xk.clone(), *cos_sin_views(freqs_cis))
            assert _err((q, k), ref) <= 2 * _err(nat, ref) + 1e-6, cand
