"""Launch strategies of the fused q/k rotation, measured beside the default.

``fused_qk_rope`` (``fused.py``) launches one program per tile of ``BLOCK_T`` tokens x
``BLOCK_H`` heads and reads cos/sin from a table. At Kimi's shapes it reaches 80-88% of
the H200's copy ceiling while an SM copy of the same bytes reaches 91-97%
(STUDY_FACTS, "Copy references"); no tile size or warp count in the committed sweep
(``data/nvidia-h200/fused_configs.csv``) closes that gap. Ideas worth a measurement,
kept as separate kernels side by side (as Triton's persistent-matmul tutorial keeps its
variants) so each shows what it buys:

- **persistent** (``fused_qk_rope_persistent``): ``programs_per_sm`` x SMs programs
  loop over the same tiles (``tl.range`` with ``num_stages``, so the compiler may
  prefetch the next tile's q/k while this one is rotated and stored). At 87,616 x 16
  x 72 the default launches 175,232 programs of 128 threads; a persistent grid pays
  no per-program start-up and keeps loads in flight across tiles.
- **angles** (``fused_qk_rope_angles``): cos/sin computed in-kernel from each token's
  (row, column) and Kimi's ``head_dim/4`` frequencies instead of read from a table:
  8 bytes a token instead of 288 (fp32 cos and sin at head_dim 72; 3% of the call's
  9504 bytes a token at 16 heads), and no table to build. The angle is the table's
  own fp32 product ``position * f_i`` (``vision_rope_frequencies``), so cos/sin
  differ from the table's only by the sine/cosine implementation.
- **rows** (``fused_qk_rope_rows``): a program owns ``BLOCK_T`` whole tokens, each
  token's q row and k row (every head: ``heads * head_dim`` contiguous elements in a
  packed qkv, 2304 bytes each at 16 x 72) covered by two power-of-two chunks
  (1152 = 1024 + 128) or one padded block (``RowsConfig.padded``: 2048, tail masked).
  A pair's cos/sin is fetched by its index within its head ((e % head_dim) / 2): every
  head re-reads the token's 36 values from L1. Fetched per element in q's own layout
  and split like q, so the values land in their pairs' registers with no layout
  conversion; from a complex ``freqs_cis`` (cos at even, sin at odd addresses) that is
  one contiguous vector load. Compiled for sm_90 (Triton 3.6): q/k and cos|sin in
  16-byte vectors, no shared memory for the padded block (the two-chunk form's
  128-element tail goes one element per thread and through 512 bytes of shared memory
  at 16 x 72). Tile size (bytes of q a program moves, 1-8 KB) is
  ``rows_launch_config``'s parameter. Switching ``fused_qk_rope`` to it is one line:
  ``fused.DEFAULT_LAYOUT = "rows"``.
- **cache hints** (``FusedConfig`` / ``RowsConfig`` ``eviction_policy`` and
  ``store_cache_modifier``): q/k are read once and written once, so loads may be
  marked ``evict_first`` and stores streamed (``.cs``) to spare the L2 for what is
  re-read (cos/sin). Measured, not assumed: off by default.

None records autograd (the default's backward runs the default kernel). None is the
default: ``bench.microbench.sweep_fused_configs`` times them beside it, out of place and
(grid, rows) in place (columns ``strategy``, ``programs_per_sm``, ``in_place``,
``load_eviction_policy``, ``store_cache_modifier``), and the default changes only if
committed measurements say so (``tools/fused_explore.py`` is the quick look).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (check_cos_sin, check_qk, check_triton_device,
                                         check_writable_in_place)
from rope_kernels.kernels.fused import (FusedConfig, _rotate_pairs, check_cache_hints,
                                        fused_launch_config, head_dim_chunks, vector_width)

# "grid": fused_qk_rope's own kernel (fused.py) under a given FusedConfig (with cache
# hints, or in place); "rows": fused_qk_rope_rows ("rows_padded" in the sweep's rows when
# the row is one padded block).
STRATEGIES = ("grid", "persistent", "angles", "rows")
CPU_PROGRAMS_PER_SM_UNIT = 2  # the interpreter has no SMs: a persistent grid of 2 x pps


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


@triton.jit
def _rotate_row_pairs(x, cos, sin, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr):
    """(x0 + i x1) * (cos + i sin) on every adjacent pair of a (BLOCK_T, WIDTH) block,
    one cos/sin per pair (already gathered per head), in fp32."""
    x0, x1 = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_T, WIDTH // 2, 2)))
    return tl.reshape(tl.join(x0 * cos - x1 * sin, x0 * sin + x1 * cos), (BLOCK_T, WIDTH))


@triton.jit
def _row_offsets(e, stride_h, VEC: tl.constexpr, HEAD_DIM: tl.constexpr,
                 HEADS_ADJACENT: tl.constexpr):
    """Offsets of a token's row elements ``e`` (head-major): ``e`` itself when the
    heads sit next to each other (a packed qkv's q or k), else head * stride + dim."""
    if HEADS_ADJACENT:
        return e
    return (e // HEAD_DIM) * (stride_h * VEC) + e % HEAD_DIM


@triton.jit
def _row_cos_sin(cos_tok, sin_tok, e, mask, cos_stride_d, sin_stride_d,
                 BLOCK_T: tl.constexpr, WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """cos and sin (BLOCK_T, WIDTH/2) of the pairs of row elements ``e``: the pair's
    index within its head is (e % HEAD_DIM) / 2, so every head gathers the token's
    same HEAD_DIM/2 values (L1 hits after the first). Fetched per element in the
    layout of ``e`` and split like q, so cos/sin land in the registers of their
    pairs with no layout conversion. INTERLEAVED: cos/sin are the real and imaginary
    views of a complex freqs_cis ([c0, s0, c1, s1, ...]): one contiguous load."""
    if INTERLEAVED:
        cs = tl.load(cos_tok + e % HEAD_DIM, mask=mask, other=0.0)
        c, s = tl.split(tl.reshape(cs, (BLOCK_T, WIDTH // 2, 2)))
    else:
        j = (e % HEAD_DIM) // 2
        c, _ = tl.split(tl.reshape(tl.load(cos_tok + j * cos_stride_d, mask=mask, other=0.0),
                                   (BLOCK_T, WIDTH // 2, 2)))
        s, _ = tl.split(tl.reshape(tl.load(sin_tok + j * sin_stride_d, mask=mask, other=0.0),
                                   (BLOCK_T, WIDTH // 2, 2)))
    return c, s


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_rows_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,  # in units of VEC elements
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,  # in units of VEC elements
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,  # token strides in CS_VEC units
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    MAIN: tl.constexpr,  # largest power of two <= HEADS * HEAD_DIM (or >= it: one padded block)
    REST: tl.constexpr,  # power of two covering the rest of the row (0 when none)
    BLOCK_T: tl.constexpr, VEC: tl.constexpr,
    CS_VEC: tl.constexpr,  # widest fp32 vector (<= 4) dividing the cos/sin token stride
    HEADS_ADJACENT: tl.constexpr,  # head stride == HEAD_DIM in q, k and both outputs
    INTERLEAVED: tl.constexpr,  # sin is cos + 1 element, both at pair stride 2 (freqs_cis)
    INVERSE: tl.constexpr = False,  # rotate by -angle (the backward pass)
    EVICTION: tl.constexpr = "",  # q/k loads' eviction_policy ("": none)
    STORE_CACHE: tl.constexpr = "",  # q/k stores' cache_modifier ("": none)
):
    """A program rotates BLOCK_T whole tokens: each token's q row and k row (every head)."""
    ROW: tl.constexpr = HEADS * HEAD_DIM
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_ok = (tokens < n_tokens)[:, None]
    t2 = tokens[:, None]
    q_tok = q_ptr + t2 * (q_stride_t * VEC)
    k_tok = k_ptr + t2 * (k_stride_t * VEC)
    qo_tok = q_out_ptr + t2 * (qo_stride_t * VEC)
    ko_tok = k_out_ptr + t2 * (ko_stride_t * VEC)
    cos_tok = cos_ptr + t2 * (cos_stride_t * CS_VEC)
    sin_tok = sin_ptr + t2 * (sin_stride_t * CS_VEC)

    # first chunk: row elements [0, MAIN); past the row only when it is one padded block
    e = tl.arange(0, MAIN)[None, :]
    if MAIN > ROW:
        mask = token_ok & (e < ROW)
    else:
        mask = token_ok
    q = tl.load(q_tok + _row_offsets(e, q_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                mask=mask, other=0.0, eviction_policy=EVICTION)
    k = tl.load(k_tok + _row_offsets(e, k_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                mask=mask, other=0.0, eviction_policy=EVICTION)
    cos, sin = _row_cos_sin(cos_tok, sin_tok, e, mask, cos_stride_d, sin_stride_d,
                            BLOCK_T, MAIN, HEAD_DIM, INTERLEAVED)
    if INVERSE:
        sin = -sin
    if REST > 0:
        e2 = MAIN + tl.arange(0, REST)[None, :]
        mask2 = token_ok & (e2 < ROW)
        q2 = tl.load(q_tok + _row_offsets(e2, q_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                     mask=mask2, other=0.0, eviction_policy=EVICTION)
        k2 = tl.load(k_tok + _row_offsets(e2, k_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                     mask=mask2, other=0.0, eviction_policy=EVICTION)
        cos2, sin2 = _row_cos_sin(cos_tok, sin_tok, e2, mask2, cos_stride_d, sin_stride_d,
                                  BLOCK_T, REST, HEAD_DIM, INTERLEAVED)
        if INVERSE:
            sin2 = -sin2

    out_ty = q_out_ptr.dtype.element_ty
    tl.store(qo_tok + _row_offsets(e, qo_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
             _rotate_row_pairs(q, cos, sin, BLOCK_T, MAIN).to(out_ty), mask=mask,
             cache_modifier=STORE_CACHE)
    tl.store(ko_tok + _row_offsets(e, ko_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
             _rotate_row_pairs(k, cos, sin, BLOCK_T, MAIN).to(out_ty), mask=mask,
             cache_modifier=STORE_CACHE)
    if REST > 0:
        tl.store(qo_tok + _row_offsets(e2, qo_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                 _rotate_row_pairs(q2, cos2, sin2, BLOCK_T, REST).to(out_ty), mask=mask2,
                 cache_modifier=STORE_CACHE)
        tl.store(ko_tok + _row_offsets(e2, ko_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                 _rotate_row_pairs(k2, cos2, sin2, BLOCK_T, REST).to(out_ty), mask=mask2,
                 cache_modifier=STORE_CACHE)


# -- launchers -----------------------------------------------------------------------
def _outputs(xq, xk, inplace: bool, who: str):
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if torch.is_grad_enabled() and (xq.requires_grad or xk.requires_grad):
        raise ValueError(f"{who} records no autograd (a launch candidate); use fused_qk_rope "
                         "or torch.no_grad()")
    if inplace:
        check_writable_in_place(xq, xk)
        return xq, xk
    q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
    k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
    return q_out, k_out


def _config(xq, config):
    if config is None:
        return fused_launch_config(xq.shape[1], xq.shape[2], xq.element_size())
    if not isinstance(config, FusedConfig):
        raise TypeError(f"config must be a FusedConfig, got {type(config).__name__}")
    return config


def _strides(xq, xk, q_out, k_out, vec):
    return (xq.stride(0) // vec, xq.stride(1) // vec, xk.stride(0) // vec, xk.stride(1) // vec,
            q_out.stride(0) // vec, q_out.stride(1) // vec,
            k_out.stride(0) // vec, k_out.stride(1) // vec)


def sm_count(device) -> int:
    """Streaming multiprocessors (compute units on ROCm) of ``device``; under the CPU
    interpreter a stand-in that still makes a persistent grid loop."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_PROGRAMS_PER_SM_UNIT


def persistent_grid(n_tokens: int, heads: int, config: FusedConfig, programs_per_sm: int,
                    device) -> tuple[int]:
    tiles = triton.cdiv(n_tokens, config.block_t) * triton.cdiv(heads, config.block_h)
    return (max(1, min(tiles, programs_per_sm * sm_count(device))),)


def fused_qk_rope_persistent(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, *, inplace: bool = False,
                             config: FusedConfig | None = None, programs_per_sm: int = 4,
                             num_stages: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_qk_rope`` on a persistent grid: ``programs_per_sm`` x SMs programs, each
    looping over the default's tiles. Same arguments and result as ``fused_qk_rope``
    (no autograd); ``num_stages`` is the loop's software-pipelining depth."""
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    for name, v in (("programs_per_sm", programs_per_sm), ("num_stages", num_stages)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    config = _config(xq, config)
    q_out, k_out = _outputs(xq, xk, inplace, "fused_qk_rope_persistent")
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return q_out, k_out
    check_triton_device(xq, "fused_qk_rope_persistent")
    main, rest = head_dim_chunks(head_dim)
    vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    _fused_qk_rope_persistent_kernel[persistent_grid(tokens, heads, config, programs_per_sm,
                                                     xq.device)](
        xq, xk, q_out, k_out, cos, sin, tokens, *_strides(xq, xk, q_out, k_out, vec),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t,
        BLOCK_H=config.block_h, VEC=vec, NUM_STAGES=num_stages, num_warps=config.num_warps,
    )
    return q_out, k_out


def _check_coords_freqs(coords, freqs, xq) -> None:
    for name, t in (("coords", coords), ("freqs", freqs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != xq.device:
            raise ValueError(f"{name} is on {t.device} but xq is on {xq.device}")
    if coords.dtype != torch.int32:
        raise TypeError(f"coords must be int32 (row, column) pairs, got {coords.dtype}")
    if tuple(coords.shape) != (xq.shape[0], 2) or not coords.is_contiguous():
        raise ValueError(f"coords must be contiguous with shape (tokens, 2) = ({xq.shape[0]}, 2), "
                         f"got {tuple(coords.shape)}")
    if freqs.dtype != torch.float32 or tuple(freqs.shape) != (xq.shape[2] // 4,) \
            or not freqs.is_contiguous():
        raise ValueError(f"freqs must be a contiguous float32 vector of head_dim/4 = "
                         f"{xq.shape[2] // 4} frequencies, got {freqs.dtype} {tuple(freqs.shape)}")
    if xq.shape[2] % 4:
        raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {xq.shape[2]}")


def fused_qk_rope_angles(xq: torch.Tensor, xk: torch.Tensor, coords: torch.Tensor,
                         freqs: torch.Tensor, *, inplace: bool = False,
                         config: FusedConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi's 2D rotation with the angles computed in the kernel.

    Args:
        xq, xk: (T, H, D) as for ``fused_qk_rope``.
        coords: int32 (T, 2) contiguous, each token's (row, column) in its image's
            patch grid (``vision_patch_coords``).
        freqs: fp32 (D/4,) contiguous, Kimi's frequencies (``vision_rope_frequencies``).
    """
    check_qk(xq, xk)
    _check_coords_freqs(coords, freqs, xq)
    config = _config(xq, config)
    q_out, k_out = _outputs(xq, xk, inplace, "fused_qk_rope_angles")
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return q_out, k_out
    check_triton_device(xq, "fused_qk_rope_angles")
    main, rest = head_dim_chunks(head_dim)
    vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    grid = (triton.cdiv(tokens, config.block_t) * triton.cdiv(heads, config.block_h),)
    _fused_qk_rope_angles_kernel[grid](
        xq, xk, q_out, k_out, coords, freqs, tokens, *_strides(xq, xk, q_out, k_out, vec),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t,
        BLOCK_H=config.block_h, VEC=vec, num_warps=config.num_warps,
    )
    return q_out, k_out


# -- whole-token rows ----------------------------------------------------------------
# Bytes of q (and as many of k) one rows program moves by default; rows_launch_config
# rounds down to whole tokens (at least one). The sweep times 1, 2, 4 and 8 KB.
ROWS_TILE_BYTES = 2048
ROWS_TILE_BYTES_SWEPT = (1024, 2048, 4096, 8192)
ROWS_MAX_WARPS = 8


@dataclass(frozen=True)
class RowsConfig:
    """Launch settings of the rows candidate: whole tokens per program, warps, and the
    q/k cache hints (as ``FusedConfig``'s)."""

    block_t: int  # whole tokens (every head of q and of k) per program
    num_warps: int
    eviction_policy: str = ""
    store_cache_modifier: str = ""
    padded: bool = False  # the row as one power-of-two block (masked tail), not two chunks

    def __post_init__(self):
        for name in ("block_t", "num_warps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"RowsConfig.{name} must be a positive power of two, got {v!r}")
        if not isinstance(self.padded, bool):
            raise TypeError(f"RowsConfig.padded must be a bool, got {self.padded!r}")
        check_cache_hints("RowsConfig", self.eviction_policy, self.store_cache_modifier)


def row_chunks(heads: int, head_dim: int, padded: bool = False) -> tuple[int, int]:
    """(MAIN, REST) covering a token's ``heads * head_dim`` row: two power-of-two chunks
    (16 x 72 = 1152 -> 1024 + 128), or one padded block (1152 -> 2048, 0)."""
    row = heads * head_dim
    return (1 << (row - 1).bit_length(), 0) if padded else head_dim_chunks(row)


def rows_launch_config(heads: int, head_dim: int, element_size: int,
                       tile_bytes: int = ROWS_TILE_BYTES, *, eviction_policy: str = "",
                       store_cache_modifier: str = "", padded: bool = False) -> RowsConfig:
    """Tokens per program: the largest power of two whose q rows fit ``tile_bytes``
    (at least one token). Warps: about one 16-byte vector of the row's first
    power-of-two chunk per thread (no thread holds a copy of another's data), 1-8."""
    for name, v in (("heads", heads), ("head_dim", head_dim), ("element_size", element_size),
                    ("tile_bytes", tile_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    row_bytes = heads * head_dim * element_size
    block_t = 1 << max(0, (tile_bytes // row_bytes).bit_length() - 1)
    main, _ = row_chunks(heads, head_dim, padded)
    if padded:  # the vectors that hold data
        main = heads * head_dim
    vectors = block_t * main * element_size // 16
    warps = 1 << max(0, (vectors // 32).bit_length() - 1)
    return RowsConfig(block_t, min(max(warps, 1), ROWS_MAX_WARPS), eviction_policy,
                      store_cache_modifier, padded)


def launch_rows(xq, xk, q_out, k_out, cos, sin, config: RowsConfig | None, *,
                inverse: bool = False) -> None:
    """Launch the rows kernel on checked tensors (``fused_qk_rope_rows``; also
    ``fused_qk_rope``'s launch when ``fused.DEFAULT_LAYOUT`` is "rows")."""
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return
    check_triton_device(xq, "fused_qk_rope_rows")
    if config is None:
        config = rows_launch_config(heads, head_dim, xq.element_size())
    main, rest = row_chunks(heads, head_dim, config.padded)
    vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    adjacent = heads == 1 or all(t.stride(1) == head_dim for t in (xq, xk, q_out, k_out))
    interleaved = (sin.data_ptr() == cos.data_ptr() + 4 and cos.stride() == sin.stride()
                   and cos.stride(1) == 2)
    cs_vec = 4
    while cs_vec > 1 and (cos.stride(0) % cs_vec or sin.stride(0) % cs_vec
                          or cos.data_ptr() % (4 * cs_vec)):
        cs_vec //= 2
    _fused_qk_rope_rows_kernel[(triton.cdiv(tokens, config.block_t),)](
        xq, xk, q_out, k_out, cos, sin, tokens, *_strides(xq, xk, q_out, k_out, vec),
        cos.stride(0) // cs_vec, cos.stride(1), sin.stride(0) // cs_vec, sin.stride(1),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t, VEC=vec,
        CS_VEC=cs_vec, HEADS_ADJACENT=adjacent, INTERLEAVED=interleaved, INVERSE=inverse, EVICTION=config.eviction_policy,
        STORE_CACHE=config.store_cache_modifier, num_warps=config.num_warps,
    )


def fused_qk_rope_rows(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, *, inplace: bool = False,
                       config: RowsConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_qk_rope`` with a program per ``config.block_t`` whole tokens (every head
    of q and of k; ``rows_launch_config`` by default). Same arguments and result as
    ``fused_qk_rope`` (no autograd)."""
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    if config is not None and not isinstance(config, RowsConfig):
        raise TypeError(f"config must be a RowsConfig, got {type(config).__name__}")
    q_out, k_out = _outputs(xq, xk, inplace, "fused_qk_rope_rows")
    launch_rows(xq, xk, q_out, k_out, cos, sin, config)
    return q_out, k_out


# -- what the launch-config sweep times beside the default ---------------------------
@dataclass(frozen=True)
class FusedCandidate:
    """One candidate launch of the fused rotation: a strategy, its settings, and
    whether it writes into q/k (``in_place``) or into new tensors."""

    strategy: str  # one of STRATEGIES
    config: FusedConfig | RowsConfig  # RowsConfig for "rows", FusedConfig for the others
    programs_per_sm: int = 0  # persistent only
    num_stages: int = 2  # persistent only: the tile loop's pipelining depth
    in_place: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        want = RowsConfig if self.strategy == "rows" else FusedConfig
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
        from rope_kernels.kernels.fused import fused_qk_rope

        if self.strategy == "grid":
            return fused_qk_rope(xq, xk, cos, sin, inplace=self.in_place, config=self.config)
        if self.strategy == "rows":
            return fused_qk_rope_rows(xq, xk, cos, sin, inplace=self.in_place,
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

    - on the default's tile (``fused_launch_config``): a persistent grid of 2, 4 or 8
      programs per SM (and 4 with 8 warps), in-kernel angles with 4 and 8 warps;
      the default in place (what ``fused_inplace`` launches); each of ``SWEPT_HINTS``,
      and both hints in place;
    - rows (whole tokens per program) at each of ``ROWS_TILE_BYTES_SWEPT`` (tiles that
      round to the same tokens per program once); in place, padded (out and in
      place) and both hints (out and in place) at ``ROWS_TILE_BYTES``.
    """
    d = fused_launch_config(heads, head_dim, element_size)
    wide = FusedConfig(d.block_t, d.block_h, 8)
    both = SWEPT_HINTS[-1]
    out = ([FusedCandidate("persistent", d, p) for p in (2, 4, 8)]
           + [FusedCandidate("persistent", wide, 4),
              FusedCandidate("angles", d), FusedCandidate("angles", wide),
              FusedCandidate("grid", d, in_place=True)]
           + [FusedCandidate("grid", FusedConfig(d.block_t, d.block_h, d.num_warps, *h))
              for h in SWEPT_HINTS]
           + [FusedCandidate("grid", FusedConfig(d.block_t, d.block_h, d.num_warps, *both),
                             in_place=True)])
    tiles = []
    for tile in ROWS_TILE_BYTES_SWEPT:
        cfg = rows_launch_config(heads, head_dim, element_size, tile)
        if cfg not in tiles:
            tiles.append(cfg)
    rows = rows_launch_config(heads, head_dim, element_size)
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
    width is the largest divisor of ``tokens`` up to 512."""
    if tokens % 5476 == 0:
        return [(1, 74, 74)] * (tokens // 5476)
    width = max(w for w in range(1, min(tokens, 512) + 1) if tokens % w == 0)
    return [(1, tokens // width, width)]
