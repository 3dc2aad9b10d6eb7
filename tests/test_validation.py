"""Bad input: a clear ValueError/TypeError naming the problem, never a crash inside Triton."""

import pytest
import torch

from rope_kernels import (
    cos_sin_views,
    fused_qk_rope,
    native_rope,
    rope_reference,
    vision_freqs_cis,
    vllm_merged_recreated_rope,
)
from rope_kernels.kernels.fused import RowsConfig
from rope_kernels.vocabulary import KNOWN_VARIANTS


def qk(t=4, h=2, d=8, dtype=torch.bfloat16, device="cpu"):
    return (torch.randn(t, h, d, device=device).to(dtype),
            torch.randn(t, h, d, device=device).to(dtype))


def cs(t=4, d=8, device="cpu"):
    return torch.rand(t, d // 2, device=device), torch.rand(t, d // 2, device=device)


def freqs(t=4, d=8, device="cpu"):
    a = torch.rand(t, d // 2, device=device)
    return torch.polar(torch.ones_like(a), a)


# Every known variant by name (the same test IDs whatever is installed; absent peers
# skip with why), the two freqs_cis functions called directly.
FREQS_FNS = {"native": native_rope, "vllm_merged_recreated": vllm_merged_recreated_rope}
NAMES = sorted({*FREQS_FNS, *KNOWN_VARIANTS})


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda d: (torch.randn(4, 8, device=d), torch.randn(4, 8, device=d)), ValueError, "3-D"),
        (lambda d: (torch.randn(4, 2, 8, device=d), torch.randn(4, 3, 8, device=d)), ValueError,
         "differ in shape"),
        (lambda d: (torch.randn(4, 2, 8, device=d), torch.randn(4, 2, 8, device=d).half()),
         TypeError, "differ in dtype"),
        (lambda d: (torch.ones(4, 2, 8, dtype=torch.int32, device=d),) * 2, TypeError,
         "floating-point"),
        (lambda d: (torch.randn(4, 2, 7, device=d), torch.randn(4, 2, 7, device=d)), ValueError,
         "even"),
        (lambda d: (torch.randn(4, 2, 16, device=d)[..., ::2],) * 2, ValueError, "unit-stride"),
        (lambda d: (torch.randn(4, 2, 8, dtype=torch.float64, device=d),) * 2, TypeError,
         "not supported"),
    ],
    ids=["2d", "shape", "dtype", "int", "odd", "stride", "float64"],
)
@pytest.mark.parametrize("name", NAMES)
def test_bad_q_k(make, exc, match, name, device, registered):
    xq, xk = make(device)
    fn = FREQS_FNS.get(name) or registered(name)
    with pytest.raises(exc, match=match):
        fn(xq, xk, freqs(device=device))
    with pytest.raises(exc, match=match):
        fused_qk_rope(xq, xk, *cs(device=device))


def test_q_k_on_different_devices():
    xq, xk = qk()
    xk = xk.to("meta")
    with pytest.raises(ValueError, match="different devices"):
        fused_qk_rope(xq, xk, *cs())
    with pytest.raises(ValueError, match="different devices"):
        native_rope(xq, xk, freqs())


@pytest.mark.parametrize(
    "cos, sin, exc, match",
    [
        (torch.rand(4, 3), torch.rand(4, 3), ValueError, r"\(tokens, head_dim/2\)"),
        (torch.rand(5, 4), torch.rand(5, 4), ValueError, r"\(tokens, head_dim/2\)"),
        (torch.rand(4, 4), torch.rand(4, 3), ValueError, "sin must have shape"),
        (torch.rand(4, 4).half(), torch.rand(4, 4), TypeError, "float32"),
        (torch.rand(4, 4), torch.rand(4, 4).double(), TypeError, "float32"),
        (torch.rand(4, 4), torch.rand(4, 4, device="meta"), ValueError, "sin is on meta"),
        ("cos", torch.rand(4, 4), TypeError, "torch.Tensor"),
    ],
    ids=["width", "tokens", "mismatch", "half", "double", "device", "type"],
)
def test_bad_cos_sin(cos, sin, exc, match):
    with pytest.raises(exc, match=match):
        fused_qk_rope(*qk(), cos, sin)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "f, exc, match",
    [
        (torch.rand(4, 4), TypeError, "complex64"),
        (torch.rand(4, 4, dtype=torch.complex128), TypeError, "complex64"),
        (torch.rand(4, 3, dtype=torch.complex64), ValueError, r"\(tokens, head_dim/2\)"),
        (torch.rand(3, 4, dtype=torch.complex64), ValueError, r"\(tokens, head_dim/2\)"),
    ],
    ids=["real", "complex128", "width", "tokens"],
)
def test_bad_freqs_cis(name, f, exc, match, device, registered):
    fn = FREQS_FNS.get(name) or registered(name)
    with pytest.raises(exc, match=match):
        fn(*qk(device=device), f.to(device))


def test_in_place_refuses_aliased_or_broadcast_inputs(device):
    xq, _ = qk(device=device)
    c, s = cs(device=device)
    with pytest.raises(ValueError, match="same memory"):
        fused_qk_rope(xq, xq, c, s, inplace=True)
    row = torch.randn(1, 2, 8, device=device).to(torch.bfloat16).expand(4, 2, 8)
    with pytest.raises(ValueError, match="broadcast"):
        fused_qk_rope(row, row.clone(), c, s, inplace=True)
    with pytest.raises(TypeError, match="inplace must be a bool"):
        fused_qk_rope(*qk(device=device), c, s, inplace="yes")
    with pytest.raises(ValueError, match="not both"):
        fused_qk_rope(*qk(device=device), c, s, inplace=True, out=qk(device=device))


def test_bad_out_and_config(device):
    xq, xk = qk(device=device)
    c, s = cs(device=device)
    with pytest.raises(ValueError, match="q_out must match"):
        fused_qk_rope(xq, xk, c, s, out=(torch.empty(4, 2, 8, device=device), xk.clone()))
    with pytest.raises(TypeError, match="pair"):
        fused_qk_rope(xq, xk, c, s, out=xq)
    with pytest.raises(TypeError, match="RowsConfig"):
        fused_qk_rope(xq, xk, c, s, config=(4, 4))
    with pytest.raises(ValueError, match="power of two"):
        RowsConfig(block_t=3, num_warps=4)


def test_cpu_tensors_without_interpreter_get_a_clear_error(monkeypatch):
    import rope_kernels.kernels.checks as checks

    monkeypatch.setattr(checks, "triton_interpreter_enabled", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        fused_qk_rope(*qk(), *cs())


def test_zero_tokens_returns_empty(device):
    xq, xk = qk(t=0, device=device)
    q, k = fused_qk_rope(xq, xk, *cs(t=0, device=device))
    assert q.shape == (0, 2, 8) and k.shape == (0, 2, 8)


@pytest.mark.parametrize("tokens,heads", [(0, 2), (4, 0)])
@pytest.mark.parametrize("fn", [native_rope, rope_reference], ids=["native", "reference"])
def test_native_and_reference_return_empty_on_no_elements(fn, tokens, heads):
    """Issue 47 item 3: 'cannot reshape tensor of 0 elements' before (view(..., -1, 2))."""
    xq, xk = qk(t=tokens, h=heads)
    q, k = fn(xq, xk, freqs(t=tokens))
    assert q.shape == (tokens, heads, 8) and k.shape == (tokens, heads, 8)


@pytest.mark.parametrize(
    "grid, head_dim, exc, match",
    [
        ([(1, 0, 4)], 8, ValueError, "positive"),
        ([(1, -2, 4)], 8, ValueError, "positive"),
        ([(0, 2, 4)], 8, ValueError, "positive"),
        ([(1, 513, 4)], 8, ValueError, "512 patches"),
        ([(1, 4, 600)], 8, ValueError, "512 patches"),
        ([(1, 2.0, 4)], 8, TypeError, "must be an int"),
        ([(1, 2)], 8, ValueError, "triple"),
        ([], 8, ValueError, "empty"),
        ([(1, 2, 2)], 6, ValueError, "multiple of 4"),
        ([(1, 2, 2)], 0, ValueError, "multiple of 4"),
        ([(1, 2, 2)], 8.0, TypeError, "head_dim must be an int"),
        (torch.tensor([[1.0, 2.0, 2.0]]), 8, TypeError, "integers"),
        (torch.tensor([1, 2, 2]), 8, ValueError, r"\(images, 3\)"),
        ("1x2x2", 8, TypeError, "sequence"),
    ],
)
def test_bad_grids(grid, head_dim, exc, match):
    with pytest.raises(exc, match=match):
        vision_freqs_cis(grid, head_dim)


def test_cos_sin_views_need_complex64():
    with pytest.raises(TypeError, match="complex64"):
        cos_sin_views(torch.rand(4, 4))
