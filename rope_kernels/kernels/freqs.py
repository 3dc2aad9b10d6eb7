"""Kimi-K2.5's 2D rotary frequencies and its image-size to patch-grid rule.

With ``C = head_dim`` there are ``C/4`` frequencies ``f_i = theta^(-4i/C)``.
Pair ``2i`` of a token at (row, col) turns by ``col * f_i`` and pair ``2i+1``
by ``row * f_i``: the two axes alternate and share the frequencies. Kimi builds
a 512 x 512 table and an image of ``h x w`` patches (row-major tokens) takes its
first ``h`` rows and ``w`` columns; video frames (``t > 1``) repeat the table.
We compute the same fp32 angles per token, which gives the identical numbers
without materialising the 512 x 512 table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

# The resize rule and its constants need no torch; they live with the names the
# notebook specs check parameters against (re-exported here).
from rope_kernels.vocabulary import (  # noqa: F401
    IN_PATCH_LIMIT,
    MAX_PATCHES_PER_SIDE,
    MERGE_SIZE,
    PATCH_SIZE,
    image_patch_grid,
    parse_resolution,
)


def _as_grids(grid_thw) -> list[tuple[int, int, int]]:
    if isinstance(grid_thw, torch.Tensor):
        if grid_thw.dim() != 2 or grid_thw.shape[-1] != 3:
            raise ValueError(
                f"grid_thw tensor must have shape (images, 3), got {tuple(grid_thw.shape)}"
            )
        if grid_thw.is_floating_point() or grid_thw.is_complex():
            raise TypeError(f"grid_thw must hold integers, got dtype {grid_thw.dtype}")
        grid_thw = grid_thw.tolist()
    if not isinstance(grid_thw, Iterable) or isinstance(grid_thw, (str, bytes)):
        raise TypeError("grid_thw must be a sequence of (t, h, w) patch grids")
    grids = []
    for entry in grid_thw:
        if not isinstance(entry, Sequence) or len(entry) != 3:
            raise ValueError(f"each grid must be a (t, h, w) triple, got {entry!r}")
        for axis, value in zip("thw", entry):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"grid entry {axis} must be an int, got {value!r} in {entry!r}")
            if value <= 0:
                raise ValueError(f"grid entry {axis} must be positive, got {value} in {entry!r}")
        t, h, w = entry
        if h > MAX_PATCHES_PER_SIDE or w > MAX_PATCHES_PER_SIDE:
            raise ValueError(
                f"grid {tuple(entry)} exceeds {MAX_PATCHES_PER_SIDE} patches a side "
                "(the size of Kimi's RoPE table)"
            )
        grids.append((t, h, w))
    if not grids:
        raise ValueError("grid_thw is empty: give at least one (t, h, w) patch grid")
    return grids


def grid_tokens(grid_thw) -> int:
    """Number of vision tokens (before the 2x2 merge) of a list of (t, h, w) grids."""
    return sum(t * h * w for t, h, w in _as_grids(grid_thw))


def vision_rope_frequencies(head_dim: int, *, theta: float = 10000.0, device=None) -> torch.Tensor:
    """Kimi's ``head_dim/4`` fp32 frequencies ``theta^(-4i/head_dim)``, computed in
    the same order of operations as Kimi's table (kernels that compute angles
    in-kernel read these, so their angles match the table's bit for bit)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(f"head_dim must be an int, got {head_dim!r}")
    if head_dim <= 0 or head_dim % 4 != 0:
        raise ValueError(
            f"head_dim must be a positive multiple of 4 for 2D RoPE, got {head_dim}"
        )
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 0:
        raise ValueError(f"theta must be a positive number, got {theta!r}")
    dim_range = torch.arange(0, head_dim, 4, device=device)[: head_dim // 4].float()
    return 1.0 / (theta ** (dim_range / head_dim))


def vision_patch_coords(grid_thw, *, device=None) -> torch.Tensor:
    """Each vision token's (row, column) in its image's patch grid: int32 (tokens, 2).

    Tokens are row-major per image, images (and video frames) one after another,
    the order ``vision_freqs_cis`` uses."""
    rows, cols = [], []
    for t, h, w in _as_grids(grid_thw):
        r = torch.arange(h, device=device).repeat_interleave(w)
        c = torch.arange(w, device=device).repeat(h)
        rows.append(r.repeat(t))
        cols.append(c.repeat(t))
    return torch.stack((torch.cat(rows), torch.cat(cols)), dim=-1).to(torch.int32)


def vision_freqs_cis(
    grid_thw, head_dim: int, *, theta: float = 10000.0, device=None
) -> torch.Tensor:
    """Kimi's 2D RoPE table for the given patch grids: complex64 (tokens, head_dim/2)."""
    _as_grids(grid_thw)  # grid errors first
    # fp32 throughout, in the same order of operations as Kimi's table.
    freqs = vision_rope_frequencies(head_dim, theta=theta, device=device)
    coords = vision_patch_coords(grid_thw, device=device)
    row = coords[:, 0].float()
    col = coords[:, 1].float()
    x_angle = torch.outer(col, freqs)
    y_angle = torch.outer(row, freqs)
    x_cis = torch.polar(torch.ones_like(x_angle), x_angle)
    y_cis = torch.polar(torch.ones_like(y_angle), y_angle)
    # interleave: pair 2i <- column angle, pair 2i+1 <- row angle
    return torch.stack((x_cis, y_cis), dim=-1).reshape(row.numel(), head_dim // 2)
