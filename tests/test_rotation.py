"""The rotation as an axis of the fused kernel: ``rotation="half"`` (Qwen's rotate-half,
x[j] with x[j + D/2]) against a float64 reference written here, not the library's, at
shapes the study does not time; packed views in and out of place; pairs and half differ
where they should (a negative control)."""

import math

import pytest
import torch

from rope_kernels.correctness import lowp_tolerance, new_seed
from rope_kernels.kernels import fused
from rope_kernels.kernels.fused import fused_qk_rope
from rope_kernels.kernels.reference import rope_reference
from rope_kernels.vocabulary import ROTATIONS


def rotate_half_f64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The textbook NeoX / Qwen form in float64: x * cos' + rotate_half(x) * sin', with
    cos' = cat(cos, cos) over the head and rotate_half(x) = cat(-x2, x1)."""
    x = x.double()
    half = x.shape[-1] // 2
    c = torch.cat((cos, cos), dim=-1).double()[:, None, :]
    s = torch.cat((sin, sin), dim=-1).double()[:, None, :]
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * c + rotated * s


def draw(tokens, heads, head_dim, dtype, seed):
    """A packed (T, 3, H, D) qkv and fp32 cos/sin of angles uniform in +-64 pi."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, 3, heads, head_dim, generator=gen).to(dtype)
    angles = (torch.rand(tokens, head_dim // 2, generator=gen, dtype=torch.float64) * 2 - 1) \
        * 64 * math.pi
    return qkv, angles.cos().float(), angles.sin().float()


def tolerance(x, cos, sin, dtype):
    """Twice the error of the plain PyTorch path (fp32 math, one rounding to dtype)."""
    ref = rotate_half_f64(x, cos, sin)
    half = x.shape[-1] // 2
    xf = x.float()
    c, s = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
    native = (xf * c + torch.cat((-xf[..., half:], xf[..., :half]), -1) * s).to(dtype)
    err = (native.double() - ref).abs().max().item()
    return lowp_tolerance(err, ref.abs().max().item(), dtype), ref


# head_dim 64/72/80/128 at token and head counts the study does not use (odd, small)
SHAPES = [(5, 3, 64), (3, 2, 72), (7, 1, 80), (2, 3, 128), (1, 1, 4)]


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rotate_half_matches_float64_on_packed_views(shape, dtype, inplace, device):
    seed = new_seed()
    qkv, cos, sin = draw(*shape, dtype, seed)
    qkv, cos, sin = qkv.to(device), cos.to(device), sin.to(device)
    before = qkv.clone()
    q, k = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, rotation="half", inplace=inplace)
    for got, x in ((q, before[:, 0]), (k, before[:, 1])):
        tol, ref = tolerance(x.cpu(), cos.cpu(), sin.cpu(), dtype)
        err = (got.cpu().double() - ref).abs().max().item()
        assert got.dtype == dtype and err <= tol, f"seed {seed}: error {err:.3g} over {tol:.3g}"
    assert torch.equal(qkv[:, 2], before[:, 2]), "v was written"
    if inplace:
        assert q.data_ptr() == qkv[:, 0].data_ptr() and k.data_ptr() == qkv[:, 1].data_ptr()
    else:
        assert torch.equal(qkv, before), "out of place wrote into its inputs"


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("shape", [(5, 3, 72), (4, 2, 80), (3, 5, 6)], ids=lambda s: "x".join(map(str, s)))
def test_rotate_half_reads_a_complex_freqs_cis_by_its_views(shape, inplace, device):
    """cos/sin as the real and imaginary views of a complex64 freqs_cis (how the study hands
    them over): the kernel reads each column's (cos, sin) as one 64-bit word; against the
    float64 form here, at odd head counts and halves (36, 40, 3)."""
    from rope_kernels.variants import fused_rope

    seed = new_seed()
    qkv, cos, sin = draw(*shape, torch.float32, seed)
    freqs_cis = torch.complex(cos, sin).to(device)
    qkv = qkv.to(device)
    xq, xk = qkv[:, 0], qkv[:, 1]
    want = [rotate_half_f64(x.cpu(), cos, sin) for x in (xq, xk)]
    got = fused_rope(xq, xk, freqs_cis, inplace=inplace, rotation="half")
    for g, w in zip(got, want):
        assert (g.cpu().double() - w).abs().max().item() < 1e-5 * w.abs().max().item(), seed
    if inplace:
        assert got[0].data_ptr() == qkv[:, 0].data_ptr()


def test_rotate_half_fp32_and_the_library_reference_agree(device):
    """fp32 data at fp32 accuracy; the library's float64 reference (``split_pairs``) is the
    test's own formula."""
    seed = new_seed()
    qkv, cos, sin = draw(4, 2, 72, torch.float32, seed)
    freqs = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))
    ref_q = rotate_half_f64(qkv[:, 0], cos, sin)
    lib_q, _ = rope_reference(qkv[:, 0], qkv[:, 1], freqs, "half")
    assert (lib_q - ref_q).abs().max().item() < 1e-5
    q, _ = fused_qk_rope(qkv[:, 0].to(device), qkv[:, 1].to(device), cos.to(device),
                         sin.to(device), rotation="half")
    assert (q.cpu().double() - ref_q).abs().max().item() <= 1e-5 * ref_q.abs().max().item() + 1e-6


def test_rotate_half_out_and_backward(device):
    """``out=`` gets the same result; the gradient is the inverse rotate-half."""
    qkv, cos, sin = draw(3, 2, 80, torch.float32, new_seed())
    qkv, cos, sin = qkv.to(device), cos.to(device), sin.to(device)
    q_out, k_out = torch.empty_like(qkv[:, 0]), torch.empty_like(qkv[:, 1])
    fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, rotation="half", out=(q_out, k_out))
    q, k = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, rotation="half")
    assert torch.equal(q, q_out) and torch.equal(k, k_out)
    xq = qkv[:, 0].clone().requires_grad_()
    yq, _ = fused_qk_rope(xq, qkv[:, 1], cos, sin, rotation="half")
    g = torch.randn_like(yq)
    yq.backward(g)
    want = rotate_half_f64(g.cpu(), cos.cpu(), -sin.cpu())  # rotation by -angle
    assert (xq.grad.cpu().double() - want).abs().max().item() < 1e-5 * want.abs().max().item() + 1e-6


def test_pairs_and_half_differ_where_they_should(device):
    """Negative control: on random data the two rotations disagree, and each matches only
    its own reference; at zero angle (cos 1, sin 0) both are the identity."""
    qkv, cos, sin = draw(4, 2, 72, torch.float32, new_seed())
    qkv, cos, sin = qkv.to(device), cos.to(device), sin.to(device)
    pairs, _ = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin)  # the default
    half, _ = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, rotation="half")
    ref_half = rotate_half_f64(qkv[:, 0].cpu(), cos.cpu(), sin.cpu())
    scale = ref_half.abs().max().item()
    assert (half.cpu().double() - ref_half).abs().max().item() < 1e-5 * scale
    assert (pairs.cpu().double() - ref_half).abs().max().item() > 0.1 * scale
    assert (pairs - half).abs().max().item() > 0.1 * scale
    one, zero = torch.ones_like(cos), torch.zeros_like(sin)
    for rotation in ROTATIONS:
        same, _ = fused_qk_rope(qkv[:, 0], qkv[:, 1], one, zero, rotation=rotation)
        assert torch.equal(same, qkv[:, 0])


def test_a_planned_layout_keeps_its_rotation(device):
    """The launch plan of a layout seen with one rotation is not reused for the other."""
    fused._PLANS.clear()
    qkv, cos, sin = draw(3, 2, 8, torch.bfloat16, new_seed())
    qkv, cos, sin = qkv.to(device), cos.to(device), sin.to(device)
    pairs = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin)[0].clone()
    half = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, rotation="half")[0]
    again = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin)[0]
    assert not torch.equal(pairs, half) and torch.equal(again, pairs)
    fused._PLANS.clear()


@pytest.mark.parametrize("bad, error", [("neox", ValueError), ("interleaved", ValueError),
                                        (True, TypeError), (None, TypeError)])
def test_a_bad_rotation_is_refused_with_the_list(bad, error, device):
    qkv, cos, sin = draw(2, 1, 8, torch.bfloat16, 0)
    qkv, cos, sin = qkv.to(device), cos.to(device), sin.to(device)
    before = qkv.clone()
    with pytest.raises(error, match="pairs.*half"):
        fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, rotation=bad, inplace=True)
    assert torch.equal(qkv, before), "a refused call wrote"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_native_rotate_half_is_qwens_path_and_its_launches_are_counted(dtype):
    """native with rotation="half" is Qwen's PyTorch path (14 launches on bf16, 10 on fp32,
    as ``Variant.launches_half`` records) and matches the float64 rotate-half."""
    from rope_kernels.bench.launches import count_launches
    from rope_kernels.variants import VARIANTS

    qkv, cos, sin = draw(3, 2, 8, dtype, new_seed())
    freqs = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))
    native = VARIANTS["native"]
    q, _ = native(qkv[:, 0], qkv[:, 1], freqs, rotation="half")  # warm: cos/sin built once
    ref = rotate_half_f64(qkv[:, 0], cos, sin)
    tol = (1e-5 * ref.abs().max().item() if dtype == torch.float32
           else tolerance(qkv[:, 0], cos, sin, dtype)[0])
    assert (q.double() - ref).abs().max().item() <= tol
    total, per_kernel = count_launches(native, qkv[:, 0], qkv[:, 1], freqs, rotation="half")
    assert total == native.launch_count(dtype, "half") != native.launch_count(dtype), per_kernel


@pytest.mark.parametrize("tile_bytes", [64, 4096], ids=["one_token", "many_tokens"])
@pytest.mark.parametrize("head_dim", [72, 80, 6])
def test_rotate_half_on_strided_heads_and_tiles(tile_bytes, head_dim, device):
    """Heads that are not adjacent (a wider buffer's first D of each head), a head count that
    is not a power of two (the padded heads masked), halves that are not a power of two (36 =
    32 + 4, 40 = 32 + 8, 3 = 2 + 1), one or many tokens a program with a masked tail."""
    from rope_kernels.kernels.fused import rows_launch_config

    seed = new_seed()
    gen = torch.Generator().manual_seed(seed)
    tokens, heads = 5, 3
    wide = torch.randn(tokens, heads, head_dim + 8, generator=gen).to(device)
    xq, xk = wide[..., :head_dim], wide.flip(0)[..., :head_dim]
    angles = torch.rand(tokens, head_dim // 2, generator=gen, dtype=torch.float64) * 40
    cos, sin = angles.cos().float().to(device), angles.sin().float().to(device)
    config = rows_launch_config(heads, head_dim, 4, tile_bytes, rotation="half")
    q, k = fused_qk_rope(xq, xk, cos, sin, rotation="half", config=config)
    for got, x in ((q, xq), (k, xk)):
        ref = rotate_half_f64(x.cpu(), cos.cpu(), sin.cpu())
        assert (got.cpu().double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item(), seed


def test_rotate_half_refuses_the_padded_row_layout(device):
    """``RowsConfig(padded=True)`` tiles a whole row as one block: a pairs layout; rotate-half
    tiles each head's halves, so the config is refused with why, nothing written."""
    from rope_kernels.kernels.fused import rows_launch_config

    xq = torch.randn(2, 2, 8, device=device)
    xk = torch.randn(2, 2, 8, device=device)
    cos, sin = torch.ones(2, 4, device=device), torch.zeros(2, 4, device=device)
    before = xq.clone()
    with pytest.raises(ValueError, match="pairs layout"):
        fused_qk_rope(xq, xk, cos, sin, rotation="half", inplace=True,
                      config=rows_launch_config(2, 8, 4, padded=True))
    assert torch.equal(xq, before)


@pytest.mark.parametrize("head_dim,dtype,pairs_ok,half_ok", [
    (80, torch.bfloat16, True, False),   # Qwen2.5-VL: halves of 40 straddle 16-element vectors
    (72, torch.bfloat16, False, False),  # Kimi / Qwen3-VL: vectors run past the head either way
    (64, torch.bfloat16, True, True), (128, torch.float16, True, True),  # its own kernel
    (96, torch.bfloat16, True, True),    # halves of 48: whole vectors
])
def test_flashinfers_rotate_half_rule_follows_its_kernel(head_dim, dtype, pairs_ok, half_ok):
    """FlashInfer 0.7.4's rotate-half (is_neox) path picks a vector's partner and sign by
    where the vector starts: wrong where a vector straddles the head's middle (head_dim 80
    in bf16), refused with why before anything loads."""
    from rope_kernels.peers.flashinfer import supported_head_dim

    assert supported_head_dim(head_dim, dtype)[0] is pairs_ok
    ok, why = supported_head_dim(head_dim, dtype, "half")
    assert ok is half_ok
    if head_dim == 80:
        assert "rotate-half head_dim 80" in why and "middle of the head" in why
