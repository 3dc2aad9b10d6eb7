"""The fused kernel's planned launch path (``kernels.launch_plan``): a layout checked
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
    assert fused._PLANS.key(qkv[:, 0], qkv[:, 1], cos2, sin2, True, extra=("pairs",)) in fused._PLANS
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
        plans = [p for p in fused._PLANS.values() if p.launch is not None]
        assert plans and all(p.launch.compiled is not None for p in plans)


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


# -- the plan cache (kernels/launch_plan.py) ---------------------------------------------------

def _within_tolerance(out, inp):
    """``out`` against float64, at most the bf16/fp16 rule (2x native's own error) or the
    fp32 relative bound."""
    from rope_kernels.correctness import FP32_REL_TOL, lowp_tolerance, max_abs_error
    from rope_kernels.kernels.reference import native_rope, rope_reference

    ref = rope_reference(inp.xq, inp.xk, inp.freqs_cis)
    scale = max(r.abs().max().item() for r in ref)
    if inp.xq.dtype == torch.float32:
        tol = FP32_REL_TOL * scale
    else:
        tol = lowp_tolerance(max_abs_error(native_rope(inp.xq, inp.xk, inp.freqs_cis), ref),
                             scale, inp.xq.dtype)
    return max_abs_error(out, ref) <= tol


def _packed(inp):
    qkv = inp.qkv.clone()
    return qkv[:, 0], qkv[:, 1]


def _layouts(device):
    """(name, inputs, make q and k anew): one base layout and one change each of shape, dtype
    and strides (separate contiguous q and k instead of packed-qkv views), fresh draws."""
    base = make_inputs(5, 2, 8, torch.bfloat16, device)
    longer = make_inputs(6, 2, 8, torch.bfloat16, device)
    fp32 = make_inputs(5, 2, 8, torch.float32, device)
    return [("base", base, lambda: _packed(base)), ("shape", longer, lambda: _packed(longer)),
            ("dtype", fp32, lambda: _packed(fp32)),
            ("strides", base, lambda: (base.xq.contiguous(), base.xk.contiguous()))]


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
def test_each_changed_layout_gets_its_own_plan_and_the_planned_call_matches_float64(
        inplace, device, monkeypatch):
    """A changed shape, dtype or stride is a new key (a new derivation of the launch); the
    second call on each layout is planned (no derivation) and matches float64."""
    derived = []
    real = fused.rows_launch
    monkeypatch.setattr(fused, "rows_launch", lambda *a, **k: derived.append(a[0].shape) or real(*a, **k))
    keys = set()
    for n, (name, inp, fresh) in enumerate(_layouts(device), start=1):
        cos, sin = cos_sin_views(inp.freqs_cis)
        for call in range(2):
            q, k = fresh()
            out = fused.fused_qk_rope(q, k, cos, sin, inplace=inplace)
            assert _within_tolerance(out, inp), (name, call)
            assert len(derived) == n, (name, call)  # derived on the first call only
        keys.add(fused._PLANS.key(q, k, cos, sin, inplace))
        assert len(fused._PLANS) == n == len(keys), name


def test_extra_options_key_their_own_plans(device):
    """``extra`` (a call option that changes the launch, e.g. a rotation convention) is part
    of the key: the same tensors under another option are not the same plan."""
    inp = make_inputs(4, 2, 8, torch.bfloat16, device)
    cos, sin = cos_sin_views(inp.freqs_cis)
    a = fused._PLANS.key(inp.xq, inp.xk, cos, sin, False, ("pairs",))
    b = fused._PLANS.key(inp.xq, inp.xk, cos, sin, False, ("half",))
    assert a is not None and b is not None and a != b
    assert fused._PLANS.key(inp.xq, inp.xk, cos, sin, False) != a


def test_the_checked_and_the_planned_launch_are_one_derivation(device, monkeypatch):
    """Both launches pass the kernel what ``rows_launch`` derived: the same scalars and
    constexprs (recorded at Triton's launch), the planned call deriving nothing."""
    seen = []
    monkeypatch.setattr(fused.KernelLaunch, "launch",
                        lambda self, *t: seen.append((self.grid, self.scalars, dict(self.constexprs),
                                                      self.num_warps)))
    inp = make_inputs(5, 3, 72, torch.bfloat16, device)
    cos, sin = cos_sin_views(inp.freqs_cis)
    for _ in range(2):
        fused.fused_qk_rope(inp.qkv[:, 0], inp.qkv[:, 1], cos, sin)
    assert len(seen) == 2 and seen[0] == seen[1]
    grid, scalars, constexprs, warps = seen[0]
    config = fused.fused_launch_config(3, 72, 2)
    assert scalars[0] == 5 and constexprs["BLOCK_T"] == config.block_t and warps == config.num_warps
    assert list(constexprs)[:2] == ["HEADS", "HEAD_DIM"] and constexprs["PAIR_FN"] is fused._rotate_row_pairs


def test_out_of_place_outputs_are_fresh_contiguous_and_aligned(device):
    """The planned out-of-place call's outputs: new contiguous tensors of q's shape and dtype,
    apart from each other and from the inputs, 16-byte aligned, that require no grad."""
    inp = make_inputs(5, 2, 8, torch.bfloat16, device)
    xq, xk = inp.qkv[:, 0], inp.qkv[:, 1]
    cos, sin = cos_sin_views(inp.freqs_cis)
    for _ in range(2):
        q, k = fused.fused_qk_rope(xq, xk, cos, sin)
        assert q.shape == k.shape == xq.shape and q.dtype == k.dtype == xq.dtype
        assert q.is_contiguous() and k.is_contiguous() and (q.data_ptr() | k.data_ptr()) % 16 == 0
        assert q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
        assert inp.qkv.untyped_storage().data_ptr() not in (q.untyped_storage().data_ptr(),
                                                            k.untyped_storage().data_ptr())
        assert not q.requires_grad and _within_tolerance((q, k), inp)


def test_a_launch_passes_constexprs_in_the_kernels_parameter_order():
    """The direct launch hands the constexprs to Triton's launcher by position: given in any
    order they are put in the kernel's; a missing or unknown one is refused by name."""
    from rope_kernels.kernels.launch_plan import KernelLaunch

    kernel = fused._fused_qk_rope_rows_kernel
    names = kernel.arg_names
    n_const = 13
    constexprs = {name: i for i, name in enumerate(names[-n_const:])}
    shuffled = dict(reversed(list(constexprs.items())))
    launch = KernelLaunch(kernel, (1,), (7, 8), shuffled, 4)
    assert list(launch.constexprs) == names[-n_const:]
    assert launch._bound_tail == (7, 8, *range(n_const))
    with pytest.raises(ValueError, match="PAIR_FN"):
        KernelLaunch(kernel, (1,), (), {k: v for k, v in constexprs.items() if k != "PAIR_FN"}, 4)


def test_the_host_path_benchmark_stubs_every_launch_and_restores_them():
    """``bench.host_path --stub`` (a benchmark, not a timed test): one row per variant with
    per-call figures, every launch recorded and none run, the launchers restored after."""
    if "vllm_packed_qk" not in VARIANTS:
        pytest.skip("vLLM's packed_qk_rope_ is absent; run `python -m rope_kernels peers fetch`")
    from rope_kernels.bench import host_path
    from rope_kernels.kernels.launch_plan import KernelLaunch
    from rope_kernels.peers.vllm import packed_qk_source

    module = packed_qk_source()[1]
    before = (KernelLaunch.launch, module._packed_qk_rope_kernel)
    with host_path.stubbed_launches() as launches:  # host_rows(stub=True) enters the same
        rows = host_path.host_rows([4], device="cpu", stub=False, calls=3, repeats=2)
        assert launches() == 3 * (3 + 3 * 2)  # per variant: 3 warm-up calls, 2 loops of 3
    assert (KernelLaunch.launch, module._packed_qk_rope_kernel) == before
    assert [r["variant"] for r in rows] == list(host_path.VARIANTS)
    assert all(r["host_p20_us"] <= r["host_us"] <= r["host_p80_us"] for r in rows)
    assert [r["x_vllm"] for r in rows][-1] == 1.0
    assert host_path.host_rows([4], device="cpu", stub=True, calls=1, repeats=1)[0]["mode"] == "stub"
    assert (KernelLaunch.launch, module._packed_qk_rope_kernel) == before


def test_a_planned_layout_still_refuses_cos_sin_inside_k(device):
    """Separate contiguous q and k: a checked call makes the plan; then the same layout with
    cos/sin in exactly k's bytes (q's apart from them): the planned path's k-range test
    sends it to the full check, which refuses it."""
    tokens, heads, head_dim = 4, 2, 8
    inp = make_inputs(tokens, heads, head_dim, torch.bfloat16, device, seed=5)
    cos, sin = cos_sin_views(inp.freqs_cis)
    xq, xk = inp.xq.contiguous(), inp.xk.contiguous()
    fused.fused_qk_rope(xq, xk, cos, sin, inplace=True)
    half = tokens * heads * head_dim // 2  # floats per bf16 tensor
    buf = torch.zeros(2 * half, dtype=torch.float32, device=device)
    q = buf[:half].view(torch.bfloat16).view(tokens, heads, head_dim)
    k = buf[half:].view(torch.bfloat16).view(tokens, heads, head_dim)
    freqs = buf[half:].view(torch.complex64).view(tokens, head_dim // 2)
    cos2, sin2 = cos_sin_views(freqs)
    assert fused._PLANS.key(q, k, cos2, sin2, True, extra=("pairs",)) in fused._PLANS
    with pytest.raises(ValueError, match="shares memory"):
        fused.fused_qk_rope(q, k, cos2, sin2, inplace=True)
