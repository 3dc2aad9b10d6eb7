"""RoPE for free: the QKV projection rotates q and k in its epilogue (portable Triton).

``qkv = rope(x @ W^T + b)`` in one Triton kernel: a GEMM whose output tile is rotated
in fp32 registers before it is written, so q and k never travel through memory
unrotated (the standalone RoPE kernel reads and writes them again). It runs wherever
Triton does (NVIDIA, AMD, the CPU interpreter); on Hopper our CuTe DSL kernel
(``qkv_cute.py``) is faster, and ``qkv.qkv_rope`` picks between them.

The file in named pieces, like Triton's persistent-matmul tutorial:

1. **Layout.** None: W is read as ``nn.Linear`` stores it. An N tile is ``block_n``
   consecutive columns of the packed output row (3H x D, across head boundaries);
   Kimi's pairs are adjacent columns (2j, 2j+1), so a pair never straddles a tile and
   splitting it off is free in registers. Rows of W past 3HD (the last tile of a
   shape that does not fill it) load as zeros and their columns are not stored.
   **Rotate-half** (Qwen: x[j] with x[j + D/2], ``rotation="half"``): the partner is D/2
   columns away (36 or 40 at Qwen's 72 and 80), mostly in another part of the tile or
   another tile, for any block_n, since tiles are powers of two and heads are not. It is
   the pairs rotation up to a fixed permutation of each q and k head's columns, so the
   kernel composes one more function, ``COLUMNS``, the tile's column map:
   ``_rotate_half_columns`` makes tile column ``h*D + 2j + r`` W's row (and the bias
   entry, and the output column) ``h*D + j + r*D/2``; ``_same_columns`` (pairs) is the
   identity. The tile then holds each rotate-half pair in two adjacent columns, in the
   same store, at every tile/head alignment, the pairs epilogue rotates it unchanged
   (cos/sin column j is pair j's angle either way), and the store writes the model's own
   layout. W is gathered as it is read (no permuted copy, nothing cached per weight), with
   pointer loads and stores: TMA boxes cannot gather rows or scatter columns.
2. **Loads and stores** (``_load_x``, ``_load_w``, ``_store_cols``): the only code that
   differs between TMA descriptors (Hopper and newer, and the interpreter) and masked
   pointers (AMD, pre-Hopper, strides TMA cannot take).
3. **Mainloop** (``_mainloop``): the K loop, fp32 accumulator.
4. **Epilogues**, composed: bias on the whole tile, then the tile in
   ``epilogue_parts`` stores of contiguous columns, each first passed through the
   kernel's ``ROTATION`` function: ``_rope_table`` (cos/sin from the table),
   ``_rope_angles`` (from each token's patch (row, column) and Kimi's frequencies,
   computed in-kernel) or ``_no_rotation`` (the plain projection: the mainloop's
   share, for benchmarks). v's columns pass through the rotation unchanged.
5. **Kernels**, side by side: ``_qkv_rope_kernel`` (one program per tile) and
   ``_qkv_rope_kernel_persistent`` (``programs_per_sm`` programs per SM striding over
   the tiles; the tile loop flattened with the K loop so the next tile's loads overlap
   this tile's epilogue). Both call ``_qkv_tile``.
6. **Launch settings** (``QKVGemmConfig``, ``qkv_gemm_config``: one default per path,
   chosen from the committed sweep) and **launchers** (``qkv_rope_linear``: table;
   ``qkv_rope_linear_angles``: angles in-kernel; ``qkv_linear_unrotated``: the same
   kernel with ``_no_rotation``, benchmarks only); models call them through
   ``qkv.qkv_rope``, the one entry point. How the layout, configs and dead ends were decided is in
   ``docs/DECISIONS.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (check_no_autograd, check_patch_coords,
                                         check_positive_int, check_qkv_operands, check_qkv_out,
                                         check_rotation, check_triton_device)
from rope_kernels.kernels.switches import triton_interpreter_enabled
from rope_kernels.kernels.fused import cos_sin_vector, interleaved_cos_sin

# --------------------------------------------------------------------------
# 2. Loads and stores: the only TMA / pointer difference
# --------------------------------------------------------------------------


@triton.jit
def _load_x(x, m0, k0, n_tokens, x_stride_t, HIDDEN: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr):
    """x[m0:m0+BLOCK_M, k0:k0+BLOCK_K], zeros past the tokens and past HIDDEN."""
    if USE_TMA:
        a = x.load([m0, k0])
    else:
        rows = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x + rows[:, None] * x_stride_t + ks[None, :],
                    mask=(rows < n_tokens)[:, None] & (ks < HIDDEN)[None, :], other=0.0)
    return a


@triton.jit
def _load_w(w, n0, k0, w_stride_n, N_COLS: tl.constexpr, HIDDEN: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr,
            COLUMNS: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """W[n0:n0+BLOCK_N, k0:k0+BLOCK_K], zeros past its N_COLS rows and past HIDDEN (the
    descriptor's bounds do the same); tile row n is W's row ``COLUMNS(n)`` (pointers only:
    the launcher uses TMA for ``_same_columns`` alone)."""
    if USE_TMA:
        b = w.load([n0, k0])
    else:
        rows = n0 + tl.arange(0, BLOCK_N).to(tl.int64)
        ks = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(w + COLUMNS(rows, HEADS, HEAD_DIM)[:, None] * w_stride_n + ks[None, :],
                    mask=(rows < N_COLS)[:, None] & (ks < HIDDEN)[None, :], other=0.0)
    return b


@triton.jit
def _store_cols(out, y, m0, col0, n_tokens, out_stride_t, N_COLS: tl.constexpr,
                BLOCK_M: tl.constexpr, COLS: tl.constexpr, USE_TMA: tl.constexpr,
                COLUMNS: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """y (BLOCK_M, COLS) to out[m0:, col0:] of the (T, 3H x D) output, clipped to the
    tokens and the row."""
    if USE_TMA:
        out.store([m0, col0], y.to(out.dtype))
    else:
        tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        cols = col0 + tl.arange(0, COLS)
        mask = (tokens < n_tokens)[:, None] & (cols < N_COLS)[None, :]
        tl.store(out + tokens[:, None] * out_stride_t
                 + COLUMNS(cols, HEADS, HEAD_DIM)[None, :],
                 y.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _same_columns(n, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The tile's columns are the output's (and W's rows): the pairs layout."""
    return n


@triton.jit
def _rotate_half_columns(n, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rotate-half: q's and k's tile column ``h*D + 2j + r`` is the model's column
    ``h*D + j + r*D/2`` (pair j's two members adjacent in the tile); v's columns and
    those past the row map to themselves."""
    i = n % HEAD_DIM
    moved = n - i + i // 2 + (i % 2) * (HEAD_DIM // 2)
    return tl.where(n < 2 * HEADS * HEAD_DIM, moved, n)


# --------------------------------------------------------------------------
# 3. Mainloop
# --------------------------------------------------------------------------


@triton.jit
def _dot(a, b, acc, INTERPRETED: tl.constexpr):
    """acc + a @ b^T. Triton 3.6's interpreter multiplies bf16 blocks as raw
    uint16 bits; there the exact fp32 values are multiplied instead (bf16 and
    fp16 products are exact in fp32, so the result is the GPU's)."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32).T, acc, input_precision="ieee")
    return tl.dot(a, b.T, acc)


@triton.jit
def _mainloop(x, w, m0, n0, n_tokens, x_stride_t, w_stride_n, N_COLS: tl.constexpr,
              HIDDEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, INTERPRETED: tl.constexpr,
              COLUMNS: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """fp32 (BLOCK_M, BLOCK_N) = x tile @ W tile^T over all of HIDDEN."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(HIDDEN, BLOCK_K)):
        a = _load_x(x, m0, ki * BLOCK_K, n_tokens, x_stride_t, HIDDEN, BLOCK_M, BLOCK_K, USE_TMA)
        b = _load_w(w, n0, ki * BLOCK_K, w_stride_n, N_COLS, HIDDEN, BLOCK_N, BLOCK_K, USE_TMA,
                    COLUMNS, HEADS, HEAD_DIM)
        acc = _dot(a, b, acc, INTERPRETED)
    return acc


# --------------------------------------------------------------------------
# 4. Epilogues: bias, then a rotation per part of the tile, then the store
# --------------------------------------------------------------------------


@triton.jit
def _cos_sin_of(turns, FAST: tl.constexpr):
    """cos and sin of fp32 angles given in turns (radians / 2pi: the callers scale
    the tile's frequencies, one vector, instead of every angle). The angle is first
    reduced to [-1/2, 1/2] turn (``turns`` minus its nearest integer: Kimi's angles
    reach ~12 turns at 16 x 1024x1024, the reduction adds at most ~1e-6 turn), then
    FAST (CUDA): the SFU's ``cos.approx.ftz``/``sin.approx.ftz`` of the reduced angle
    in radians (abs error ~5e-7 on [-pi, pi]; the nearest integer is one
    ``cvt.rni``); else ``tl.cos``/``tl.sin`` (libdevice or the interpreter's numpy)."""
    if FAST:
        nearest = tl.inline_asm_elementwise("cvt.rni.f32.f32 $0, $1;", "=r,r", [turns],
                                            dtype=tl.float32, is_pure=True, pack=1)
        reduced = (turns - nearest) * 6.283185307179586
        c = tl.inline_asm_elementwise("cos.approx.ftz.f32 $0, $1;", "=r,r", [reduced],
                                      dtype=tl.float32, is_pure=True, pack=1)
        s = tl.inline_asm_elementwise("sin.approx.ftz.f32 $0, $1;", "=r,r", [reduced],
                                      dtype=tl.float32, is_pure=True, pack=1)
    else:
        reduced = (turns - tl.floor(turns + 0.5)) * 6.283185307179586
        c = tl.cos(reduced)
        s = tl.sin(reduced)
    return c, s


@triton.jit
def _rotate_pairs(x0, x1, c, s, col0, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, COLS: tl.constexpr):
    """The pairs (x0 even, x1 odd members) of COLS consecutive columns from col0 turned by
    (c, s), each (BLOCK_M, COLS/2), where the pair is q's or k's (v's pass through), joined
    back into the columns' interleaved order."""
    pairs = col0 // 2 + tl.arange(0, COLS // 2)
    on = (pairs < 2 * HEADS * (HEAD_DIM // 2))[None, :]
    y0 = tl.where(on, x0 * c - x1 * s, x0)
    y1 = tl.where(on, x0 * s + x1 * c, x1)
    return tl.reshape(tl.join(y0, y1), (BLOCK_M, COLS))


@triton.jit
def _rope_table(x, col0, m0, n_tokens, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
                cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                COLS: tl.constexpr, FAST: tl.constexpr, INTERLEAVED: tl.constexpr,
                CS_VEC: tl.constexpr):
    """Rotation with cos/sin from the (T, D/2) tables. INTERLEAVED (cos and sin are a
    complex freqs_cis's views, [c0, s0, c1, s1, ...]): the columns' cos/sin in one
    contiguous gather in the tile's own layout, column n's entry at ``n % D``: in
    vectors of CS_VEC floats (``cos_stride_t`` is in units of CS_VEC; CS_VEC divides D,
    col0 and COLS: the launcher's ``cos_sin_vector``). Else one gather per table."""
    tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    x0, x1 = tl.split(tl.reshape(x, (BLOCK_M, COLS // 2, 2)))
    if INTERLEAVED:
        offsets = (col0 + tl.arange(0, COLS)) % HEAD_DIM
        if CS_VEC > 1:
            offsets = tl.max_contiguous(tl.multiple_of(offsets, CS_VEC), CS_VEC)
        cs = tl.load(cos_ptr + tokens[:, None] * (cos_stride_t * CS_VEC) + offsets[None, :],
                     mask=(tokens < n_tokens)[:, None], other=0.0)
        c, s = tl.split(tl.reshape(cs, (BLOCK_M, COLS // 2, 2)))
    else:
        pairs = col0 // 2 + tl.arange(0, COLS // 2)
        mask = (tokens < n_tokens)[:, None] & (pairs < 3 * HEADS * (HEAD_DIM // 2))[None, :]
        j = pairs % (HEAD_DIM // 2)
        c = tl.load(cos_ptr + tokens[:, None] * cos_stride_t + j[None, :] * cos_stride_d,
                    mask=mask, other=1.0)
        s = tl.load(sin_ptr + tokens[:, None] * sin_stride_t + j[None, :] * sin_stride_d,
                    mask=mask, other=0.0)
    return _rotate_pairs(x0, x1, c, s, col0, HEADS, HEAD_DIM, BLOCK_M, COLS)


@triton.jit
def _rope_angles(x, col0, m0, n_tokens, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
                 cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                 HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                 COLS: tl.constexpr, FAST: tl.constexpr, INTERLEAVED: tl.constexpr,
                 CS_VEC: tl.constexpr):
    """Rotation with the angles computed in-kernel: Kimi's pair 2i of a head turns by
    column * f_i, pair 2i+1 by row * f_i (one fp32 multiply), in turns; FAST: the SFU's
    cos/sin (CUDA), else ``tl.cos``/``tl.sin``."""
    tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    x0, x1 = tl.split(tl.reshape(x, (BLOCK_M, COLS // 2, 2)))
    token_ok = tokens < n_tokens
    pairs = col0 // 2 + tl.arange(0, COLS // 2)
    j = pairs % (HEAD_DIM // 2)
    row = tl.load(coords_ptr + tokens * 2, mask=token_ok, other=0).to(tl.float32)
    col = tl.load(coords_ptr + tokens * 2 + 1, mask=token_ok, other=0).to(tl.float32)
    f = tl.load(freqs_ptr + j // 2, mask=pairs < 3 * HEADS * (HEAD_DIM // 2),
                other=0.0) * 0.15915494309189535
    pos = tl.where((j % 2 == 0)[None, :], col[:, None], row[:, None])
    c, s = _cos_sin_of(pos * f[None, :], FAST)
    return _rotate_pairs(x0, x1, c, s, col0, HEADS, HEAD_DIM, BLOCK_M, COLS)


@triton.jit
def _no_rotation(x, col0, m0, n_tokens, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
                 cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                 HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                 COLS: tl.constexpr, FAST: tl.constexpr, INTERLEAVED: tl.constexpr,
                 CS_VEC: tl.constexpr):
    """The plain projection: columns as they are (benchmarks: the mainloop's share)."""
    return x


@triton.jit
def _col_halves(x, BLOCK_M: tl.constexpr, COLS: tl.constexpr):
    """x (BLOCK_M, COLS) as its two halves of contiguous columns."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, COLS // 2)), (0, 2, 1)))


@triton.jit
def _epilogue_parts(x, col0, out, m0, n_tokens, out_stride_t, cos_ptr, sin_ptr, coords_ptr,
                    freqs_ptr, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    COLS: tl.constexpr, STORE_COLS: tl.constexpr, ROTATION: tl.constexpr,
                    FAST: tl.constexpr, INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr,
                    USE_TMA: tl.constexpr, COLUMNS: tl.constexpr):
    """COLS columns from col0, rotated and stored STORE_COLS at a time, in column order
    (halves, recursively): fewer registers live at once."""
    if COLS == STORE_COLS:
        y = ROTATION(x, col0, m0, n_tokens, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
                     cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HEADS, HEAD_DIM,
                     BLOCK_M, COLS, FAST, INTERLEAVED, CS_VEC)
        _store_cols(out, y, m0, col0, n_tokens, out_stride_t, 3 * HEADS * HEAD_DIM, BLOCK_M,
                    COLS, USE_TMA, COLUMNS, HEADS, HEAD_DIM)
    else:
        xa, xb = _col_halves(x, BLOCK_M, COLS)
        _epilogue_parts(xa, col0, out, m0, n_tokens, out_stride_t, cos_ptr, sin_ptr,
                        coords_ptr, freqs_ptr, cos_stride_t, cos_stride_d, sin_stride_t,
                        sin_stride_d, HEADS, HEAD_DIM, BLOCK_M, COLS // 2, STORE_COLS,
                        ROTATION, FAST, INTERLEAVED, CS_VEC, USE_TMA, COLUMNS)
        _epilogue_parts(xb, col0 + COLS // 2, out, m0, n_tokens, out_stride_t, cos_ptr,
                        sin_ptr, coords_ptr, freqs_ptr, cos_stride_t, cos_stride_d,
                        sin_stride_t, sin_stride_d, HEADS, HEAD_DIM, BLOCK_M, COLS // 2,
                        STORE_COLS, ROTATION, FAST, INTERLEAVED, CS_VEC, USE_TMA, COLUMNS)


# --------------------------------------------------------------------------
# 5. Kernels: one program per tile, and persistent
# --------------------------------------------------------------------------


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share their x rows in L2 while
    every N tile visits them (GROUP_M=1: all N tiles of one row tile first)."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_group) % size_m
    pid_n = (tile_id % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def _qkv_tile(
    tile_id, x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, n_tokens,
    x_stride_t, w_stride_n, out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t,
    sin_stride_d, HIDDEN: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ROTATION: tl.constexpr,
    FAST: tl.constexpr, EPILOGUE_PARTS: tl.constexpr, USE_TMA: tl.constexpr,
    INTERPRETED: tl.constexpr, INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr,
    COLUMNS: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) output tile: mainloop, bias, then the epilogue's parts."""
    N_COLS: tl.constexpr = 3 * HEADS * HEAD_DIM
    N_TILES: tl.constexpr = (N_COLS + BLOCK_N - 1) // BLOCK_N
    pid_m, pid_n = _tile_coords(tile_id, tl.cdiv(n_tokens, BLOCK_M), N_TILES, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    acc = _mainloop(x, w, m0, n0, n_tokens, x_stride_t, w_stride_n, N_COLS, HIDDEN, BLOCK_M,
                    BLOCK_N, BLOCK_K, USE_TMA, INTERPRETED, COLUMNS, HEADS, HEAD_DIM)
    if HAS_BIAS:  # fp32, zero-padded to whole tiles by the launcher (COLUMNS keeps the pad)
        acc += tl.load(bias_ptr + COLUMNS(n0 + tl.arange(0, BLOCK_N), HEADS, HEAD_DIM))[None, :]
    _epilogue_parts(acc, n0, out, m0, n_tokens, out_stride_t, cos_ptr, sin_ptr, coords_ptr,
                    freqs_ptr, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HEADS,
                    HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_N // EPILOGUE_PARTS, ROTATION, FAST,
                    INTERLEAVED, CS_VEC, USE_TMA, COLUMNS)


@triton.jit(do_not_specialize=["n_tokens"])
def _qkv_rope_kernel(
    x, w, out,  # TMA descriptors when USE_TMA, else pointers
    bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens,
    x_stride_t, w_stride_n, out_stride_t,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,  # cos_stride_t: CS_VEC units
    HIDDEN: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr,
    ROTATION: tl.constexpr,  # _rope_table, _rope_angles or _no_rotation
    FAST: tl.constexpr, EPILOGUE_PARTS: tl.constexpr, USE_TMA: tl.constexpr,
    INTERPRETED: tl.constexpr, INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr,
    COLUMNS: tl.constexpr,  # _same_columns (pairs) or _rotate_half_columns
):
    """One program per output tile."""
    _qkv_tile(tl.program_id(0), x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
              n_tokens, x_stride_t, w_stride_n, out_stride_t, cos_stride_t, cos_stride_d,
              sin_stride_t, sin_stride_d, HIDDEN, HEADS, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_K,
              GROUP_M, HAS_BIAS, ROTATION, FAST, EPILOGUE_PARTS, USE_TMA, INTERPRETED,
              INTERLEAVED, CS_VEC, COLUMNS)


@triton.jit(do_not_specialize=["n_tokens", "num_programs"])
def _qkv_rope_kernel_persistent(
    x, w, out,
    bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens, num_programs,
    x_stride_t, w_stride_n, out_stride_t,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HIDDEN: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ROTATION: tl.constexpr,
    FAST: tl.constexpr, EPILOGUE_PARTS: tl.constexpr, USE_TMA: tl.constexpr,
    INTERPRETED: tl.constexpr, INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr,
    COLUMNS: tl.constexpr,
):
    """``num_programs`` programs stride over the tiles; the tile loop is flattened
    with the K loop, so the next tile's loads overlap this epilogue."""
    num_tiles = tl.cdiv(n_tokens, BLOCK_M) * tl.cdiv(3 * HEADS * HEAD_DIM, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=True):
        _qkv_tile(tile_id, x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
                  n_tokens, x_stride_t, w_stride_n, out_stride_t, cos_stride_t, cos_stride_d,
                  sin_stride_t, sin_stride_d, HIDDEN, HEADS, HEAD_DIM, BLOCK_M, BLOCK_N,
                  BLOCK_K, GROUP_M, HAS_BIAS, ROTATION, FAST, EPILOGUE_PARTS, USE_TMA,
                  INTERPRETED, INTERLEAVED, CS_VEC, COLUMNS)


# --------------------------------------------------------------------------
# 6. Launch settings
# --------------------------------------------------------------------------


def _check_power_of_two(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a positive power of two, got {value!r}")


@dataclass(frozen=True)
class QKVGemmConfig:
    """Launch settings of the Triton QKV kernel (``qkv_gemm_config`` picks them).

    ``persistent``: ``programs_per_sm`` programs per SM striding over the tiles (2 lets
    one program's epilogue run under the other's mainloop where registers and shared
    memory hold two; not checked: a config that cannot hold two runs them in turn), else
    one program per tile. ``epilogue_parts``: the tile is rotated and stored in this many
    parts of contiguous columns (1: whole)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_stages: int = 3
    num_warps: int = 4
    persistent: bool = False
    programs_per_sm: int = 1
    epilogue_parts: int = 1
    use_tma: bool | None = None  # None: TMA where the GPU and the strides allow it

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k", "group_m", "num_warps", "epilogue_parts"):
            _check_power_of_two(f"QKVGemmConfig.{name}", getattr(self, name))
        if min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError("QKVGemmConfig block_m, block_n and block_k must be at least 16 "
                             "(the smallest tensor-core tile)")
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) \
                or self.num_stages < 1:
            raise ValueError(f"QKVGemmConfig.num_stages must be a positive int, "
                             f"got {self.num_stages!r}")
        if not isinstance(self.persistent, bool):
            raise TypeError(f"QKVGemmConfig.persistent must be a bool, "
                            f"got {type(self.persistent).__name__}")
        if self.epilogue_parts > 8 or self.block_n // self.epilogue_parts < 2:
            raise ValueError(f"QKVGemmConfig.epilogue_parts must be 1, 2, 4 or 8 and leave whole "
                             f"pairs in each part of block_n={self.block_n}, "
                             f"got {self.epilogue_parts}")
        if isinstance(self.programs_per_sm, bool) or not isinstance(self.programs_per_sm, int) \
                or not 1 <= self.programs_per_sm <= 4:
            raise ValueError(f"QKVGemmConfig.programs_per_sm must be an int in 1..4, "
                             f"got {self.programs_per_sm!r}")
        if self.programs_per_sm > 1 and not self.persistent:
            raise ValueError("QKVGemmConfig.programs_per_sm > 1 is for the persistent grid "
                             "(persistent=True); one program per tile needs none")
        if self.use_tma is not None and not isinstance(self.use_tma, bool):
            raise TypeError("QKVGemmConfig.use_tma must be a bool or None")

    @property
    def store_columns(self) -> int:
        """Contiguous columns of one store (a part of the tile)."""
        return self.block_n // self.epilogue_parts

    @property
    def kernel_name(self) -> str:
        """The name of the Triton kernel this config launches (in this module)."""
        return "_qkv_rope_kernel_persistent" if self.persistent else "_qkv_rope_kernel"

    @property
    def label(self) -> str:
        """How result rows name a config: ``BMxBNxBKx1/stages/warps/group_m`` plus
        ``/persistent``, ``/x<programs per SM>``, ``/subtile<parts>`` (``/subtile``: 8),
        ``/flat``, ``/tma`` or ``/pointers`` (the spelling of the committed rows, whose
        configs had a heads-per-tile field, 1 for this layout, and named it ``flat``)."""
        parts = self.epilogue_parts
        flags = [f for f, on in (("persistent", self.persistent),
                                 (f"x{self.programs_per_sm}", self.programs_per_sm > 1),
                                 ("subtile" + ("" if parts == 8 else str(parts)), parts > 1),
                                 ("flat", True),
                                 ("tma", self.use_tma is True),
                                 ("pointers", self.use_tma is False)) if on]
        return "/".join([f"{self.block_m}x{self.block_n}x{self.block_k}x1",
                         str(self.num_stages), str(self.num_warps), str(self.group_m), *flags])


# The NVIDIA defaults, one per path: the fastest of notebook 05's candidates in the
# committed sweep (data/exploration/nvidia-h200/qkv_gemm_sweep.csv, H200, Kimi 1152 -> 3 x 16 x 72,
# bf16, cold, CUDA graphs) at 43,808 and 87,616 tokens, near the fastest at 21,904:
# - table: one program per tile, 128x128x64, 4 warps, the epilogue whole;
# - angles: persistent, two programs per SM, the epilogue in eighths, group_m 16.
# Their times and the runners-up: docs/DECISIONS.md ("one default per path").
NVIDIA_TABLE_CONFIG = QKVGemmConfig()
NVIDIA_ANGLES_CONFIG = QKVGemmConfig(group_m=16, persistent=True, programs_per_sm=2,
                                     epilogue_parts=8)
# rotate-half (the table with ``_rotate_half_columns``): pointer loads and stores, and 8 warps:
# the column map's addresses on top of the pointer path's spill at 4 warps at sm_90
# (``compile_matrix``), not at 8; not timed yet
NVIDIA_HALF_CONFIG = QKVGemmConfig(num_warps=8, use_tma=False)
# AMD's rotate-half: 64-column tiles. At 128 columns (the pairs' AMD config) the reordered
# columns' index math spills registers on gfx942 (compiled here: data/compile/compile_matrix.csv,
# rows qkv_gemm_half_amd); 64 columns compile without a spill on gfx942 and gfx90a. Not timed
# on an AMD GPU.
AMD_HALF_CONFIG = QKVGemmConfig(block_n=64, num_stages=2, num_warps=8)


def qkv_gemm_config(heads: int, head_dim: int, device: torch.device,
                    element_size: int = 2, *, angles: bool = False,
                    amd: bool | None = None, rotation: str = "pairs") -> QKVGemmConfig:
    """A documented heuristic, no autotuning at first call.

    NVIDIA GPUs: ``NVIDIA_ANGLES_CONFIG`` for the angles path, ``NVIDIA_TABLE_CONFIG``
    for the table (see there); measured at Kimi's shape only; ``NVIDIA_HALF_CONFIG`` for
    the table's ``rotation="half"`` (``AMD_HALF_CONFIG`` on AMD). AMD GPUs (``amd``; None:
    ROCm builds of torch): 128x128x64 tiles on 8 warps, 2 stages (the operand buffers fill
    the 64 KB of LDS of MI300X/MI250 exactly), one program per tile: 96 registers, no
    spills at gfx942/gfx90a (``compile_matrix``); not measured on an AMD GPU.
    The CPU interpreter: small tiles, one program per tile (its cost grows with the
    tile count and size, not with the GEMM's efficiency)."""
    check_positive_int("heads", heads)
    check_positive_int("head_dim", head_dim)
    half = check_rotation(rotation) == "half"
    if device.type == "cpu":
        return QKVGemmConfig(block_m=32, block_n=64, block_k=32, group_m=1, num_stages=1)
    if amd is None:
        amd = bool(getattr(torch.version, "hip", None))
    if amd:
        return AMD_HALF_CONFIG if half else QKVGemmConfig(num_stages=2, num_warps=8)
    if half:
        return NVIDIA_HALF_CONFIG
    return NVIDIA_ANGLES_CONFIG if angles else NVIDIA_TABLE_CONFIG


def tma_supported(device: torch.device) -> bool:
    """TMA descriptors: NVIDIA compute capability 9.0+, or the CPU interpreter."""
    if device.type == "cpu":
        return triton_interpreter_enabled()
    if getattr(torch.version, "hip", None):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _tma_aligned(*tensors) -> bool:
    """TMA needs 16-byte aligned bases and non-unit strides."""
    return all(t.data_ptr() % 16 == 0
               and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1])
               for t in tensors)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# --------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------


def _check_table(name: str, t, tokens: int, half: int, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (math is done in fp32), got {t.dtype}")
    if t.dim() != 2 or tuple(t.shape) != (tokens, half):
        raise ValueError(f"{name} must have shape (tokens, head_dim/2) = ({tokens}, {half}), "
                         f"got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")


def _check_cos_sin(x, w_qkv, b_qkv, cos, sin, heads: int | None) -> tuple[int, int]:
    """All checks of a table call; (heads, head_dim)."""
    if not isinstance(cos, torch.Tensor) or cos.dim() != 2:
        raise ValueError("cos must be a 2-D (tokens, head_dim/2) float32 tensor")
    head_dim = 2 * cos.shape[1]
    heads = check_qkv_operands(x, w_qkv, b_qkv, head_dim, heads, "cos (tokens, head_dim/2)")
    for name, t in (("cos", cos), ("sin", sin)):
        _check_table(name, t, x.shape[0], head_dim // 2, x.device)
    return heads, head_dim


def _check_angles(x, w_qkv, b_qkv, coords, freqs, heads: int | None) -> tuple[int, int]:
    """All checks of an angles call; (heads, head_dim)."""
    if not isinstance(freqs, torch.Tensor):
        raise TypeError(f"freqs must be a torch.Tensor, got {type(freqs).__name__}")
    if freqs.dtype != torch.float32 or freqs.dim() != 1 or not freqs.is_contiguous():
        raise ValueError(f"freqs must be a contiguous float32 vector (head_dim/4,), got "
                         f"{freqs.dtype} of shape {tuple(freqs.shape)}")
    head_dim = 4 * freqs.shape[0]
    heads = check_qkv_operands(x, w_qkv, b_qkv, head_dim, heads, "freqs (head_dim/4,)")
    check_patch_coords(coords, x)
    if freqs.device != x.device:
        raise ValueError(f"freqs is on {freqs.device} but x is on {x.device}")
    return heads, head_dim


def qkv_rope_linear(x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None,
                    cos: torch.Tensor, sin: torch.Tensor, *, heads: int | None = None,
                    config: QKVGemmConfig | None = None,
                    out: torch.Tensor | None = None, rotation: str = "pairs") -> torch.Tensor:
    """``rope(x @ w_qkv^T + b_qkv)`` in one kernel: packed qkv (T, 3, H, D), q and k rotated.

    Args:
        x: (T, hidden) bf16/fp16, unit last stride.
        w_qkv: (3*H*D, hidden), contiguous, x's dtype (as ``nn.Linear`` holds it);
            b_qkv: (3*H*D,) floating point, or None. Read at every call: nothing is kept.
        cos, sin: fp32 (T, D/2), any strides (e.g. ``cos_sin_views(freqs_cis)``); D is
            read from their width.
        heads: H, checked against W (None: read from W).
        config: launch settings; ``qkv_gemm_config`` by default.
        out: optional preallocated (T, 3, H, D) contiguous output sharing no memory
            with any input.
        rotation: ``"pairs"`` (Kimi: x[2j] with x[2j+1]) or ``"half"`` (Qwen: x[j] with
            x[j + D/2]); column j of cos/sin is pair j's angle in both. ``"half"`` runs the
            kernel with ``_rotate_half_columns`` (module docstring, 1.) and pointer loads
            and stores: ``config.use_tma=True`` is refused.
    No autograd: inputs that require grad are refused while grad mode is on.
    """
    columns = _ROTATION_COLUMNS[check_rotation(rotation)]
    heads, head_dim = _check_cos_sin(x, w_qkv, b_qkv, cos, sin, heads)
    return _launch(x, w_qkv, b_qkv, heads, head_dim, config, out, _rope_table, "qkv_rope_linear",
                   cos=cos, sin=sin, columns=columns)


def qkv_rope_linear_angles(x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None,
                           coords: torch.Tensor, freqs: torch.Tensor, *,
                           heads: int | None = None, config: QKVGemmConfig | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """``qkv_rope_linear`` with the angles computed in-kernel instead of read from a table.

    Args:
        coords: int32 (T, 2) contiguous, each token's (row, column) in its image's
            patch grid (``vision_patch_coords``).
        freqs: fp32 (D/4,) contiguous, Kimi's frequencies (``vision_rope_frequencies``);
            D is read from its length.
    """
    heads, head_dim = _check_angles(x, w_qkv, b_qkv, coords, freqs, heads)
    return _launch(x, w_qkv, b_qkv, heads, head_dim, config, out, _rope_angles,
                   "qkv_rope_linear_angles", coords=coords, freqs=freqs)


def qkv_linear_unrotated(x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, *,
                         heads: int, head_dim: int, config: QKVGemmConfig | None = None,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """Benchmarks only: the kernel with the ``_no_rotation`` epilogue, so q and k are NOT
    rotated (packed ``x @ w_qkv^T + b_qkv``). Timed beside the rotating paths at the same
    config it splits the mainloop's time from the rotation's."""
    heads = check_qkv_operands(x, w_qkv, b_qkv, head_dim, heads)
    return _launch(x, w_qkv, b_qkv, heads, head_dim, config, out, _no_rotation,
                   "qkv_linear_unrotated")


def _tile_bias(b_qkv: torch.Tensor, block_n: int) -> torch.Tensor:
    """b as the kernel reads it: fp32, zero-padded to whole N tiles, made at every call (one
    cast of 3*H*D values, none for an fp32 bias at Kimi's 27 whole tiles of 128; a bf16
    bias loaded and converted in the kernel instead costs the table default 10 registers
    at sm_90: 236 against 226, ``compile_matrix``)."""
    bias = b_qkv.detach().to(torch.float32).contiguous()
    pad = -bias.shape[0] % block_n
    return torch.nn.functional.pad(bias, (0, pad)) if pad else bias


# each rotation's column map (the kernel's COLUMNS): the rotation epilogue is the pairs one
_ROTATION_COLUMNS = {"pairs": _same_columns, "half": _rotate_half_columns}


def _launch(x, w_qkv, b_qkv, heads, head_dim, config, out, rotation, what, *, cos=None,
            sin=None, coords=None, freqs=None, columns=_same_columns):
    """Checks that need the config, then one launch of the per-tile or persistent kernel."""
    check_no_autograd(what, x=x, w_qkv=w_qkv, b_qkv=b_qkv, cos=cos, sin=sin, freqs=freqs)
    tokens, hidden = x.shape
    angles = rotation is _rope_angles
    if config is None:
        config = qkv_gemm_config(heads, head_dim, x.device, x.element_size(), angles=angles,
                                 rotation="pairs" if columns is _same_columns else "half")
    elif not isinstance(config, QKVGemmConfig):
        raise TypeError(f"config must be a QKVGemmConfig, got {type(config).__name__}")
    shape = (tokens, 3, heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    else:
        check_qkv_out(out, shape, x, {"x": x, "w_qkv": w_qkv, "b_qkv": b_qkv, "cos": cos,
                                      "sin": sin, "coords": coords, "freqs": freqs})
    if tokens == 0:
        return out
    check_triton_device(x, what)

    n_cols = 3 * heads * head_dim
    out_rows = out.view(tokens, n_cols)
    bias = None if b_qkv is None else _tile_bias(b_qkv, config.block_n)
    use_tma = config.use_tma
    if columns is not _same_columns:  # W's rows and out's columns gathered: pointers only
        if use_tma:
            raise ValueError("config.use_tma=True: rotation='half' reads W's rows and writes "
                             "out's columns through a column map, which TMA boxes cannot; "
                             "leave use_tma None or False")
        use_tma = False
    if use_tma is None:
        use_tma = (tma_supported(x.device) and _tma_aligned(x, w_qkv, out_rows)
                   and config.store_columns * x.element_size() >= 16)
    if use_tma and config.store_columns * x.element_size() < 16:
        raise ValueError(f"config.use_tma: a TMA store box needs at least 16 bytes a row; this "
                         f"config stores {config.store_columns} columns at a time "
                         f"({config.store_columns * x.element_size()} bytes): widen block_n or "
                         "leave use_tma None")
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_arg = TensorDescriptor.from_tensor(x, [config.block_m, config.block_k])
        w_arg = TensorDescriptor.from_tensor(w_qkv.detach(), [config.block_n, config.block_k])
        out_arg = TensorDescriptor.from_tensor(out_rows, [config.block_m, config.store_columns])
    else:
        x_arg, w_arg, out_arg = x, w_qkv.detach(), out_rows

    num_tiles = triton.cdiv(tokens, config.block_m) * triton.cdiv(n_cols, config.block_n)
    # in-kernel angles: the SFU's cos/sin on CUDA GPUs, tl.cos/tl.sin elsewhere
    fast = angles and not triton_interpreter_enabled() and torch.version.hip is None
    # fp32 stand-ins for the pointers a rotation does not read
    stand_in = freqs if angles else (cos if cos is not None else out_rows)
    table = rotation is _rope_table
    interleaved = table and interleaved_cos_sin(cos, sin)
    # the interleaved gather's cos/sin vectors: runs of n % head_dim inside a store's columns
    cs_vec = cos_sin_vector(cos, sin, head_dim, config.store_columns) if interleaved else 1
    args = (x_arg, w_arg, out_arg, bias if bias is not None else stand_in,
            cos if table else stand_in, sin if table else stand_in,
            coords if angles else stand_in, freqs if angles else stand_in, tokens)
    strides = (x.stride(0), w_qkv.stride(0), out_rows.stride(0),
               cos.stride(0) // cs_vec if table else 0, cos.stride(1) if table else 0,
               sin.stride(0) if table else 0, sin.stride(1) if table else 0)
    meta = dict(HIDDEN=hidden, HEADS=heads, HEAD_DIM=head_dim, BLOCK_M=config.block_m,
                BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
                HAS_BIAS=bias is not None, ROTATION=rotation, FAST=fast,
                EPILOGUE_PARTS=config.epilogue_parts, USE_TMA=use_tma,
                INTERPRETED=triton_interpreter_enabled(), INTERLEAVED=interleaved,
                CS_VEC=cs_vec, COLUMNS=columns, num_warps=config.num_warps,
                num_stages=config.num_stages)
    if config.persistent:
        programs = min(num_tiles, config.programs_per_sm * _num_sms(x.device))
        _qkv_rope_kernel_persistent[(programs,)](*args, programs, *strides, **meta)
    else:
        _qkv_rope_kernel[(num_tiles,)](*args, *strides, **meta)
    return out

