"""In-place rotation tells autograd it wrote (issue 47 item 1): a graph that saved the
tensor refuses ``backward()`` with torch's own error instead of differentiating the
rotated values, and an inference-mode tensor is refused outside inference mode, as
torch's own in-place ops behave (``x.mul_``)."""

import pytest
import torch

from rope_kernels import fused_qk_rope, rope_reference
from rope_kernels.kernels import fused
from rope_kernels.variants import fused_rope

MODIFIED = "modified by an inplace operation"


@pytest.fixture(autouse=True)
def _tensors_on_the_tests_device(device):
    """Every tensor these tests make lives where the kernels run (a GPU where there is one:
    the H200 preflight failed on CPU tensors without the interpreter)."""
    torch.set_default_device(device)
    yield
    torch.set_default_device(None)


def _inputs(tokens=5, heads=2, head_dim=8, dtype=torch.float32):
    xq = torch.randn(tokens, heads, head_dim).to(dtype)
    xk = torch.randn(tokens, heads, head_dim).to(dtype)
    angles = torch.rand(tokens, head_dim // 2) * 6.28
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    return xq, xk, freqs_cis


def _rotate_in_place(how, xq, xk, freqs_cis):
    if how == "fused_qk_rope":
        fused_qk_rope(xq, xk, freqs_cis.real.contiguous(), freqs_cis.imag.contiguous(),
                      inplace=True)
    elif how == "out=":
        fused_qk_rope(xq.clone(), xk.clone(), freqs_cis.real.contiguous(),
                      freqs_cis.imag.contiguous(), out=(xq, xk))
    else:  # the fused_inplace variant (freqs_cis views)
        fused_rope(xq, xk, freqs_cis, inplace=True)


HOWS = ["fused_qk_rope", "out=", "fused_inplace"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("call", ["first", "planned"])  # the checked path, then the plan's
def test_backward_through_a_rotated_saved_tensor_raises_torchs_error(how, call):
    xq, xk, freqs_cis = _inputs()
    if call == "planned":  # the same layout once before: the next call takes the planned path
        with torch.no_grad():
            _rotate_in_place(how, xq.clone(), xk.clone(), freqs_cis)
    for saved in ("q", "k"):
        w = torch.randn(xq.shape, requires_grad=True)
        z = (w * (xq if saved == "q" else xk)).sum()  # saves xq (or xk) for w's gradient
        with torch.no_grad():
            _rotate_in_place(how, xq, xk, freqs_cis)
        with pytest.raises(RuntimeError, match=MODIFIED):
            z.backward()


def test_the_packed_variant_bumps_the_qkv_buffer():
    """q and k as views of a packed (T, 3, H, D) qkv: the base's saved copy is caught too."""
    xq, xk, freqs_cis = _inputs()
    qkv = torch.stack([xq, xk, torch.randn_like(xq)], dim=1)
    w = torch.randn(qkv.shape, requires_grad=True)
    z = (w * qkv).sum()
    q, k, _ = qkv.unbind(1)
    with torch.no_grad():
        fused_rope(q, k, freqs_cis, inplace=True)
    with pytest.raises(RuntimeError, match=MODIFIED):
        z.backward()


@pytest.mark.parametrize("how", HOWS)
def test_an_inference_tensor_outside_inference_mode_is_refused_unwritten(how):
    with torch.inference_mode():
        xq, xk, freqs_cis = _inputs()
        other = torch.randn(3)
    with pytest.raises(RuntimeError, match="inference tensor outside InferenceMode"):
        other.mul_(2)  # torch's own refusal (made after its write), which ours matches
    before = xq.clone(), xk.clone()
    for _ in range(2):  # the checked path, then (had it been planned) the plan's
        with pytest.raises(RuntimeError, match="inference tensor outside InferenceMode"):
            _rotate_in_place(how, xq, xk, freqs_cis)
    assert torch.equal(xq, before[0]) and torch.equal(xk, before[1])


@pytest.mark.parametrize("how", HOWS)
def test_inside_inference_mode_the_rotation_is_right(how):
    """Refusing outside inference mode must not refuse inside it; fresh inputs, float64."""
    with torch.inference_mode():
        xq, xk, freqs_cis = _inputs()
        want_q, want_k = rope_reference(xq, xk, freqs_cis)
        for _ in range(2):
            q, k = xq.clone(), xk.clone()
            _rotate_in_place(how, q, k, freqs_cis)
            torch.testing.assert_close(q.double(), want_q, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(k.double(), want_k, rtol=1e-5, atol=1e-5)


def test_the_version_goes_up_once_per_call_and_out_of_place_leaves_inputs_alone():
    xq, xk, freqs_cis = _inputs()
    cos, sin = freqs_cis.real.contiguous(), freqs_cis.imag.contiguous()
    for _ in range(2):  # checked, then planned
        v = xq._version, xk._version
        fused_qk_rope(xq, xk, cos, sin, inplace=True)
        assert (xq._version, xk._version) == (v[0] + 1, v[1] + 1)
        v = xq._version, xk._version
        fused_qk_rope(xq, xk, cos, sin)
        assert (xq._version, xk._version) == v
    assert fused._PLANS  # the second round went the planned way


def test_the_launch_candidates_in_place_bump_too():
    """The benchmark's other in-place kernels (tiles, persistent) are ours as well."""
    from rope_kernels.bench.fused_candidates import fused_qk_rope_persistent, fused_qk_rope_tiles

    for candidate in (fused_qk_rope_tiles, fused_qk_rope_persistent):
        xq, xk, freqs_cis = _inputs()
        w = torch.randn(xq.shape, requires_grad=True)
        z = (w * xq).sum()
        candidate(xq, xk, freqs_cis.real.contiguous(), freqs_cis.imag.contiguous(), inplace=True)
        with pytest.raises(RuntimeError, match=MODIFIED):
            z.backward()


def test_a_qkv_gemm_out_is_marked_written():
    """``out=`` of the QKV GEMM with RoPE: the buffer a graph saved is refused afterwards,
    and an inference-mode buffer outside inference mode is refused unwritten."""
    from rope_kernels.kernels.qkv_gemm import qkv_rope_linear

    tokens, heads, head_dim, hidden = 5, 2, 8, 32
    x = torch.randn(tokens, hidden).to(torch.bfloat16)
    w_qkv = torch.randn(3 * heads * head_dim, hidden).to(torch.bfloat16)
    _, _, freqs_cis = _inputs(tokens, heads, head_dim)
    cos, sin = freqs_cis.real.contiguous(), freqs_cis.imag.contiguous()
    out = torch.randn(tokens, 3, heads, head_dim).to(torch.bfloat16)
    w = torch.randn(out.shape, requires_grad=True)
    z = (w * out).sum()
    qkv_rope_linear(x, w_qkv, None, cos, sin, heads=heads, out=out)
    with pytest.raises(RuntimeError, match=MODIFIED):
        z.backward()
    with torch.inference_mode():
        frozen = torch.randn(tokens, 3, heads, head_dim).to(torch.bfloat16)
    before = frozen.clone()
    with pytest.raises(RuntimeError, match="inference tensor outside InferenceMode"):
        qkv_rope_linear(x, w_qkv, None, cos, sin, heads=heads, out=frozen)
    assert torch.equal(frozen, before)
