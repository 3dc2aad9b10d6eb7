"""The towers' 2D rotary frequencies: Kimi-K2.5's (interleaved pairs) and Qwen's
(rotate-half), and Kimi's image-size to patch-grid rule (each tower's rule: ``towers.py``).

With ``C = head_dim`` there are ``C/4`` frequencies ``f_i = theta^(-4i/C)``.
Pair ``2i`` of a token at (row, col) turns by ``col * f_i`` and pair ``2i+1``
by ``row * f_i``: the two axes alternate and share the frequencies. Kimi builds
a 512 x 512 table and an image of ``h x w`` patches (row-major tokens) takes its
first ``h`` rows and ``w`` columns; video frames (``t > 1``) repeat the table.
We compute the same fp32 angles per token, which gives the identical numbers
without materialising the 512 x 512 table.

Qwen2.5-VL and Qwen3-VL (vLLM's ``qwen2_5_vl.py`` / ``qwen3_vl.py``, ``rot_pos_emb``)
use the same ``C/4`` frequencies (``VisionRotaryEmbedding(C/2)``: ``theta^(-2i/(C/2))``)
but lay the ``C/2`` angles out for rotate-half: columns ``[0, C/4)`` turn by
``row * f_i``, columns ``[C/4, C/2)`` by ``col * f_i``, and column j turns the pair
``(x[j], x[j + C/2])``. Their tokens come in 2x2 merge-window order (the merger's
groups), not row-major: ``qwen_patch_coords``. ``tower_freqs_cis`` picks a tower's.
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


def _as_grids(grid_thw, max_side: int | None = MAX_PATCHES_PER_SIDE) -> list[tuple[int, int, int]]:
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
        if max_side is not None and (h > max_side or w > max_side):
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


def qwen_patch_coords(grid_thw, *, merge_size: int = 2, device=None) -> torch.Tensor:
    """Each token's (row, column) in Qwen's order: int32 (tokens, 2). Per image (and
    frame), the 2x2 (``merge_size``) merge windows row-major, each window's patches
    row-major (vLLM's ``rot_pos_emb``: arange reshaped (h/m, m, w/m, m), permuted (0, 2,
    1, 3)). Each side must be a multiple of ``merge_size``."""
    if isinstance(merge_size, bool) or not isinstance(merge_size, int) or merge_size < 1:
        raise ValueError(f"merge_size must be a positive int, got {merge_size!r}")
    rows, cols = [], []
    for t, h, w in _as_grids(grid_thw, max_side=None):
        if h % merge_size or w % merge_size:
            raise ValueError(f"grid ({t}, {h}, {w}): sides must be multiples of merge_size "
                             f"{merge_size} (Qwen merges {merge_size}x{merge_size} patches)")
        m = merge_size
        r = torch.arange(h, device=device)[:, None].expand(h, w)
        c = torch.arange(w, device=device)[None, :].expand(h, w)
        for axis, out in ((r, rows), (c, cols)):
            out.append(axis.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten().repeat(t))
    return torch.stack((torch.cat(rows), torch.cat(cols)), dim=-1).to(torch.int32)


def qwen_vision_freqs_cis(grid_thw, head_dim: int, *, merge_size: int = 2,
                          theta: float = 10000.0, device=None) -> torch.Tensor:
    """Qwen2.5-VL's / Qwen3-VL's 2D rotate-half angles for the given patch grids, as
    complex64 (tokens, head_dim/2): column j < head_dim/4 turns by row * f_j, the rest
    by col * f_(j - head_dim/4), tokens in ``qwen_patch_coords`` order. Pass it with
    ``rotation="half"`` (cos/sin: its real and imaginary views)."""
    freqs = vision_rope_frequencies(head_dim, theta=theta, device=device)
    coords = qwen_patch_coords(grid_thw, merge_size=merge_size, device=device)
    angles = torch.cat((torch.outer(coords[:, 0].float(), freqs),
                        torch.outer(coords[:, 1].float(), freqs)), dim=-1)
    return torch.polar(torch.ones_like(angles), angles)


def tower_freqs_cis(tower, grid_thw, *, device=None) -> torch.Tensor:
    """A tower's (``towers.Tower`` or its name) angles for ``grid_thw``, in the layout of
    its rotation: Kimi's interleaved table or Qwen's rotate-half one."""
    from rope_kernels.towers import get_tower

    tower = get_tower(tower) if isinstance(tower, str) else tower
    if tower.rotation == "pairs":
        return vision_freqs_cis(grid_thw, tower.head_dim, theta=tower.theta, device=device)
    return qwen_vision_freqs_cis(grid_thw, tower.head_dim, merge_size=tower.merge_size,
                                 theta=tower.theta, device=device)
