"""Memory overlap, autograd and odd views: the fused kernel refuses what it cannot
compute correctly, and differentiates what it can."""

import itertools

import pytest
import torch

from rope_kernels import cos_sin_views, fused_qk_rope, native_rope, vision_freqs_cis
from rope_kernels.kernels.checks import may_overlap
from rope_kernels.kernels.reference import rope_reference


def angles(t, d, device):
    a = torch.rand(t, d // 2, device=device) * 6.3
    f = torch.polar(torch.ones_like(a), a)
    return f, *cos_sin_views(f)


@pytest.mark.parametrize("cut", ["rows", "elements"])
def test_in_place_refuses_overlapping_q_and_k(cut, device):
    t, h, d = 4, 2, 8
    if cut == "rows":  # buf[:-1] and buf[1:]: q's token 1 is k's token 0
        buf = torch.randn(t + 1, h, d, device=device)
        xq, xk = buf[:-1], buf[1:]
    else:  # one element apart in one flat buffer
        buf = torch.randn(t * h * d + 2, device=device)
        xq, xk = buf[:-2].view(t, h, d), buf[2:].view(t, h, d)
    _, c, s = angles(t, d, device)
    before = buf.clone()
    with pytest.raises(ValueError, match="share memory"):
        fused_qk_rope(xq, xk, c, s, inplace=True)
    assert torch.equal(buf, before)  # refused before anything was written


def test_out_refuses_overlap_with_each_other_or_the_other_input(device):
    t, h, d = 4, 2, 8
    xq, xk = torch.randn(t, h, d, device=device), torch.randn(t, h, d, device=device)
    _, c, s = angles(t, d, device)
    buf = torch.randn(t + 1, h, d, device=device)
    with pytest.raises(ValueError, match="share memory"):
        fused_qk_rope(xq, xk, c, s, out=(buf[:-1], buf[1:]))
    with pytest.raises(ValueError, match="q_out shares memory with xk"):
        fused_qk_rope(xq, xk, c, s, out=(xk, torch.empty_like(xk)))
    with pytest.raises(ValueError, match="k_out shares memory with xk"):  # shifted by a token
        big = torch.randn(t + 1, h, d, device=device)
        fused_qk_rope(xq, big[1:], c, s, out=(torch.empty_like(xq), big[:-1]))


def test_out_may_be_the_inputs_themselves(device):
    t, h, d = 5, 2, 8
    f, c, s = angles(t, d, device)
    xq, xk = torch.randn(t, h, d, device=device), torch.randn(t, h, d, device=device)
    want = rope_reference(xq, xk, f)
    q, k = fused_qk_rope(xq, xk, c, s, out=(xq, xk))
    assert q is xq and k is xk
    torch.testing.assert_close(q.double(), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k.double(), want[1], rtol=1e-5, atol=1e-5)


def test_packed_qkv_views_stay_accepted(device):
    """q and k unbound from one (T, 3, H, D) buffer interleave in one storage range
    without sharing an element: in place and out= into another packed buffer work."""
    t, h, d = 6, 2, 8
    f, c, s = angles(t, d, device)
    qkv = torch.randn(t, 3, h, d, device=device)
    xq, xk, v = qkv.unbind(1)
    assert not may_overlap(xq, xk)
    want = rope_reference(xq, xk, f)
    v_before = v.clone()
    out_qkv = torch.empty_like(qkv)
    fused_qk_rope(xq, xk, c, s, out=(out_qkv[:, 0], out_qkv[:, 1]))
    fused_qk_rope(xq, xk, c, s, inplace=True)
    for got in ((xq, xk), (out_qkv[:, 0], out_qkv[:, 1])):
        torch.testing.assert_close(got[0].double(), want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1].double(), want[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(v, v_before)


def _addresses(x):
    offs = [range(0, n * st, st) if n else range(0) for n, st in zip(x.shape, x.stride())]
    base = x.storage_offset()
    return {base + sum(p) for p in itertools.product(*offs)}


def test_may_overlap_is_sound_and_exact_for_equal_layouts():
    """Against brute force over every pair of small strided views of one storage:
    never misses an overlap; for equal nested layouts never reports a false one."""
    storage = torch.zeros(64)
    layouts = [((2, 3, 2), (12, 2, 1)), ((2, 2, 2), (8, 4, 1)), ((3, 2, 2), (6, 3, 1)),
               ((2, 2, 4), (24, 4, 1)), ((4, 1, 2), (5, 7, 1))]
    checked_exact = 0
    for (shape_a, stride_a), (shape_b, stride_b) in itertools.product(layouts, repeat=2):
        for off_a, off_b in itertools.product(range(0, 12), range(0, 12)):
            a = storage.as_strided(shape_a, stride_a, off_a)
            b = storage.as_strided(shape_b, stride_b, off_b)
            truth = bool(_addresses(a) & _addresses(b))
            got = may_overlap(a, b)
            assert got or not truth, (shape_a, stride_a, off_a, shape_b, stride_b, off_b)
            if (shape_a, stride_a) == (shape_b, stride_b):
                assert got == truth, (shape_a, stride_a, off_a, off_b)
                checked_exact += 1
    assert checked_exact > 500


def test_may_overlap_byte_level_across_element_boundaries():
    raw = torch.zeros(40, dtype=torch.uint8)
    a = raw[0:32].view(torch.float32).view(2, 2, 2)
    b = raw[2:34].view(torch.float16).view(2, 2, 4)[..., :2]  # other dtype: ranges decide
    assert may_overlap(a, b)
    c = raw[32:40].view(torch.float32).view(1, 1, 2)
    assert not may_overlap(a, c)


# Autograd --------------------------------------------------------------------

@pytest.mark.parametrize("packed", [False, True])
def test_fused_gradients_match_native_fp32(packed, device):
    t, h, d = 7, 3, 72
    freqs = vision_freqs_cis([(1, 1, t)], head_dim=d, device=device)
    cos, sin = cos_sin_views(freqs)
    g = torch.Generator(device="cpu").manual_seed(0)
    if packed:
        base = torch.randn(t, 3, h, d, generator=g).to(device)
    else:
        base = torch.randn(2, t, h, d, generator=g).to(device)
    w_q, w_k = torch.randn(2, t, h, d, generator=g).to(device).unbind(0)
    grads = {}
    for name in ("native", "fused"):
        leaf = base.clone().requires_grad_(True)
        xq, xk = (leaf.unbind(1) if packed else leaf.unbind(0))[:2]
        q, k = native_rope(xq, xk, freqs) if name == "native" else fused_qk_rope(xq, xk, cos, sin)
        assert q.grad_fn is not None and k.grad_fn is not None
        ((q * w_q).sum() + (k * w_k).sum()).backward()
        grads[name] = leaf.grad
    torch.testing.assert_close(grads["fused"], grads["native"], rtol=1e-5, atol=1e-5)
    # the gradient is the inverse rotation, not the forward one: it must not equal that
    wrong = torch.cat([x.unsqueeze(1) for x in fused_qk_rope(w_q, w_k, cos, sin)], 1)
    assert not torch.allclose(grads["fused"][:, :2] if packed else grads["fused"].transpose(0, 1),
                              wrong, atol=1e-3)


def test_fused_gradient_when_only_q_is_used(device):
    t, h, d = 4, 2, 8
    f, c, s = angles(t, d, device)
    xq = torch.randn(t, h, d, device=device, requires_grad=True)
    xk = torch.randn(t, h, d, device=device, requires_grad=True)
    q, _ = fused_qk_rope(xq, xk, c, s)
    q.sum().backward()  # a stride-0 gradient
    nq = xq.detach().clone().requires_grad_(True)
    native_rope(nq, xk.detach(), f)[0].sum().backward()
    torch.testing.assert_close(xq.grad, nq.grad, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(xk.grad) == 0


def test_fused_bf16_gradients_close_to_native(device):
    t, h, d = 16, 2, 72
    freqs = vision_freqs_cis([(1, 4, 4)], head_dim=d, device=device)
    cos, sin = cos_sin_views(freqs)
    x = torch.randn(2, t, h, d, device=device).to(torch.bfloat16)
    w = torch.randn(2, t, h, d, device=device)
    exact = None
    errs = {}
    for name in ("native", "fused", "fp32"):
        leaf = (x.float() if name == "fp32" else x).clone().requires_grad_(True)
        xq, xk = leaf.unbind(0)
        q, k = native_rope(xq, xk, freqs) if name != "fused" else fused_qk_rope(xq, xk, cos, sin)
        ((q.float() * w[0]).sum() + (k.float() * w[1]).sum()).backward()
        if name == "fp32":
            exact = leaf.grad.double()
        else:
            errs[name] = leaf.grad
    for name in ("native", "fused"):
        errs[name] = (errs[name].double() - exact).abs().max().item()
    assert errs["fused"] <= 2 * errs["native"] + 1e-6, errs


def test_in_place_on_a_tensor_that_requires_grad_is_refused(device):
    t, h, d = 4, 2, 8
    _, c, s = angles(t, d, device)
    xq = torch.randn(t, h, d, device=device, requires_grad=True)
    xk = torch.randn(t, h, d, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="leaf tensor .*requires grad"):
        fused_qk_rope(xq, xk, c, s, inplace=True)
    qkv = torch.randn(t, 3, h, d, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="requires grad"):
        fused_qk_rope(*qkv.unbind(1)[:2], c, s, inplace=True)
    with pytest.raises(ValueError, match="autograd"):
        fused_qk_rope(xq, xk, c, s, out=(torch.empty_like(xq), torch.empty_like(xk)))
    with pytest.raises(ValueError, match="cos/sin"):
        fused_qk_rope(xq.detach(), xk.detach(), c.clone().requires_grad_(True), s)
    with torch.no_grad():  # no autograd recorded: in place is fine
        fused_qk_rope(xq, xk, c, s, inplace=True)


def test_native_accepts_fp32_views_at_odd_offsets(device):
    t, h, d = 3, 2, 8
    f, c, s = angles(t, d, device)
    buf = torch.randn(1 + 2 * t * h * d, device=device)
    xq = buf[1:1 + t * h * d].view(t, h, d)          # odd storage offset
    xk = buf[1 + t * h * d:].view(t, h, d)
    assert xq.storage_offset() % 2 == 1
    want = rope_reference(xq, xk, f)
    for got in (native_rope(xq, xk, f), fused_qk_rope(xq, xk, c, s)):
        torch.testing.assert_close(got[0].double(), want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1].double(), want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("written", ["xq", "xk"])
@pytest.mark.parametrize("read", ["cos", "sin"])
def test_in_place_refuses_q_or_k_sharing_memory_with_cos_or_sin(written, read, device):
    """Every program reads cos/sin while others write q/k: a shared byte makes the result
    depend on timing (relative error ~3 before this was refused)."""
    t, h, d = 4, 2, 8
    buf = torch.randn(t * h * d, device=device)
    x = {"xq": torch.randn(t, h, d, device=device), "xk": torch.randn(t, h, d, device=device)}
    x[written] = buf.view(t, h, d)
    _, c, s = angles(t, d, device)
    tables = {"cos": c, "sin": s}
    tables[read] = buf[t * d // 2: t * d].view(t, d // 2)  # inside q's or k's memory
    before = buf.clone()
    with pytest.raises(ValueError, match=f"{written} is written but shares memory with {read}"):
        fused_qk_rope(x["xq"], x["xk"], tables["cos"], tables["sin"], inplace=True)
    assert torch.equal(buf, before)


@pytest.mark.parametrize("read", ["cos", "sin"])
def test_out_refuses_an_output_sharing_memory_with_cos_or_sin(read, device):
    t, h, d = 4, 2, 8
    xq, xk = torch.randn(t, h, d, device=device), torch.randn(t, h, d, device=device)
    _, c, s = angles(t, d, device)
    buf = torch.randn(t * h * d, device=device)
    tables = {"cos": c, "sin": s}
    tables[read] = buf[: t * d // 2].view(t, d // 2)
    with pytest.raises(ValueError, match=f"k_out is written but shares memory with {read}"):
        fused_qk_rope(xq, xk, tables["cos"], tables["sin"],
                      out=(torch.empty_like(xq), buf.view(t, h, d)))


def test_cos_and_sin_may_share_one_complex_tensor(device):
    """Both only read: the real and imaginary views of one freqs_cis stay accepted."""
    t, h, d = 4, 2, 8
    f, c, s = angles(t, d, device)
    xq, xk = torch.randn(t, h, d, device=device), torch.randn(t, h, d, device=device)
    want = rope_reference(xq, xk, f)
    q, k = fused_qk_rope(xq, xk, c, s, inplace=True)
    torch.testing.assert_close(q.double(), want[0], rtol=1e-5, atol=1e-5)


def test_meta_tensors_are_refused_before_any_kernel():
    xq = torch.empty(4, 2, 8, device="meta")
    cos = torch.empty(4, 4, device="meta")
    for kwargs in ({}, {"inplace": True}):
        with pytest.raises(ValueError, match="meta tensors"):
            fused_qk_rope(xq, torch.empty_like(xq), cos, torch.empty_like(cos), **kwargs)


def test_the_compile_matrix_still_records_launches_on_meta_tensors():
    from rope_kernels.bench.compile_matrix import KERNELS, recorded_launch

    entry = next(e for e in KERNELS if e.name == "fused")
    _, args, kwargs = recorded_launch(entry, 64, 2, 72, "bfloat16")
    assert args[0].device.type == "meta" and kwargs["HEAD_DIM"] == 72
