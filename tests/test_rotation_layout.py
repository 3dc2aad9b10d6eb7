"""Rotate-half as pairs (``rotation_layout``): a tower's attention output is the same when its
q/k projection rows are interleaved and a pairs rotation is used, in float64 against the
rotate-half form written here; without the reordering it is not (a negative control); our
fused kernel's pairs path on the reordered q/k gives its rotate-half path's q/k reordered."""

import math

import pytest
import torch

from rope_kernels.correctness import new_seed
from rope_kernels.kernels.fused import fused_qk_rope
from rope_kernels.kernels.reference import rope_reference
from rope_kernels.rotation_layout import (half_to_pairs_order, interleave_qk_projection,
                                          pairs_to_half)


def attention(x, w, b, freqs_cis, heads, head_dim, rotation):
    """One attention layer's core in float64: qkv projection, RoPE on q and k, softmax(q k^T /
    sqrt(D)) v per head over all tokens."""
    qkv = (x @ w.T + b).view(x.shape[0], 3, heads, head_dim)
    q, k = rope_reference(qkv[:, 0], qkv[:, 1], freqs_cis, rotation)
    v = qkv[:, 2]
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(head_dim)
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v), q, k


@pytest.mark.parametrize("heads,head_dim", [(3, 8), (2, 72), (1, 80)])
def test_a_rotate_half_layer_runs_as_pairs_on_interleaved_rows(heads, head_dim):
    seed = new_seed()
    gen = torch.Generator().manual_seed(seed)
    tokens, hidden = 11, 24
    x = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
    w = torch.randn(3 * heads * head_dim, hidden, generator=gen, dtype=torch.float64) / hidden ** 0.5
    b = torch.randn(3 * heads * head_dim, generator=gen, dtype=torch.float64)
    angles = torch.rand(tokens, head_dim // 2, generator=gen, dtype=torch.float64) * 20
    freqs_cis = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)

    want, q_half, k_half = attention(x, w, b, freqs_cis, heads, head_dim, "half")
    w2, b2 = interleave_qk_projection(w, b, heads, head_dim)
    got, q_pairs, k_pairs = attention(x, w2, b2, freqs_cis, heads, head_dim, "pairs")
    assert torch.allclose(got, want, rtol=0, atol=1e-12), seed
    assert torch.allclose(pairs_to_half(q_pairs), q_half, rtol=0, atol=1e-12), seed
    assert torch.allclose(pairs_to_half(k_pairs), k_half, rtol=0, atol=1e-12), seed
    assert torch.equal(w2[2 * heads * head_dim:], w[2 * heads * head_dim:])  # v untouched
    # negative control: a pairs rotation on the model's own rows is another layer
    other, _, _ = attention(x, w, b, freqs_cis, heads, head_dim, "pairs")
    assert (other - want).abs().max().item() > 1e-3, seed


def test_the_fused_kernels_pairs_path_on_interleaved_q_k_is_its_rotate_half_path(device):
    """Our kernel: rotation="pairs" on q/k in the interleaved order equals rotation="half" on
    the model's order, reordered (fp32 math on bf16 data: the same products, one rounding)."""
    seed = new_seed()
    gen = torch.Generator().manual_seed(seed)
    tokens, heads, head_dim = 5, 3, 72
    qkv = torch.randn(tokens, 3, heads, head_dim, generator=gen).to(torch.bfloat16).to(device)
    angles = torch.rand(tokens, head_dim // 2, generator=gen, dtype=torch.float64) * 20
    cos, sin = angles.cos().float().to(device), angles.sin().float().to(device)
    order = half_to_pairs_order(head_dim).to(device)
    q_half, k_half = fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, rotation="half")
    q_pairs, k_pairs = fused_qk_rope(qkv[:, 0][..., order].contiguous(),
                                     qkv[:, 1][..., order].contiguous(), cos, sin)
    for half, pairs in ((q_half, q_pairs), (k_half, k_pairs)):
        diff = (pairs_to_half(pairs).float() - half.float()).abs().max().item()
        assert diff <= 2 ** -7 * half.float().abs().max().item(), (seed, diff)


def test_bad_shapes_are_refused_with_what_was_expected():
    w = torch.zeros(3 * 2 * 8, 4)
    with pytest.raises(ValueError, match=r"w_qkv must be a \(48, hidden\)"):
        interleave_qk_projection(w[:40], None, 2, 8)
    with pytest.raises(ValueError, match=r"b_qkv must be None or a \(48,\)"):
        interleave_qk_projection(w, torch.zeros(7), 2, 8)
    with pytest.raises(ValueError, match="head_dim must be even"):
        half_to_pairs_order(7)
    assert half_to_pairs_order(6).tolist() == [0, 3, 1, 4, 2, 5]
