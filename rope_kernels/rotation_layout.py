"""Rotate-half as pairs: one fixed reordering of each q and k head's columns.

A rotate-half (NeoX, Qwen) head pairs x[j] with x[j + D/2] and turns the pair by angle j.
Interleaving the halves (new column 2j <- old j, new 2j + 1 <- old j + D/2) makes those the
adjacent pairs (x[2j], x[2j + 1]) that a pairs (interleaved, Kimi) kernel turns, by the same
angle j: the same cos/sin table (T, D/2). Attention reads q and k only through the per-head
dot products q . k, which one reordering of a head's columns applied to both leaves unchanged;
v is not reordered. So a rotate-half tower can run a pairs kernel (ours, or an engine's) once
the rows of its q and k projection (weight and bias) are reordered when the checkpoint is
loaded: the attention output is the same (``tests/test_rotation_layout.py``, float64); q and
k themselves come out reordered (``pairs_to_half`` puts them back where something else reads
them).

What this does not say: how fast a tower runs that way (the pairs kernel's rows time Kimi's
16 x 72, the shape of Qwen3-VL's heads, with Kimi's freqs_cis layout), nor that an engine
loads its weights so.
"""

from __future__ import annotations

import torch

from rope_kernels.kernels.checks import check_positive_int


def half_to_pairs_order(head_dim: int) -> torch.Tensor:
    """Column order (int64, D) that interleaves a head's halves: [0, D/2, 1, D/2 + 1, ...]."""
    check_positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (pairs of columns), got {head_dim}")
    half = head_dim // 2
    return torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).reshape(-1)


def interleave_qk_projection(w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, heads: int,
                             head_dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New (weight, bias) of a packed qkv projection (3 * heads * head_dim rows, q then k then
    v, each head-major as ``nn.Linear`` holds Qwen's fused qkv) with every q and k head's rows
    in ``half_to_pairs_order``; v's rows as they were. The inputs are not modified."""
    check_positive_int("heads", heads)
    order = half_to_pairs_order(head_dim)
    rows = 3 * heads * head_dim
    if not isinstance(w_qkv, torch.Tensor) or w_qkv.dim() != 2 or w_qkv.shape[0] != rows:
        raise ValueError(f"w_qkv must be a ({rows}, hidden) tensor for {heads} heads x {head_dim}, "
                         f"got {tuple(w_qkv.shape) if isinstance(w_qkv, torch.Tensor) else type(w_qkv).__name__}")
    if b_qkv is not None and (not isinstance(b_qkv, torch.Tensor) or tuple(b_qkv.shape) != (rows,)):
        raise ValueError(f"b_qkv must be None or a ({rows},) tensor, got "
                         f"{tuple(b_qkv.shape) if isinstance(b_qkv, torch.Tensor) else type(b_qkv).__name__}")
    index = torch.arange(rows).view(3, heads, head_dim)
    index[:2] = index[:2, :, order.to(index.device)]
    index = index.reshape(-1).to(w_qkv.device)
    return w_qkv.index_select(0, index), None if b_qkv is None else b_qkv.index_select(0, index.to(b_qkv.device))


def pairs_to_half(x: torch.Tensor) -> torch.Tensor:
    """A (..., D) tensor whose last dimension is in ``half_to_pairs_order`` back in the
    model's own (rotate-half) order."""
    order = half_to_pairs_order(x.shape[-1]).to(x.device)
    out = torch.empty_like(x)
    out[..., order] = x
    return out
