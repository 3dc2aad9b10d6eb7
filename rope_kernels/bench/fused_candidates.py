"""Launch strategies of the fused q/k rotation, measured beside the default.

``fused_qk_rope`` (``fused.py``) launches one program per ``BLOCK_T`` whole tokens
(every head of q and of k; ``RowsConfig``, ``fused_launch_config``). The candidates
below are kept as separate kernels side by side (as Triton's persistent-matmul
tutorial keeps its variants) so each shows what it buys against it:

- **tiles** (``fused_qk_rope_tiles``): the earlier default. A program owns ``BLOCK_T``
  tokens x ``BLOCK_H`` heads x the whole head_dim, covered by at most two
  power-of-two chunks (72 = 64 + 8); cos/sin of a token are loaded once from the table
  and broadcast over the program's heads. ``TilesConfig``, ``tiles_launch_config``.
- **persistent** (``fused_qk_rope_persistent``): ``programs_per_sm`` x SMs programs
  loop over the same tiles (``tl.range`` with ``num_stages``, so the compiler may
  prefetch the next tile's q/k while this one is rotated and stored). At 87,616 x 16
  x 72 the tiles kernel launches 175,232 programs of 128 threads (the default 87,616);
  a persistent grid pays no per-program start-up and keeps loads in flight across tiles.
- **angles** (``fused_qk_rope_angles``): cos/sin computed in-kernel from each token's
  (row, column) and Kimi's ``head_dim/4`` frequencies instead of read from a table:
  8 bytes a token instead of 288 (fp32 cos and sin at head_dim 72; 3% of the call's
  9504 bytes a token at 16 heads), and no table to build. The angle is the table's
  own fp32 product ``position * f_i`` (``vision_rope_frequencies``), so cos/sin
  differ from the table's only by the sine/cosine implementation.
- **rows** other than the default's: tiles of 1-8 KB (``rows_launch_config``'s
  ``tile_bytes``) and one padded block per row (``RowsConfig.padded``: 16 x 72 = 1152
  -> 2048, tail masked). Compiled for sm_90 (Triton 3.6): q/k and cos|sin in 16-byte
  vectors, no shared memory for the padded block (the default's two-chunk form's
  128-element tail goes one element per thread and through 512 bytes of shared memory
  at 16 x 72). Run through ``fused_qk_rope(..., config=RowsConfig(...))``.
- **cache hints** (``TilesConfig`` / ``RowsConfig`` ``eviction_policy`` and
  ``store_cache_modifier``): q/k are read once and written once, so loads may be
  marked ``evict_first`` and stores streamed (``.cs``) to spare the L2 for what is
  re-read (cos/sin). Measured, not assumed: off by default.

None records autograd (the default's backward runs the default kernel). None is the
default: ``bench.microbench.sweep_fused_configs`` times them beside it, out of place and
(tiles, rows) in place (columns ``strategy``, ``programs_per_sm``, ``in_place``,
``load_eviction_policy``, ``store_cache_modifier``), and the default changes only if
committed measurements say so (``tools/fused_explore.py`` is the quick look).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (check_cos_sin, check_patch_coords, check_qk,
                                         check_triton_device, check_writable_in_place,
                                         mark_written)
from rope_kernels.kernels.fused import (RowsConfig, check_cache_hints, fused_qk_rope,
                                        fused_launch_config, head_dim_chunks, rows_launch_config,
                                        qk_strides, vector_width)

# "rows": fused_qk_rope's own kernel (fused.py) under a given RowsConfig ("rows_padded" in
# the sweep's rows when the row is one padded block); "tiles": fused_qk_rope_tiles, the
# earlier default, under a TilesConfig (with cache hints, or in place).
STRATEGIES = ("tiles", "persistent", "angles", "rows")
CPU_PROGRAMS_PER_SM_UNIT = 2  # the interpreter has no SMs: a persistent grid of 2 x pps

@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_tiles_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,  # in units of VEC elements
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,  # in units of VEC elements
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MAIN: tl.constexpr,  # largest power of two <= HEAD_DIM
    REST: tl.constexpr,  # power of two covering HEAD_DIM - MAIN (0 when none)
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    VEC: tl.constexpr,
    INVERSE: tl.constexpr = False,  # rotate by -angle (the backward pass)
    EVICTION: tl.constexpr = "",  # q/k loads' eviction_policy ("": none; TilesConfig)
    STORE_CACHE: tl.constexpr = "",  # q/k stores' cache_modifier ("": none)
):
    """A program rotates BLOCK_T tokens x BLOCK_H heads of q and of k."""
    N_HEAD_BLOCKS: tl.constexpr = (HEADS + BLOCK_H - 1) // BLOCK_H
    pid = tl.program_id(0)
    head_block = pid % N_HEAD_BLOCKS
    tokens = (pid // N_HEAD_BLOCKS).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    token_ok = tokens < n_tokens
    mask = token_ok[:, None, None] & (heads < HEADS)[None, :, None]
    t3 = tokens[:, None, None]
    h3 = heads[None, :, None]
    q_row = q_ptr + t3 * (q_stride_t * VEC) + h3 * (q_stride_h * VEC)
    k_row = k_ptr + t3 * (k_stride_t * VEC) + h3 * (k_stride_h * VEC)
    qo_row = q_out_ptr + t3 * (qo_stride_t * VEC) + h3 * (qo_stride_h * VEC)
    ko_row = k_out_ptr + t3 * (ko_stride_t * VEC) + h3 * (ko_stride_h * VEC)
    cos_row = cos_ptr + tokens[:, None] * cos_stride_t
    sin_row = sin_ptr + tokens[:, None] * sin_stride_t

    d = tl.arange(0, MAIN)[None, None, :]
    j = tl.arange(0, MAIN // 2)[None, :]
    q = tl.load(q_row + d, mask=mask, other=0.0, eviction_policy=EVICTION)
    k = tl.load(k_row + d, mask=mask, other=0.0, eviction_policy=EVICTION)
    cos = tl.load(cos_row + j * cos_stride_d, mask=token_ok[:, None], other=0.0)
    sin = tl.load(sin_row + j * sin_stride_d, mask=token_ok[:, None], other=0.0)
    if INVERSE:
        sin = -sin
    if REST > 0:
        d2 = MAIN + tl.arange(0, REST)[None, None, :]
        j2 = MAIN // 2 + tl.arange(0, REST // 2)[None, :]
        mask2 = mask & (d2 < HEAD_DIM)
        pair_mask2 = token_ok[:, None] & (j2 < HEAD_DIM // 2)
        q2 = tl.load(q_row + d2, mask=mask2, other=0.0, eviction_policy=EVICTION)
        k2 = tl.load(k_row + d2, mask=mask2, other=0.0, eviction_policy=EVICTION)
        cos2 = tl.load(cos_row + j2 * cos_stride_d, mask=pair_mask2, other=0.0)
        sin2 = tl.load(sin_row + j2 * sin_stride_d, mask=pair_mask2, other=0.0)
        if INVERSE:
            sin2 = -sin2

    out_ty = q_out_ptr.dtype.element_ty
    tl.store(qo_row + d, _rotate_pairs(q, cos, sin, BLOCK_T, BLOCK_H, MAIN).to(out_ty), mask=mask,
             cache_modifier=STORE_CACHE)
    tl.store(ko_row + d, _rotate_pairs(k, cos, sin, BLOCK_T, BLOCK_H, MAIN).to(out_ty), mask=mask,
             cache_modifier=STORE_CACHE)
    if REST > 0:
        tl.store(qo_row + d2, _rotate_pairs(q2, cos2, sin2, BLOCK_T, BLOCK_H, REST).to(out_ty),
                 mask=mask2, cache_modifier=STORE_CACHE)
        tl.store(ko_row + d2, _rotate_pairs(k2, cos2, sin2, BLOCK_T, BLOCK_H, REST).to(out_ty),
                 mask=mask2, cache_modifier=STORE_CACHE)


@triton.jit
def _rotate_pairs(x, cos, sin, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                  WIDTH: tl.constexpr):
    """(x0 + i x1) * (cos + i sin) on every adjacent pair, in fp32."""
    x0, x1 = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_T, BLOCK_H, WIDTH // 2, 2)))
    c = cos[:, None, :]  # one value per (token, pair), broadcast over heads
    s = sin[:, None, :]
    return tl.reshape(tl.join(x0 * c - x1 * s, x0 * s + x1 * c), (BLOCK_T, BLOCK_H, WIDTH))





@triton.jit
def _cos_sin_of(tokens, token_ok, pairs, pair_ok, cos_ptr, sin_ptr, cos_stride_t, cos_stride_d,
                sin_stride_t, sin_stride_d, coords_ptr, freqs_ptr, ANGLES: tl.constexpr):
    """cos/sin (BLOCK_T, n pairs) of the tile's tokens, fp32: read from the table, or
    computed from the token's (row, col): pair 2i turns by col * f_i, 2i+1 by row * f_i."""
    mask = token_ok[:, None] & pair_ok
    if ANGLES:
        row = tl.load(coords_ptr + tokens * 2, mask=token_ok, other=0).to(tl.float32)
        col = tl.load(coords_ptr + tokens * 2 + 1, mask=token_ok, other=0).to(tl.float32)
        f = tl.load(freqs_ptr + pairs // 2, mask=pair_ok, other=0.0)
        angle = tl.where(pairs % 2 == 0, col[:, None], row[:, None]) * f
        c = tl.where(mask, tl.cos(angle), 0.0)
        s = tl.where(mask, tl.sin(angle), 0.0)
    else:
        c = tl.load(cos_ptr + tokens[:, None] * cos_stride_t + pairs * cos_stride_d, mask=mask,
                    other=0.0)
        s = tl.load(sin_ptr + tokens[:, None] * sin_stride_t + pairs * sin_stride_d, mask=mask,
                    other=0.0)
    return c, s


@triton.jit
def _rope_tile(
    tile, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, MAIN: tl.constexpr, REST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr, ANGLES: tl.constexpr,
):
    """One tile of ``fused.py``'s kernel (same layout, loads before stores)."""
    N_HEAD_BLOCKS: tl.constexpr = (HEADS + BLOCK_H - 1) // BLOCK_H
    head_block = tile % N_HEAD_BLOCKS
    # int64 token indices, so row offsets are int64 (the tile id itself fits int32)
    tokens = (tile // N_HEAD_BLOCKS) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    token_ok = tokens < n_tokens
    mask = token_ok[:, None, None] & (heads < HEADS)[None, :, None]
    t3 = tokens[:, None, None]
    h3 = heads[None, :, None]
    q_row = q_ptr + t3 * (q_stride_t * VEC) + h3 * (q_stride_h * VEC)
    k_row = k_ptr + t3 * (k_stride_t * VEC) + h3 * (k_stride_h * VEC)
    qo_row = q_out_ptr + t3 * (qo_stride_t * VEC) + h3 * (qo_stride_h * VEC)
    ko_row = k_out_ptr + t3 * (ko_stride_t * VEC) + h3 * (ko_stride_h * VEC)

    d = tl.arange(0, MAIN)[None, None, :]
    j = tl.arange(0, MAIN // 2)[None, :]
    q = tl.load(q_row + d, mask=mask, other=0.0)
    k = tl.load(k_row + d, mask=mask, other=0.0)
    cos, sin = _cos_sin_of(tokens, token_ok, j, j < MAIN // 2, cos_ptr, sin_ptr, cos_stride_t,
                           cos_stride_d, sin_stride_t, sin_stride_d, coords_ptr, freqs_ptr, ANGLES)
    if REST > 0:
        d2 = MAIN + tl.arange(0, REST)[None, None, :]
        j2 = MAIN // 2 + tl.arange(0, REST // 2)[None, :]
        mask2 = mask & (d2 < HEAD_DIM)
        q2 = tl.load(q_row + d2, mask=mask2, other=0.0)
        k2 = tl.load(k_row + d2, mask=mask2, other=0.0)
        cos2, sin2 = _cos_sin_of(tokens, token_ok, j2, j2 < HEAD_DIM // 2, cos_ptr, sin_ptr,
                                 cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                                 coords_ptr, freqs_ptr, ANGLES)

    out_ty = q_out_ptr.dtype.element_ty
    tl.store(qo_row + d, _rotate_pairs(q, cos, sin, BLOCK_T, BLOCK_H, MAIN).to(out_ty), mask=mask)
    tl.store(ko_row + d, _rotate_pairs(k, cos, sin, BLOCK_T, BLOCK_H, MAIN).to(out_ty), mask=mask)
    if REST > 0:
        tl.store(qo_row + d2, _rotate_pairs(q2, cos2, sin2, BLOCK_T, BLOCK_H, REST).to(out_ty),
                 mask=mask2)
        tl.store(ko_row + d2, _rotate_pairs(k2, cos2, sin2, BLOCK_T, BLOCK_H, REST).to(out_ty),
                 mask=mask2)


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_persistent_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, MAIN: tl.constexpr, REST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """A fixed grid of programs, each looping over tiles pid, pid + grid, ..."""
    N_HEAD_BLOCKS: tl.constexpr = (HEADS + BLOCK_H - 1) // BLOCK_H
    n_tiles = tl.cdiv(n_tokens, BLOCK_T) * N_HEAD_BLOCKS
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        _rope_tile(tile, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, cos_ptr, cos_ptr,
                   n_tokens, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
                   qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
                   cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                   HEADS, HEAD_DIM, MAIN, REST, BLOCK_T, BLOCK_H, VEC, False)


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_angles_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, coords_ptr, freqs_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, MAIN: tl.constexpr, REST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr,
):
    """One program per tile; cos/sin from (row, col) and the frequencies."""
    _rope_tile(tl.program_id(0), q_ptr, k_ptr, q_out_ptr, k_out_ptr, freqs_ptr, freqs_ptr,
               coords_ptr, freqs_ptr, n_tokens, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
               qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h, 0, 0, 0, 0,
               HEADS, HEAD_DIM, MAIN, REST, BLOCK_T, BLOCK_H, VEC, True)


@dataclass(frozen=True)
class TilesConfig:
    """Launch settings of the tiles kernel (see ``tiles_launch_config``)."""

    block_t: int  # tokens per program
    block_h: int  # heads per program
    num_warps: int
    eviction_policy: str = ""  # of the q/k loads, e.g. "evict_first" (LOAD_EVICTION_POLICIES)
    store_cache_modifier: str = ""  # of the q/k stores, e.g. ".cs" (STORE_CACHE_MODIFIERS)

    def __post_init__(self):
        for name in ("block_t", "block_h", "num_warps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"TilesConfig.{name} must be a positive power of two, got {v!r}")
        check_cache_hints("TilesConfig", self.eviction_policy, self.store_cache_modifier)



# Bytes of q (and as many of k) one tiles program moves. Measured on an H200 (bf16,
# CUDA graphs, 7 shapes from 256 x 3 x 128 to 65536 x 16 x 72, block_t x
# block_h x num_warps swept; data/nvidia-h200/fused_configs.csv): the fastest
# tiles held 1-2 KB of q, about one 16-byte vector per thread, i.e. many small
# programs rather than few large ones. How close the rule comes to the fastest
# config per shape: docs/DECISIONS.md ("The tiles kernel's tile rule").
TILE_BYTES = 2048
MAX_BLOCK_H = 16


def tiles_launch_config(heads: int, head_dim: int, element_size: int) -> TilesConfig:
    """The tiles kernel's heuristic (the default's before the rows layout): the same
    config for every token count (so one compile).

    Heads per program: the largest power of two dividing ``heads`` (no masked
    head lanes; at most 16) whose rows fit in ``TILE_BYTES``. Tokens per
    program: the largest power of two that keeps the tile within ``TILE_BYTES``.
    """
    row_bytes = head_dim * element_size
    block_h = min(heads & -heads, MAX_BLOCK_H)
    while block_h > 1 and block_h * row_bytes > TILE_BYTES:
        block_h //= 2
    fit = TILE_BYTES // (block_h * row_bytes)
    block_t = 1 << max(0, fit.bit_length() - 1)
    # 4 warps is 128 threads on NVIDIA and 256 on AMD's 64-wide wavefronts:
    # both valid block sizes.
    return TilesConfig(block_t=block_t, block_h=block_h, num_warps=4)


def tiles_grid(n_tokens: int, heads: int, config: TilesConfig) -> tuple[int]:
    """One-dimensional grid: token blocks x head blocks, flattened."""
    return (triton.cdiv(n_tokens, config.block_t) * triton.cdiv(heads, config.block_h),)


# -- launchers -----------------------------------------------------------------------
def _outputs(xq, xk, inplace: bool, who: str):
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if torch.is_grad_enabled() and (xq.requires_grad or xk.requires_grad):
        raise ValueError(f"{who} records no autograd (a launch candidate); use fused_qk_rope "
                         "or torch.no_grad()")
    if inplace:
        check_writable_in_place(xq, xk)
        mark_written(xq, xk)
        return xq, xk
    q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
    k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
    return q_out, k_out


def _config(xq, config):
    if config is None:
        return tiles_launch_config(xq.shape[1], xq.shape[2], xq.element_size())
    if not isinstance(config, TilesConfig):
        raise TypeError(f"config must be a TilesConfig, got {type(config).__name__}")
    return config


def _prepare(xq, xk, inplace, config, who: str):
    """What every candidate launcher does before its launch: (config, q_out, k_out,
    (main, rest, vec)); the last is None when there is nothing to launch (no tokens or
    heads)."""
    config = _config(xq, config)
    q_out, k_out = _outputs(xq, xk, inplace, who)
    _, heads, head_dim = xq.shape
    if xq.shape[0] == 0 or heads == 0:
        return config, q_out, k_out, None
    check_triton_device(xq, who)
    vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    return config, q_out, k_out, (*head_dim_chunks(head_dim), vec)


def fused_qk_rope_tiles(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, *, inplace: bool = False,
                        config: TilesConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiles kernel: a program per ``config.block_t`` tokens x ``config.block_h``
    heads (``tiles_launch_config`` by default). Same arguments and result as
    ``fused_qk_rope`` (no autograd, no ``out=``)."""
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    config, q_out, k_out, launch = _prepare(xq, xk, inplace, config, "fused_qk_rope_tiles")
    if launch is None:
        return q_out, k_out
    tokens, heads, head_dim = xq.shape
    main, rest, vec = launch
    _fused_qk_rope_tiles_kernel[tiles_grid(tokens, heads, config)](
        xq, xk, q_out, k_out, cos, sin, tokens, *qk_strides(xq, xk, q_out, k_out, vec),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t,
        BLOCK_H=config.block_h, VEC=vec, EVICTION=config.eviction_policy,
        STORE_CACHE=config.store_cache_modifier, num_warps=config.num_warps,
    )
    return q_out, k_out



def sm_count(device) -> int:
    """Streaming multiprocessors (compute units on ROCm) of ``device``; under the CPU
    interpreter a stand-in that still makes a persistent grid loop."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_PROGRAMS_PER_SM_UNIT


def persistent_grid(n_tokens: int, heads: int, config: TilesConfig, programs_per_sm: int,
                    device) -> tuple[int]:
    tiles = triton.cdiv(n_tokens, config.block_t) * triton.cdiv(heads, config.block_h)
    return (max(1, min(tiles, programs_per_sm * sm_count(device))),)


def fused_qk_rope_persistent(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, *, inplace: bool = False,
                             config: TilesConfig | None = None, programs_per_sm: int = 4,
                             num_stages: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_qk_rope`` on a persistent grid: ``programs_per_sm`` x SMs programs, each
    looping over the default's tiles. Same arguments and result as ``fused_qk_rope``
    (no autograd); ``num_stages`` is the loop's software-pipelining depth."""
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    for name, v in (("programs_per_sm", programs_per_sm), ("num_stages", num_stages)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    config, q_out, k_out, launch = _prepare(xq, xk, inplace, config, "fused_qk_rope_persistent")
    if launch is None:
        return q_out, k_out
    tokens, heads, head_dim = xq.shape
    main, rest, vec = launch
    _fused_qk_rope_persistent_kernel[persistent_grid(tokens, heads, config, programs_per_sm,
                                                     xq.device)](
        xq, xk, q_out, k_out, cos, sin, tokens, *qk_strides(xq, xk, q_out, k_out, vec),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t,
        BLOCK_H=config.block_h, VEC=vec, NUM_STAGES=num_stages, num_warps=config.num_warps,
    )
    return q_out, k_out


def _check_coords_freqs(coords, freqs, xq) -> None:
    check_patch_coords(coords, xq, "xq")
    if not isinstance(freqs, torch.Tensor):
        raise TypeError(f"freqs must be a torch.Tensor, got {type(freqs).__name__}")
    if freqs.device != xq.device:
        raise ValueError(f"freqs is on {freqs.device} but xq is on {xq.device}")
    if freqs.dtype != torch.float32 or tuple(freqs.shape) != (xq.shape[2] // 4,) \
            or not freqs.is_contiguous():
        raise ValueError(f"freqs must be a contiguous float32 vector of head_dim/4 = "
                         f"{xq.shape[2] // 4} frequencies, got {freqs.dtype} {tuple(freqs.shape)}")
    if xq.shape[2] % 4:
        raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {xq.shape[2]}")


def fused_qk_rope_angles(xq: torch.Tensor, xk: torch.Tensor, coords: torch.Tensor,
                         freqs: torch.Tensor, *, inplace: bool = False,
                         config: TilesConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi's 2D rotation with the angles computed in the kernel.

    Args:
        xq, xk: (T, H, D) as for ``fused_qk_rope``.
        coords: int32 (T, 2) contiguous, each token's (row, column) in its image's
            patch grid (``vision_patch_coords``).
        freqs: fp32 (D/4,) contiguous, Kimi's frequencies (``vision_rope_frequencies``).
    """
    check_qk(xq, xk)
    _check_coords_freqs(coords, freqs, xq)
    config, q_out, k_out, launch = _prepare(xq, xk, inplace, config, "fused_qk_rope_angles")
    if launch is None:
        return q_out, k_out
    tokens, heads, head_dim = xq.shape
    main, rest, vec = launch
    _fused_qk_rope_angles_kernel[tiles_grid(tokens, heads, config)](
        xq, xk, q_out, k_out, coords, freqs, tokens, *qk_strides(xq, xk, q_out, k_out, vec),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t,
        BLOCK_H=config.block_h, VEC=vec, num_warps=config.num_warps,
    )
    return q_out, k_out


# Tiles (bytes of q a rows program moves) the sweep times beside the default's
# (fused.ROWS_TILE_BYTES).
ROWS_TILE_BYTES_SWEPT = (1024, 2048, 4096, 8192)


# -- what the launch-config sweep times beside the default ---------------------------
@dataclass(frozen=True)
class FusedCandidate:
    """One candidate launch of the fused rotation: a strategy, its settings, and
    whether it writes into q/k (``in_place``) or into new tensors."""

    strategy: str  # one of STRATEGIES
    config: TilesConfig | RowsConfig  # RowsConfig for "rows", TilesConfig for the others
    programs_per_sm: int = 0  # persistent only
    num_stages: int = 2  # persistent only: the tile loop's pipelining depth
    in_place: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        want = RowsConfig if self.strategy == "rows" else TilesConfig
        if not isinstance(self.config, want):
            raise TypeError(f"the {self.strategy} strategy takes a {want.__name__}, "
                            f"got {type(self.config).__name__}")
        if (self.strategy == "persistent") != (self.programs_per_sm > 0):
            raise ValueError("programs_per_sm > 0 goes with the persistent strategy only")
        if not isinstance(self.in_place, bool):
            raise TypeError(f"in_place must be a bool, got {self.in_place!r}")

    @property
    def label(self) -> str:
        """The sweep's ``strategy`` column: the strategy, "rows_padded" for one padded block."""
        padded = self.strategy == "rows" and self.config.padded
        return "rows_padded" if padded else self.strategy

    def __call__(self, xq, xk, cos, sin):
        """Run this candidate on (xq, xk) with cos/sin (not the angles strategy, which
        takes coordinates: ``fused_qk_rope_angles``)."""
        if self.strategy == "rows":
            return fused_qk_rope(xq, xk, cos, sin, inplace=self.in_place, config=self.config)
        if self.strategy == "tiles":
            return fused_qk_rope_tiles(xq, xk, cos, sin, inplace=self.in_place,
                                       config=self.config)
        if self.strategy == "persistent":
            return fused_qk_rope_persistent(xq, xk, cos, sin, inplace=self.in_place,
                                            config=self.config,
                                            programs_per_sm=self.programs_per_sm,
                                            num_stages=self.num_stages)
        raise ValueError("the angles strategy takes coordinates, not cos/sin: "
                         "call fused_qk_rope_angles")


# The hints the sweep tries on the q/k traffic, which is streamed once (read once,
# written once, never re-read by this call): loads evicted first, stores streamed.
SWEPT_HINTS = (("evict_first", ""), ("", ".cs"), ("evict_first", ".cs"))


def fused_candidates(heads: int, head_dim: int, element_size: int) -> list[FusedCandidate]:
    """The candidates the sweep times for one (heads, head_dim), a small grid:

    - rows (the default's kernel, whole tokens per program) at each of
      ``ROWS_TILE_BYTES_SWEPT`` (tiles that round to the same tokens per program once;
      the default's ``ROWS_TILE_BYTES`` among them); the default in place (what
      ``fused_inplace`` launches); padded and both hints (out and in place) at the
      default's tile;
    - tiles (the earlier default) on ``tiles_launch_config``'s tile, plain and with both
      hints, out of place and in place; on that tile a persistent grid of 2, 4 or 8
      programs per SM (and 4 with 8 warps), in-kernel angles with 4 and 8 warps.

    At most 19 candidates a shape (the sweep's time stays within ~1.5x of its time
    before the rows). Single hints (only ``evict_first``, only ``.cs``) are
    ``SWEPT_HINTS``' other members, for a sweep given them as configs.
    """
    d = tiles_launch_config(heads, head_dim, element_size)
    wide = TilesConfig(d.block_t, d.block_h, 8)
    both = SWEPT_HINTS[-1]
    out = ([FusedCandidate("persistent", d, p) for p in (2, 4, 8)]
           + [FusedCandidate("persistent", wide, 4),
              FusedCandidate("angles", d), FusedCandidate("angles", wide),
              FusedCandidate("tiles", d), FusedCandidate("tiles", d, in_place=True)]
           + [FusedCandidate("tiles", TilesConfig(d.block_t, d.block_h, d.num_warps, *both),
                             in_place=p) for p in (False, True)])
    tiles = []
    for tile in ROWS_TILE_BYTES_SWEPT:
        cfg = rows_launch_config(heads, head_dim, element_size, tile)
        if cfg not in tiles:
            tiles.append(cfg)
    rows = fused_launch_config(heads, head_dim, element_size)
    padded = rows_launch_config(heads, head_dim, element_size, padded=True)
    hinted = rows_launch_config(heads, head_dim, element_size, eviction_policy=both[0],
                                store_cache_modifier=both[1])
    out += [FusedCandidate("rows", c) for c in tiles]
    out += [FusedCandidate("rows", rows, in_place=True)]
    out += [FusedCandidate("rows", c, in_place=p) for c in (padded, hinted) for p in (False, True)]
    return out


def sweep_grid(tokens: int) -> list[tuple[int, int, int]]:
    """Patch grids that hold ``tokens`` for timing the angles candidate: 74 x 74
    images (1024x1024) when ``tokens`` is a multiple of 5476, else one image whose
    width is the largest divisor of ``tokens`` up to 512 where that image fits the
    512 x 512 table, else (a prime, say) images 512 patches wide and one row for the rest."""
    if tokens % 5476 == 0:
        return [(1, 74, 74)] * (tokens // 5476)
    width = max(w for w in range(1, min(tokens, 512) + 1) if tokens % w == 0)
    if tokens // width <= 512:
        return [(1, tokens // width, width)]
    rows, rest = divmod(tokens, 512)
    grids = [(1, min(512, rows - r), 512) for r in range(0, rows, 512)]
    return grids + ([(1, 1, rest)] if rest else [])
