"""The fused kernel's planned launch path (``kernels.fused._LaunchPlan``): a layout checked
once launches later calls without re-deriving its checks, yet every check that depends on
the tensors' addresses still runs, and the result is the full path's, bit for bit."""

import pytest
import torch

from rope_kernels.bench.timing import host_time_us
from rope_kernels.correctness import make_inputs
from rope_kernels.kernels import fused
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.variants import VARIANTS


@pytest.fixture(autouse=True)
def no_plans():
    fused._PLANS.clear()
    yield
    fused._PLANS.clear()


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
def test_planned_calls_equal_the_checked_call(inplace, device):
    inp = make_inputs(5, 3, 72, torch.bfloat16, device, seed=3)
    cos, sin = cos_sin_views(inp.freqs_cis)
    qkv = inp.qkv.clone()
    first = [t.clone() for t in fused.fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin)]
    assert len(fused._PLANS) == 1  # the checked call left its plan
    for _ in range(2):  # planned: same layout, new memory each time
        qkv = inp.qkv.clone()
        q, k = fused.fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, inplace=inplace)
        assert torch.equal(q, first[0]) and torch.equal(k, first[1])
        if inplace:
            assert q.data_ptr() == qkv[:, 0].data_ptr()
            assert torch.equal(qkv[:, 2], inp.qkv[:, 2])  # v untouched
    assert len(fused._PLANS) == (2 if inplace else 1)


def test_a_planned_layout_still_refuses_q_and_k_that_are_one_tensor(device):
    inp = make_inputs(4, 2, 8, torch.bfloat16, device, seed=1)
    cos, sin = cos_sin_views(inp.freqs_cis)
    fused.fused_qk_rope(inp.xq, inp.xk, cos, sin, inplace=True)  # the plan of this layout
    with pytest.raises(ValueError, match="same memory"):
        fused.fused_qk_rope(inp.xq, inp.xq, cos, sin, inplace=True)


def test_a_planned_layout_still_refuses_cos_sin_inside_q(device):
    """The same shapes, strides and alignments as a checked call, but cos/sin live in the
    bytes q is written to: the planned path's range test sends it to the full check."""
    tokens, heads, head_dim = 4, 2, 8
    inp = make_inputs(tokens, heads, head_dim, torch.bfloat16, device, seed=2)
    cos, sin = cos_sin_views(inp.freqs_cis)
    fused.fused_qk_rope(inp.xq, inp.xk, cos, sin, inplace=True)
    buf = torch.zeros(tokens * 3 * heads * head_dim // 2, dtype=torch.float32, device=device)
    qkv = buf.view(torch.bfloat16).view(tokens, 3, heads, head_dim)
    freqs = buf[: tokens * head_dim].view(torch.complex64).view(tokens, head_dim // 2)
    cos2, sin2 = cos_sin_views(freqs)
    assert fused._plan_key(qkv[:, 0], qkv[:, 1], cos2, sin2, True) in fused._PLANS
    with pytest.raises(ValueError, match="shares memory"):
        fused.fused_qk_rope(qkv[:, 0], qkv[:, 1], cos2, sin2, inplace=True)


def test_the_variants_take_the_planned_path_and_stay_exact(device):
    """VARIANTS["fused"/"fused_inplace"]: the same results on the second call (planned)
    as on the first (checked); a wrong freqs_cis is still refused naming it."""
    inp = make_inputs(6, 2, 72, torch.float32, device, seed=4)
    for name in ("fused", "fused_inplace"):
        outs = []
        for _ in range(2):
            qkv = inp.qkv.clone()
            outs.append([t.clone() for t in VARIANTS[name](qkv[:, 0], qkv[:, 1], inp.freqs_cis)])
        assert all(torch.equal(a, b) for a, b in zip(*outs)), name
    with pytest.raises(ValueError, match="freqs_cis"):
        VARIANTS["fused"](inp.xq, inp.xk, inp.freqs_cis[:-1])


def test_host_time_is_measured_per_call():
    calls = []
    t = host_time_us(lambda x: calls.append(x), [(1,), (2,)], calls=10, repeats=3, warmup=2)
    assert len(calls) == 2 + 30 and calls[:4] == [1, 2, 1, 2]
    assert t.timer == "host_perf_counter" and t.calls_per_sample == 10 and t.samples == 3
    assert 0 < t.p20_us <= t.median_us <= t.p80_us
    with pytest.raises(ValueError, match="calls"):
        host_time_us(lambda: None, [()], calls=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the direct launch is the GPU's path")
def test_direct_launches_match_float64_on_the_gpu():
    """On a GPU the first call is checked, the second launches through Triton's run and
    keeps the compiled kernel, later ones launch it directly: every one matches float64."""
    from rope_kernels.correctness import max_abs_error
    from rope_kernels.kernels.reference import native_rope, rope_reference

    inp = make_inputs(4099, 16, 72, torch.bfloat16, "cuda", seed=7)
    ref = rope_reference(inp.xq, inp.xk, inp.freqs_cis)
    tol = 2 * max_abs_error(native_rope(inp.xq, inp.xk, inp.freqs_cis), ref)
    for name in ("fused", "fused_inplace"):
        for call in range(4):
            qkv = inp.qkv.clone()
            out = VARIANTS[name](qkv[:, 0], qkv[:, 1], inp.freqs_cis)
            torch.cuda.synchronize()
            assert max_abs_error(out, ref) <= tol, (name, call)
        plans = [p for p in fused._PLANS.values() if p.grid is not None]
        assert plans and all(p.compiled is not None for p in plans)


def test_the_planned_path_keeps_no_tensor_alive(device):
    """Plans hold layouts, never tensors: a freqs_cis (and its q/k) dropped by the caller
    is freed although its layout's plan stays."""
    import gc
    import weakref

    inp = make_inputs(5, 2, 8, torch.bfloat16, device, seed=6)
    for _ in range(2):
        VARIANTS["fused"](inp.xq, inp.xk, inp.freqs_cis)
    refs = [weakref.ref(t) for t in (inp.freqs_cis, inp.qkv)]
    del inp
    gc.collect()
    assert fused._PLANS and all(r() is None for r in refs)
