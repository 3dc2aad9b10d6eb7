"""Rotate-half (Qwen: x[j] with x[j + D/2]) in the QKV projection's epilogue
(``qkv_rope(..., rotation="half")``, ``qkv_gemm.qkv_rope_linear(..., rotation="half")``).

CPU tier under the Triton interpreter, at tiny shapes the study does not use (3 heads of
8, 12 and 72, hidden 32, 5 tokens), tiles that cut heads anywhere: against a float64
reference written here (x W^T + b, then the textbook rotate-half on q and k, v as it is).
"""

import pytest
import torch

from rope_kernels.correctness import lowp_tolerance, new_seed
from rope_kernels.kernels.qkv_gemm import (AMD_HALF_CONFIG, NVIDIA_HALF_CONFIG, QKVGemmConfig,
                                           qkv_rope_linear)
from rope_kernels.kernels.reference import cos_sin_views, native_rope
from rope_kernels.qkv import qkv_rope, qkv_rope_operands, resolve_backend

TOKENS, HEADS, HIDDEN = 5, 3, 32
# 16-column tiles stored in 8-column parts: heads of 8, 12 and 72 columns start anywhere
# in a tile and a part, and a rotate-half partner is in another part or another tile
SMALL = QKVGemmConfig(block_m=16, block_n=16, block_k=16, group_m=1, num_stages=1,
                      epilogue_parts=2)


def draw(head_dim, dtype, *, seed=None):
    """x, W, b (random normal) and freqs_cis (random angles), fresh for every check."""
    gen = torch.Generator().manual_seed(new_seed() if seed is None else seed)
    n = 3 * HEADS * head_dim
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(dtype)
    w = (torch.randn(n, HIDDEN, generator=gen) / HIDDEN ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    angles = torch.rand(TOKENS, head_dim // 2, generator=gen, dtype=torch.float64) * 40 - 20
    freqs_cis = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)
    return x, w, b, freqs_cis


def reference_half(x, w, b, freqs_cis, head_dim):
    """float64 packed (T, 3, H, D): x W^T + b, q and k rotated half against half."""
    y = (x.double() @ w.double().T + b.double()).view(TOKENS, 3, HEADS, head_dim)
    cos = freqs_cis.real.double()[:, None, :]
    sin = freqs_cis.imag.double()[:, None, :]
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    out = y.clone()
    for i in (0, 1):
        x1, x2 = y[:, i, :, :head_dim // 2], y[:, i, :, head_dim // 2:]
        out[:, i] = y[:, i] * cos + torch.cat((-x2, x1), -1) * sin
    return out


def tolerance(x, w, b, freqs_cis, ref, head_dim):
    """``lowp_tolerance`` of the native path (F.linear, then Qwen's PyTorch rotate-half)."""
    lin = torch.nn.functional.linear(x, w, b).view(TOKENS, 3, HEADS, head_dim)
    nq, nk = native_rope(lin[:, 0], lin[:, 1], freqs_cis, rotation="half")
    native = torch.stack((nq, nk, lin[:, 2]), 1)
    native_err = (native.double() - ref).abs().max().item()
    return lowp_tolerance(native_err, ref.abs().max().item(), x.dtype)


def _err(out, ref):
    return (out.double() - ref).abs().max().item()


@pytest.mark.parametrize("config", [None, SMALL, NVIDIA_HALF_CONFIG, AMD_HALF_CONFIG],
                         ids=["default", "16-col-tiles", "nvidia-half", "amd-half"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [8, 12, 72])
def test_rotate_half_matches_float64(head_dim, dtype, config):
    x, w, b, freqs_cis = draw(head_dim, dtype)
    ref = reference_half(x, w, b, freqs_cis, head_dim)
    tol = tolerance(x, w, b, freqs_cis, ref, head_dim)
    for cos, sin in (cos_sin_views(freqs_cis),  # the interleaved table gather
                     (freqs_cis.real.contiguous(), freqs_cis.imag.contiguous())):
        out = qkv_rope_linear(x, w, b, cos, sin, heads=HEADS, config=config, rotation="half")
        assert out.shape == (TOKENS, 3, HEADS, head_dim)
        assert _err(out, ref) <= tol, (head_dim, dtype, _err(out, ref), tol)
    # negative control: the pairs rotation of the same inputs is not rotate-half
    pairs = qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), heads=HEADS, config=config)
    assert _err(pairs[:, :2], ref[:, :2]) > 10 * tol
    assert torch.equal(pairs[:, 2], out[:, 2])  # v is not rotated either way


def test_rotate_half_is_pairs_on_the_interleaved_weight():
    """Tight: "half" equals "pairs" run on W's (and b's) q and k rows interleaved
    (2j <- j, 2j+1 <- j + D/2), its q and k columns put back, to fp32 rounding of one
    bf16 output (the same products, the same fp32 rotation)."""
    head_dim = 12
    x, w, b, freqs_cis = draw(head_dim, torch.bfloat16)
    half = head_dim // 2
    within = torch.arange(head_dim).view(2, half).T.reshape(-1)  # [0, 6, 1, 7, ...]
    qk = (torch.arange(2 * HEADS)[:, None] * head_dim + within[None, :]).reshape(-1)
    perm = torch.cat((qk, torch.arange(2 * HEADS * head_dim, 3 * HEADS * head_dim)))
    pairs = qkv_rope_linear(x, w[perm].contiguous(), b[perm], *cos_sin_views(freqs_cis),
                            heads=HEADS, config=SMALL)
    back = torch.empty_like(pairs).view(TOKENS, -1)
    back[:, perm] = pairs.view(TOKENS, -1)
    out = qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), heads=HEADS, config=SMALL,
                          rotation="half")
    diff = (out.float() - back.view_as(out).float()).abs()
    ulp = torch.finfo(torch.bfloat16).eps * out.float().abs().clamp_min(1e-3)
    assert (diff <= ulp).all(), diff.max()


def test_entry_point_half_reads_weights_at_every_call():
    """``qkv_rope(..., rotation="half")``: auto resolves to triton_table, the operands built
    for it; an in-place update of W and b between calls is seen (nothing cached)."""
    head_dim = 8
    x, w, b, freqs_cis = draw(head_dim, torch.bfloat16)
    coords = torch.zeros(TOKENS, 2, dtype=torch.int32)
    assert resolve_backend("auto", torch.device("cpu"), "half") == "triton_table"
    ops = qkv_rope_operands(coords, heads=HEADS, head_dim=head_dim, freqs_cis=freqs_cis,
                            rotation="half")
    assert ops.cos is not None
    first = qkv_rope(x, w, b, ops, heads=HEADS, head_dim=head_dim, rotation="half")
    assert torch.equal(first, qkv_rope_linear(x, w, b, ops.cos, ops.sin, heads=HEADS,
                                              rotation="half"))
    ref = reference_half(x, w, b, freqs_cis, head_dim)
    assert _err(first, ref) <= tolerance(x, w, b, freqs_cis, ref, head_dim)
    with torch.no_grad():
        w.mul_(-1.5).add_(0.25)
        b.add_(1.0)
    second = qkv_rope(x, w, b, ops, heads=HEADS, head_dim=head_dim, rotation="half")
    ref2 = reference_half(x, w, b, freqs_cis, head_dim)
    assert _err(second, ref2) <= tolerance(x, w, b, freqs_cis, ref2, head_dim)
    assert _err(second, ref) > 0.5


def test_bad_rotation_and_pairs_only_backends_are_refused():
    head_dim = 8
    x, w, b, freqs_cis = draw(head_dim, torch.bfloat16, seed=1)
    coords = torch.zeros(TOKENS, 2, dtype=torch.int32)
    ops = qkv_rope_operands(coords, heads=HEADS, head_dim=head_dim, freqs_cis=freqs_cis,
                            backend="triton_table")
    with pytest.raises(ValueError, match="unknown rotation 'neox'; known: pairs, half"):
        qkv_rope(x, w, b, ops, heads=HEADS, head_dim=head_dim, backend="triton_table",
                 rotation="neox")
    with pytest.raises(TypeError, match="rotation must be a string"):
        qkv_rope_linear(x, w, b, ops.cos, ops.sin, heads=HEADS, rotation=None)
    for backend in ("triton", "cute", "quack"):
        with pytest.raises(ValueError, match=f"backend '{backend}' rotates Kimi's interleaved "
                                             "pairs only"):
            qkv_rope(x, w, b, coords, heads=HEADS, head_dim=head_dim, backend=backend,
                     rotation="half")
        with pytest.raises(ValueError, match="pairs only"):
            qkv_rope_operands(coords, heads=HEADS, head_dim=head_dim, backend=backend,
                              rotation="half")
    with pytest.raises(ValueError, match="TMA boxes cannot"):
        qkv_rope_linear(x, w, b, ops.cos, ops.sin, heads=HEADS, rotation="half",
                        config=QKVGemmConfig(block_m=16, block_n=16, block_k=16,
                                             num_stages=1, use_tma=True))


def test_correctness_sweep_checks_the_triton_mode_in_rotate_half(monkeypatch):
    """Notebook 01's correctness rows (rotations pairs and half): the Triton QKV mode is
    checked in rotate-half against float64 (through 'triton_table'), the CuTe one says it
    is pairs-only; the half check can fail (the pairs rotation in its place fails it)."""
    import rope_kernels.qkv as qkv
    from rope_kernels.bench.correctness_sweep import encoder_mode_rows

    shape = [[7, 2, 72]]
    rows = encoder_mode_rows("gemm_epilogue", [torch.bfloat16], shape, device="cpu",
                             rotations=("pairs", "half"))
    assert [r["rotation"] for r in rows] == ["pairs", "half"]
    for r in rows:
        assert r["supported"] and r["passed"] and r["inputs_intact"], r
        assert 0 < r["max_abs_err"] <= r["tolerance"]
    assert "triton_table" in rows[1]["reason"]
    [cute] = encoder_mode_rows("gemm_epilogue_cute", [torch.bfloat16], shape, device="cpu",
                               rotations=("half",))
    assert not cute["supported"] and "pairs only" in cute["reason"]
    real = qkv.qkv_rope
    monkeypatch.setattr(qkv, "qkv_rope", lambda *a, **kw: real(*a, **{**kw, "rotation": "pairs"}))
    [wrong] = encoder_mode_rows("gemm_epilogue", [torch.bfloat16], shape, device="cpu",
                                rotations=("half",))
    assert wrong["supported"] and not wrong["passed"] and wrong["max_abs_err"] > wrong["tolerance"]
