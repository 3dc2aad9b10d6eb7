"""RoPE for free: the QKV projection rotates q and k in its epilogue.

``qkv = rope(x @ W^T + b)`` in one Triton kernel: a GEMM whose output tile is
rotated in fp32 registers before it is written, so q and k never travel through
memory unrotated (the standalone RoPE kernel reads and writes them again).

The file is in named pieces, like Triton's persistent-matmul tutorial:

1. **Layout** (``qkv_row_order``, ``permute_qkv_weight``). Kimi's pairs are
   adjacent columns ``(2j, 2j+1)`` of each head. The packed output (T, 3, H, D)
   is viewed as (T, 3H, D): 3H heads (q, then k, then v). An output tile covers
   ``heads_per_tile`` consecutive heads x the same ``pairs_per_tile`` pairs
   ``j`` of each head (Kimi: 16 heads x 4 pairs = 128 columns; 36 pairs a head
   = 9 pair blocks, 48 heads = 3 head blocks, 27 tiles, no padding). The
   permutation reorders W's rows so that a tile's accumulator columns are
   ``[even members | odd members]`` of its pairs: splitting the tile in half
   stays in registers, the rotation is elementwise, ``join`` restores the
   interleaved order, and the kernel stores to the ordinary (T, 3, H, D)
   addresses. Heads and pairs are padded with zero rows to whole tiles. The
   The flat layout (``QKVGemmConfig.flat_pairs``) keeps W's own row order
   instead (an N tile is block_n consecutive columns of the packed row, a pair is
   two adjacent columns, cos/sin are gathered per column) and pads only the last
   tile. The
   only cache is the row order (a function of five values and the device); the
   permuted weight itself is never cached behind the caller's back: without
   ``permuted=`` every call permutes W again (one gather of W), so no update of
   W or b, in place or through ``.data``, can leave a stale copy.
2. **Loads** (``_load_x``, ``_load_w``, ``_store_heads``): the only code that
   differs between TMA and pointers. On Hopper and newer GPUs (and under the
   CPU interpreter, which emulates descriptors) tiles of x and W come through
   TMA tensor descriptors and the output leaves through a 3-D descriptor
   (T, 3H, D) whose bounds clip the padded heads/pairs and the last token tile;
   elsewhere (AMD, pre-Hopper, strides TMA cannot take) masked pointer loads
   and stores do the same. Everything else is one body.
3. **Mainloop** (``_mainloop``): the K loop, fp32 accumulator.
4. **Epilogue** (``_rope_epilogue``): bias, then the rotation (``_rotate``, a
   small function of its own) with cos/sin for the tile's pairs from a table or
   computed in-kernel from each token's patch (row, column) and Kimi's
   frequencies (``_cos_sin``); all heads of a tile share its pairs, so a tile
   needs (tokens x pairs_per_tile) angles, broadcast over its heads. v heads go
   through the same code with the rotation selected off (exact). With
   ``epilogue_subtile`` the tile is rotated and stored in two halves of its
   heads, so fewer registers are live at once.
5. **Kernels**, side by side: ``_qkv_rope_kernel`` (one program per tile) and
   ``_qkv_rope_kernel_persistent`` (one program per SM, tiles strided over
   them, the tile loop flattened with the K loop so the pipeliner fetches the
   next tile's operands during the epilogue). Both call ``_qkv_tile``.
   ``_qkv_rope_kernel_ws`` (``warp_specialize``): persistent, its tile loop
   warp-specialized by Triton (on Hopper a TMA producer warp group and two
   MMA + epilogue consumer groups splitting the tile's rows). That split takes
   no reshape or join of the accumulator, so this kernel keeps a tile's even
   and odd pair members in two accumulators (``_mainloop_pair_halves``),
   rotates them elementwise and stores them through pointers
   (``_pair_epilogue``). It hung on an H200 (Triton 3.6; see
   ``QKVGemmConfig.warp_specialize``): tested on the CPU only, timed nowhere.
6. **Launch settings** (``QKVGemmConfig``; its defaults are the measured best)
   and **launchers** (``qkv_rope_linear``, ``qkv_rope_linear_angles``,
   ``rotating_qkv_projection``; ``qkv_linear_rotation_compiled_out`` is for
   benchmarks only: the same kernel and config with the rotation compiled out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (check_triton_device, may_overlap,
                                         triton_interpreter_enabled)
from rope_kernels.kernels.fused import cos_sin_vector, interleaved_cos_sin

GEMM_DTYPES = (torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------
# 1. Layout
# --------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PermutedQKVWeight:
    """W_qkv/b_qkv with rows in the kernel's tile order (``qkv_row_order``).

    ``weight``: (tiles * block_n, hidden), zero rows where a tile runs past the
    heads or pairs; ``bias``: fp32 (tiles * block_n,) or None. ``block_n`` and
    ``heads_per_tile`` must match the launch config that uses it.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    heads: int
    head_dim: int
    block_n: int
    heads_per_tile: int
    flat: bool = False  # the flat-pairs layout (``qkv_row_order(flat=True)``)

    @property
    def pairs_per_tile(self) -> int:
        return self.block_n // 2 if self.flat else self.block_n // (2 * self.heads_per_tile)

    @property
    def head_blocks(self) -> int:
        return 1 if self.flat else triton.cdiv(3 * self.heads, self.heads_per_tile)

    @property
    def pair_blocks(self) -> int:
        if self.flat:  # N tiles: every pair of q, k and v, block_n/2 at a time
            return triton.cdiv(3 * self.heads * self.head_dim // 2, self.pairs_per_tile)
        return triton.cdiv(self.head_dim // 2, self.pairs_per_tile)


def _check_power_of_two(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a positive power of two, got {value!r}")


def _check_tile_layout(block_n: int, heads_per_tile: int) -> None:
    _check_power_of_two("block_n", block_n)
    _check_power_of_two("heads_per_tile", heads_per_tile)
    if block_n < 2 * heads_per_tile:
        raise ValueError(f"block_n ({block_n}) must hold at least one pair of each of its "
                         f"heads_per_tile ({heads_per_tile}) heads: block_n >= 2 * heads_per_tile")


def qkv_row_order(heads: int, head_dim: int, block_n: int, heads_per_tile: int,
                  flat: bool = False) -> torch.Tensor:
    """Source row of W for every row of the permuted weight (-1: a zero pad row).

    ``flat``: the flat layout: W's rows in their own order, zero rows to whole tiles.
    N tile ``b`` is columns ``b * block_n ...`` of the packed output row (3H x D,
    across head boundaries; a pair is two adjacent columns). Only the last tile is
    padded (Kimi: 3456 columns in 14 tiles of 256, 3.7% zero rows, against 11% for
    16 heads x 8 pairs), and a tile's output is ``block_n`` contiguous columns.

    Tile ``(head block hb, pair block jb)`` is rows ``(hb * pair_blocks + jb) *
    block_n ...``; inside it, row ``r`` is member ``r // (block_n/2)`` (0 even,
    1 odd) of pair ``jb * pairs_per_tile + r % pairs_per_tile`` of head
    ``hb * heads_per_tile + (r // pairs_per_tile) % heads_per_tile``; heads
    run over q, k, v (3H of them)."""
    _check_tile_layout(block_n, heads_per_tile)
    if flat:  # W's own order, zero rows to whole tiles
        total = 3 * heads * head_dim
        rows = torch.arange(triton.cdiv(total, block_n) * block_n)
        return torch.where(rows < total, rows, -1)
    pairs_per_tile = block_n // (2 * heads_per_tile)
    half = head_dim // 2
    head_blocks = triton.cdiv(3 * heads, heads_per_tile)
    pair_blocks = triton.cdiv(half, pairs_per_tile)
    tile = torch.arange(head_blocks * pair_blocks)[:, None]
    r = torch.arange(block_n)[None, :]
    member = r // (block_n // 2)
    head = (tile // pair_blocks) * heads_per_tile + (r // pairs_per_tile) % heads_per_tile
    pair = (tile % pair_blocks) * pairs_per_tile + r % pairs_per_tile
    src = head * head_dim + 2 * pair + member
    return torch.where((head < 3 * heads) & (pair < half), src, -1).reshape(-1)


# The one cache of this module: the gather index of a layout, on a device. Its key
# is all it depends on (four ints and the device), so it cannot go stale.
_ROW_GATHERS: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = {}


def _row_gather(heads: int, head_dim: int, block_n: int, heads_per_tile: int,
                device: torch.device, flat: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(source rows, pad-row mask or None when nothing is padded) on ``device``."""
    key = (heads, head_dim, block_n, heads_per_tile, flat, str(device))
    hit = _ROW_GATHERS.get(key)
    if hit is None:
        order = qkv_row_order(heads, head_dim, block_n, heads_per_tile, flat)
        pad = order < 0
        hit = (order.clamp(min=0).to(device),
               pad[:, None].to(device) if bool(pad.any()) else None)
        _ROW_GATHERS[key] = hit
    return hit


def permute_qkv_weight(
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    heads: int,
    head_dim: int,
    *,
    block_n: int = 128,
    heads_per_tile: int = 16,
    flat: bool = False,
) -> PermutedQKVWeight:
    """Reorder W_qkv (3*H*D, hidden) and b_qkv for ``qkv_rope_linear``.

    ``block_n``: the GEMM's N tile; ``heads_per_tile``: heads sharing a tile
    (``block_n / (2 * heads_per_tile)`` pairs of each). A new copy, not tied to
    W: build it once where the weights are loaded and again whenever they
    change. ``flat``: the flat-pairs layout (``qkv_row_order``; heads_per_tile 1);
    where its tiles need no zero rows and W is contiguous, the weight is W itself
    (its own order: no copy; an in-place change of W is seen, a replaced W is not).
    Inverse: ``unpermute_qkv_weight``."""
    _check_qkv_weight(w_qkv, b_qkv, heads, head_dim)
    if not isinstance(flat, bool):
        raise TypeError(f"flat must be a bool, got {type(flat).__name__}")
    if flat and heads_per_tile != 1:
        raise ValueError(f"the flat-pairs layout takes heads_per_tile=1, got {heads_per_tile}")
    src, pad = _row_gather(heads, head_dim, block_n, heads_per_tile, w_qkv.device, flat)
    if flat and pad is None and w_qkv.is_contiguous():
        # the flat layout with whole tiles is W's own order (Kimi: 3456 rows = 27 tiles
        # of 128): W itself, no gather (the encoder permutes at every call)
        weight = w_qkv.detach()
    else:
        weight = w_qkv.detach().index_select(0, src)
    bias = None
    if b_qkv is not None:
        bias = b_qkv.detach().float().index_select(0, src)
    if pad is not None:
        weight.masked_fill_(pad, 0)
        if bias is not None:
            bias.masked_fill_(pad[:, 0], 0)
    return PermutedQKVWeight(weight, bias, heads, head_dim, block_n, heads_per_tile, flat)


def unpermute_qkv_weight(permuted: PermutedQKVWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The original (W_qkv, b_qkv as fp32) back from a permuted weight."""
    order = qkv_row_order(permuted.heads, permuted.head_dim, permuted.block_n,
                          permuted.heads_per_tile, permuted.flat).to(permuted.weight.device)
    keep = order >= 0
    rows = 3 * permuted.heads * permuted.head_dim
    weight = permuted.weight.new_empty((rows, permuted.weight.shape[1]))
    weight[order[keep]] = permuted.weight[keep]
    bias = None
    if permuted.bias is not None:
        bias = permuted.bias.new_empty(rows)
        bias[order[keep]] = permuted.bias[keep]
    return weight, bias


def _check_qkv_weight(w_qkv, b_qkv, heads, head_dim) -> None:
    for name, v in (("heads", heads), ("head_dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 for Kimi's 2D RoPE, got {head_dim}")
    if not isinstance(w_qkv, torch.Tensor):
        raise TypeError(f"w_qkv must be a torch.Tensor, got {type(w_qkv).__name__}")
    if w_qkv.dim() != 2 or w_qkv.shape[0] != 3 * heads * head_dim:
        raise ValueError(f"w_qkv must have shape (3*heads*head_dim, hidden) = "
                         f"({3 * heads * head_dim}, hidden), got {tuple(w_qkv.shape)}")
    if w_qkv.dtype not in GEMM_DTYPES:
        raise TypeError(f"w_qkv must be bfloat16 or float16, got {w_qkv.dtype}")
    if not w_qkv.is_contiguous():
        raise ValueError(f"w_qkv must be contiguous, got strides {tuple(w_qkv.stride())}")
    if b_qkv is not None:
        if not isinstance(b_qkv, torch.Tensor):
            raise TypeError(f"b_qkv must be a torch.Tensor or None, got {type(b_qkv).__name__}")
        if tuple(b_qkv.shape) != (w_qkv.shape[0],):
            raise ValueError(f"b_qkv must have shape ({w_qkv.shape[0]},), got {tuple(b_qkv.shape)}")
        if not b_qkv.is_floating_point():
            raise TypeError(f"b_qkv must be floating point, got {b_qkv.dtype}")
        if b_qkv.device != w_qkv.device:
            raise ValueError(f"b_qkv is on {b_qkv.device} but w_qkv is on {w_qkv.device}")


# --------------------------------------------------------------------------
# 2. Loads: the only TMA / pointer difference
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
def _load_w(w, n0, k0, w_stride_n, HIDDEN: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr):
    """Permuted W[n0:n0+BLOCK_N, k0:k0+BLOCK_K] (its rows are whole tiles)."""
    if USE_TMA:
        b = w.load([n0, k0])
    else:
        rows = n0 + tl.arange(0, BLOCK_N).to(tl.int64)
        ks = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(w + rows[:, None] * w_stride_n + ks[None, :], mask=(ks < HIDDEN)[None, :],
                    other=0.0)
    return b


@triton.jit
def _store_heads(out, y, m0, head0, col0, n_tokens, out_stride_t, out_stride_h,
                 HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                 NH: tl.constexpr, COLS: tl.constexpr, USE_TMA: tl.constexpr):
    """y (BLOCK_M, NH heads, COLS columns) to out[m0:, head0:, col0:] of the (T, 3H, D)
    output, clipped to the tokens, the 3H heads and the D columns."""
    if USE_TMA:
        out.store([m0, head0, col0], y.to(out.dtype))
    else:
        tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        heads = head0 + tl.arange(0, NH)
        cols = col0 + tl.arange(0, COLS)
        ptrs = (out + tokens[:, None, None] * out_stride_t + heads[None, :, None] * out_stride_h
                + cols[None, None, :])
        mask = ((tokens < n_tokens)[:, None, None] & (heads < 3 * HEADS)[None, :, None]
                & (cols < HEAD_DIM)[None, None, :])
        tl.store(ptrs, y.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _store_cols(out, y, m0, col0, n_tokens, out_stride_t, N_COLS: tl.constexpr,
                BLOCK_M: tl.constexpr, COLS: tl.constexpr, USE_TMA: tl.constexpr):
    """y (BLOCK_M, COLS) to out[m0:, col0:] of the (T, 3H x D) output (flat-pairs
    layout: a tile's columns are contiguous), clipped to the tokens and the row."""
    if USE_TMA:
        out.store([m0, col0], y.to(out.dtype))
    else:
        tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        cols = col0 + tl.arange(0, COLS)
        mask = (tokens < n_tokens)[:, None] & (cols < N_COLS)[None, :]
        tl.store(out + tokens[:, None] * out_stride_t + cols[None, :],
                 y.to(out.dtype.element_ty), mask=mask)


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
def _mainloop(x, w, m0, n0, n_tokens, x_stride_t, w_stride_n, HIDDEN: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              USE_TMA: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 (BLOCK_M, BLOCK_N) = x tile @ permuted W tile^T over all of HIDDEN."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(HIDDEN, BLOCK_K)):
        a = _load_x(x, m0, ki * BLOCK_K, n_tokens, x_stride_t, HIDDEN, BLOCK_M, BLOCK_K, USE_TMA)
        b = _load_w(w, n0, ki * BLOCK_K, w_stride_n, HIDDEN, BLOCK_N, BLOCK_K, USE_TMA)
        acc = _dot(a, b, acc, INTERPRETED)
    return acc


# --------------------------------------------------------------------------
# 4. Epilogue: bias, rotation, store
# --------------------------------------------------------------------------


ANGLES_TABLE, ANGLES_PRECISE, ANGLES_FAST = 0, 1, 2  # the kernels' ANGLES constexpr


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
def _cos_sin(tokens, token_ok, pairs, pair_ok, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
             cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, ANGLES: tl.constexpr):
    """cos/sin (BLOCK_M, PAIRS) of the tile's pairs for each token, fp32: from the
    tables (ANGLES 0), or from the token's patch coordinates and the frequencies
    (ANGLES 1: ``tl.cos``/``tl.sin``; 2: the SFU's, CUDA only)."""
    if ANGLES:
        # Kimi: pair 2i turns by col * f_i, pair 2i+1 by row * f_i (one fp32 multiply)
        row = tl.load(coords_ptr + tokens * 2, mask=token_ok, other=0).to(tl.float32)
        col = tl.load(coords_ptr + tokens * 2 + 1, mask=token_ok, other=0).to(tl.float32)
        f = tl.load(freqs_ptr + pairs // 2, mask=pair_ok, other=0.0) * 0.15915494309189535
        pos = tl.where((pairs % 2 == 0)[None, :], col[:, None], row[:, None])
        c, s = _cos_sin_of(pos * f[None, :], ANGLES == 2)  # in turns; ANGLES_FAST
    else:
        mask = token_ok[:, None] & pair_ok[None, :]
        c = tl.load(cos_ptr + tokens[:, None] * cos_stride_t + pairs[None, :] * cos_stride_d,
                    mask=mask, other=1.0)
        s = tl.load(sin_ptr + tokens[:, None] * sin_stride_t + pairs[None, :] * sin_stride_d,
                    mask=mask, other=0.0)
    return c, s


@triton.jit
def _rotate(x0, x1, c, s, on):
    """(x0, x1) of each pair turned by (c, s) where ``on`` (the q and k heads),
    passed through elsewhere (v): every operand broadcast to x0's shape."""
    y0 = tl.where(on, x0 * c - x1 * s, x0)
    y1 = tl.where(on, x0 * s + x1 * c, x1)
    return y0, y1


@triton.jit
def _rope_store(x0, x1, c, s, out, m0, head0, pair0, n_tokens, out_stride_t, out_stride_h,
                HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                NH: tl.constexpr, PAIRS: tl.constexpr, ROTATE: tl.constexpr,
                USE_TMA: tl.constexpr):
    """Rotate NH heads' pairs (x0 even, x1 odd members) and store them interleaved."""
    if ROTATE:
        heads = head0 + tl.arange(0, NH)
        x0, x1 = _rotate(x0, x1, c, s, (heads < 2 * HEADS)[None, :, None])
    y = tl.reshape(tl.join(x0, x1), (BLOCK_M, NH, 2 * PAIRS))  # interleaved
    _store_heads(out, y, m0, head0, 2 * pair0, n_tokens, out_stride_t, out_stride_h, HEADS,
                 HEAD_DIM, BLOCK_M, NH, 2 * PAIRS, USE_TMA)


@triton.jit
def _flat_cs(col0, cos_ptr, cos_stride_t, m0, n_tokens, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, COLS: tl.constexpr, CS_VEC: tl.constexpr):
    """Interleaved cos/sin (cos/sin are a complex freqs_cis's views, [c0, s0, c1, s1,
    ...]) of COLS columns from col0, for the tile's tokens: column n's entry is the
    token's value at ``n % D``, the cos (even n) or sin (odd n) of column n's pair:
    one contiguous gather in the tile's own layout. ``cos_stride_t`` is in units of
    CS_VEC floats, and CS_VEC divides D, col0 and COLS (the launcher's
    ``cos_sin_vector``): so ``n % D`` runs contiguously in aligned groups of CS_VEC and
    each group is one vector load (4 floats: 16 bytes)."""
    tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    offsets = (col0 + tl.arange(0, COLS)) % HEAD_DIM
    if CS_VEC > 1:
        offsets = tl.max_contiguous(tl.multiple_of(offsets, CS_VEC), CS_VEC)
    return tl.load(cos_ptr + tokens[:, None] * (cos_stride_t * CS_VEC) + offsets[None, :],
                   mask=(tokens < n_tokens)[:, None], other=0.0)


@triton.jit
def _flat_store(x, col0, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n_tokens,
                out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                COLS: tl.constexpr, ROTATE: tl.constexpr, ANGLES: tl.constexpr,
                INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr, USE_TMA: tl.constexpr):
    """Flat layout: rotate COLS consecutive columns of the packed row (W's own order:
    column ``n`` is member ``n % 2`` of pair ``(n % D) / 2`` of head ``n // D``) and
    store them. Adjacent columns are a pair, so splitting them is free in registers.
    INTERLEAVED: the columns' cos/sin in one vectorized gather (``_flat_cs``); else
    cos/sin per pair (two tables, or angles)."""
    if ROTATE:
        tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        x0, x1 = tl.split(tl.reshape(x, (BLOCK_M, COLS // 2, 2)))
        pairs = col0 // 2 + tl.arange(0, COLS // 2)
        if INTERLEAVED and not ANGLES:
            cs = _flat_cs(col0, cos_ptr, cos_stride_t, m0, n_tokens, HEAD_DIM, BLOCK_M, COLS,
                          CS_VEC)
            c, s = tl.split(tl.reshape(cs, (BLOCK_M, COLS // 2, 2)))
        else:
            c, s = _cos_sin(tokens, tokens < n_tokens, pairs % (HEAD_DIM // 2),
                            pairs < 3 * HEADS * (HEAD_DIM // 2), cos_ptr, sin_ptr, coords_ptr,
                            freqs_ptr, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                            ANGLES)
        y0, y1 = _rotate(x0, x1, c, s, (pairs < 2 * HEADS * (HEAD_DIM // 2))[None, :])
        x = tl.reshape(tl.join(y0, y1), (BLOCK_M, COLS))
    _store_cols(out, x, m0, col0, n_tokens, out_stride_t, 3 * HEADS * HEAD_DIM, BLOCK_M,
                COLS, USE_TMA)


@triton.jit
def _col_halves(x, BLOCK_M: tl.constexpr, COLS: tl.constexpr):
    """x (BLOCK_M, COLS) as its two halves of contiguous columns."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, COLS // 2)), (0, 2, 1)))


@triton.jit
def _flat_stores(x, col0, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n_tokens,
                 out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                 HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                 COLS: tl.constexpr, STORE_COLS: tl.constexpr, ROTATE: tl.constexpr,
                 ANGLES: tl.constexpr, INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr,
                 USE_TMA: tl.constexpr):
    """``_flat_store`` of COLS columns as stores of STORE_COLS contiguous columns, in
    column order (halves, recursively)."""
    if COLS == STORE_COLS:
        _flat_store(x, col0, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n_tokens,
                    out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HEADS,
                    HEAD_DIM, BLOCK_M, COLS, ROTATE, ANGLES, INTERLEAVED, CS_VEC, USE_TMA)
    else:
        xa, xb = _col_halves(x, BLOCK_M, COLS)
        _flat_stores(xa, col0, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n_tokens,
                     out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                     HEADS, HEAD_DIM, BLOCK_M, COLS // 2, STORE_COLS, ROTATE, ANGLES,
                     INTERLEAVED, CS_VEC, USE_TMA)
        _flat_stores(xb, col0 + COLS // 2, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0,
                     n_tokens, out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t,
                     sin_stride_d, HEADS, HEAD_DIM, BLOCK_M, COLS // 2, STORE_COLS, ROTATE,
                     ANGLES, INTERLEAVED, CS_VEC, USE_TMA)


@triton.jit
def _flat_epilogue(acc, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n0, n_tokens,
                   out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                   HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, ROTATE: tl.constexpr, ANGLES: tl.constexpr,
                   INTERLEAVED: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
                   CS_VEC: tl.constexpr, USE_TMA: tl.constexpr):
    """The flat tile (bias already added): columns n0 ... n0 + BLOCK_N of the packed
    row, in EPILOGUE_SUBTILE stores of that many parts of the columns (the config's
    ``epilogue_parts``: each column has its own cos/sin; at 128x256 on 8 warps, whole,
    in halves or in quarters, the persistent kernel spills on sm_90, in eighths it
    does not), else (False) in one."""
    _flat_stores(acc, n0, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n_tokens,
                 out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HEADS,
                 HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_N // (EPILOGUE_SUBTILE if EPILOGUE_SUBTILE
                                                         else 1),
                 ROTATE, ANGLES, INTERLEAVED, CS_VEC, USE_TMA)


@triton.jit
def _rope_epilogue(acc, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n0, pid_n,
                   n_tokens, out_stride_t, out_stride_h, cos_stride_t, cos_stride_d,
                   sin_stride_t, sin_stride_d, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   PAIR_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HEADS_PER_TILE: tl.constexpr, HAS_BIAS: tl.constexpr, ROTATE: tl.constexpr,
                   ANGLES: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, USE_TMA: tl.constexpr,
                   FLAT: tl.constexpr, INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr):
    """Bias, then q/k rotation of the accumulator tile, stored to (T, 3H, D) (or, in
    the flat-pairs layout, to its (T, 3H x D) view)."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n0 + tl.arange(0, BLOCK_N))[None, :]
    if FLAT:
        _flat_epilogue(acc, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n0, n_tokens,
                       out_stride_t, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                       HEADS, HEAD_DIM, BLOCK_M, BLOCK_N, ROTATE, ANGLES, INTERLEAVED,
                       EPILOGUE_SUBTILE, CS_VEC, USE_TMA)
    else:
        _heads_epilogue(acc, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, pid_n, n_tokens,
                        out_stride_t, out_stride_h, cos_stride_t, cos_stride_d, sin_stride_t,
                        sin_stride_d, HEADS, HEAD_DIM, PAIR_BLOCKS, BLOCK_M, BLOCK_N,
                        HEADS_PER_TILE, ROTATE, ANGLES, EPILOGUE_SUBTILE, USE_TMA)


@triton.jit
def _heads_epilogue(acc, out, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, pid_n, n_tokens,
                    out_stride_t, out_stride_h, cos_stride_t, cos_stride_d, sin_stride_t,
                    sin_stride_d, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    PAIR_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEADS_PER_TILE: tl.constexpr, ROTATE: tl.constexpr, ANGLES: tl.constexpr,
                    EPILOGUE_SUBTILE: tl.constexpr, USE_TMA: tl.constexpr):
    """The heads x pairs tile (bias already added): its heads share the tile's pairs,
    so one angle per (token, pair) serves them all."""
    PAIRS: tl.constexpr = BLOCK_N // (2 * HEADS_PER_TILE)
    head0 = (pid_n // PAIR_BLOCKS) * HEADS_PER_TILE
    pair0 = (pid_n % PAIR_BLOCKS) * PAIRS
    # columns [0, BLOCK_N/2) hold the even members of the tile's pairs, the rest the odd
    x0, x1 = _col_halves(acc, BLOCK_M, BLOCK_N)
    x0 = tl.reshape(x0, (BLOCK_M, HEADS_PER_TILE, PAIRS))
    x1 = tl.reshape(x1, (BLOCK_M, HEADS_PER_TILE, PAIRS))
    if ROTATE:
        tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        pairs = pair0 + tl.arange(0, PAIRS)
        c, s = _cos_sin(tokens, tokens < n_tokens, pairs, pairs < HEAD_DIM // 2, cos_ptr,
                        sin_ptr, coords_ptr, freqs_ptr, cos_stride_t, cos_stride_d,
                        sin_stride_t, sin_stride_d, ANGLES)
        c = c[:, None, :]  # one angle per (token, pair), shared by the tile's heads
        s = s[:, None, :]
    else:
        c = 1.0
        s = 0.0
    if EPILOGUE_SUBTILE:
        # two halves of the tile's heads, one after the other
        HALF: tl.constexpr = HEADS_PER_TILE // 2
        x0a, x0b = tl.split(tl.permute(tl.reshape(x0, (BLOCK_M, 2, HALF, PAIRS)), (0, 2, 3, 1)))
        x1a, x1b = tl.split(tl.permute(tl.reshape(x1, (BLOCK_M, 2, HALF, PAIRS)), (0, 2, 3, 1)))
        _rope_store(x0a, x1a, c, s, out, m0, head0, pair0, n_tokens, out_stride_t, out_stride_h,
                    HEADS, HEAD_DIM, BLOCK_M, HALF, PAIRS, ROTATE, USE_TMA)
        _rope_store(x0b, x1b, c, s, out, m0, head0 + HALF, pair0, n_tokens, out_stride_t,
                    out_stride_h, HEADS, HEAD_DIM, BLOCK_M, HALF, PAIRS, ROTATE, USE_TMA)
    else:
        _rope_store(x0, x1, c, s, out, m0, head0, pair0, n_tokens, out_stride_t, out_stride_h,
                    HEADS, HEAD_DIM, BLOCK_M, HEADS_PER_TILE, PAIRS, ROTATE, USE_TMA)


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
    x_stride_t, w_stride_n, out_stride_t, out_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HIDDEN: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr, PAIR_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr,
    ROTATE: tl.constexpr, ANGLES: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    USE_TMA: tl.constexpr, INTERPRETED: tl.constexpr, FLAT: tl.constexpr,
    INTERLEAVED: tl.constexpr, CS_VEC: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) output tile: mainloop, then epilogue."""
    pid_m, pid_n = _tile_coords(tile_id, tl.cdiv(n_tokens, BLOCK_M), HEAD_BLOCKS * PAIR_BLOCKS,
                                GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    acc = _mainloop(x, w, m0, n0, n_tokens, x_stride_t, w_stride_n, HIDDEN, BLOCK_M, BLOCK_N,
                    BLOCK_K, USE_TMA, INTERPRETED)
    _rope_epilogue(acc, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n0, pid_n,
                   n_tokens, out_stride_t, out_stride_h, cos_stride_t, cos_stride_d,
                   sin_stride_t, sin_stride_d, HEADS, HEAD_DIM, PAIR_BLOCKS, BLOCK_M, BLOCK_N,
                   HEADS_PER_TILE, HAS_BIAS, ROTATE, ANGLES, EPILOGUE_SUBTILE, USE_TMA, FLAT,
                   INTERLEAVED, CS_VEC)


@triton.jit(do_not_specialize=["n_tokens"])
def _qkv_rope_kernel(
    x, w, out,  # TMA descriptors when USE_TMA, else pointers
    bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens,
    x_stride_t, w_stride_n, out_stride_t, out_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HIDDEN: tl.constexpr,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,  # ceil(3 * HEADS / HEADS_PER_TILE)
    PAIR_BLOCKS: tl.constexpr,  # ceil(HEAD_DIM / 2 / pairs per tile)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTATE: tl.constexpr,  # False only in qkv_linear_rotation_compiled_out (benchmarks)
    ANGLES: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    USE_TMA: tl.constexpr,
    INTERPRETED: tl.constexpr,
    FLAT: tl.constexpr = False,  # the flat layout (QKVGemmConfig.flat_pairs)
    INTERLEAVED: tl.constexpr = False,  # cos/sin are freqs_cis's views (flat layout's load)
    CS_VEC: tl.constexpr = 1,  # flat, interleaved: cos_stride_t is in units of CS_VEC floats
):
    """One program per output tile."""
    _qkv_tile(tl.program_id(0), x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
              n_tokens, x_stride_t, w_stride_n, out_stride_t, out_stride_h,
              cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HIDDEN, HEADS, HEAD_DIM,
              HEAD_BLOCKS, PAIR_BLOCKS, BLOCK_M, BLOCK_N, BLOCK_K, HEADS_PER_TILE, GROUP_M,
              HAS_BIAS, ROTATE, ANGLES, EPILOGUE_SUBTILE, USE_TMA, INTERPRETED, FLAT,
              INTERLEAVED, CS_VEC)


@triton.jit(do_not_specialize=["n_tokens", "num_programs"])
def _qkv_rope_kernel_persistent(
    x, w, out,
    bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens, num_programs,
    x_stride_t, w_stride_n, out_stride_t, out_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HIDDEN: tl.constexpr,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    PAIR_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTATE: tl.constexpr,
    ANGLES: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    USE_TMA: tl.constexpr,
    INTERPRETED: tl.constexpr,
    FLAT: tl.constexpr = False,
    INTERLEAVED: tl.constexpr = False,
    CS_VEC: tl.constexpr = 1,
):
    """``num_programs`` programs (one per SM) stride over the tiles; the tile loop
    is flattened with the K loop, so the next tile's loads overlap this epilogue."""
    num_tiles = tl.cdiv(n_tokens, BLOCK_M) * (HEAD_BLOCKS * PAIR_BLOCKS)
    for tile_id in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=True):
        _qkv_tile(tile_id, x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
                  n_tokens, x_stride_t, w_stride_n, out_stride_t, out_stride_h,
                  cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HIDDEN, HEADS,
                  HEAD_DIM, HEAD_BLOCKS, PAIR_BLOCKS, BLOCK_M, BLOCK_N, BLOCK_K, HEADS_PER_TILE,
                  GROUP_M, HAS_BIAS, ROTATE, ANGLES, EPILOGUE_SUBTILE, USE_TMA, INTERPRETED,
                  FLAT, INTERLEAVED, CS_VEC)


# --------------------------------------------------------------------------
# 5b. Warp-specialized kernel: pair halves in two accumulators
# --------------------------------------------------------------------------
# Triton 3.6's Hopper warp specialization (tl.range(..., warp_specialize=True)) turns
# a 4-warp program into a TMA producer warp group and two MMA + epilogue consumer
# warp groups that split the tile's rows between them; on sm_90 it splits every
# epilogue op along the rows, and it takes no reshape, permute, split or join of the
# accumulator (the compiler aborts), nor a host-made output descriptor whose box
# spans both groups' rows. So here the tile's even and odd pair members are two
# accumulators from the start (the permuted W already holds them as its tile's two
# row halves), the rotation is elementwise with cos/sin gathered per column, and the
# members are stored through pointers at their interleaved columns.


@triton.jit
def _mainloop_pair_halves(x, w, m0, n0, n_tokens, x_stride_t, w_stride_n, HIDDEN: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          USE_TMA: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 (even, odd), each (BLOCK_M, BLOCK_N/2): the x tile times the tile's first
    (even members) and second (odd members) half of permuted W rows, over HIDDEN."""
    HALF: tl.constexpr = BLOCK_N // 2
    acc0 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    for ki in range(tl.cdiv(HIDDEN, BLOCK_K)):
        a = _load_x(x, m0, ki * BLOCK_K, n_tokens, x_stride_t, HIDDEN, BLOCK_M, BLOCK_K, USE_TMA)
        b0 = _load_w(w, n0, ki * BLOCK_K, w_stride_n, HIDDEN, HALF, BLOCK_K, USE_TMA)
        b1 = _load_w(w, n0 + HALF, ki * BLOCK_K, w_stride_n, HIDDEN, HALF, BLOCK_K, USE_TMA)
        acc0 = _dot(a, b0, acc0, INTERPRETED)
        acc1 = _dot(a, b1, acc1, INTERPRETED)
    return acc0, acc1


@triton.jit
def _pair_epilogue(acc0, acc1, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0, n0,
                   pid_n, n_tokens, out_stride_t, out_stride_h, cos_stride_t, cos_stride_d,
                   sin_stride_t, sin_stride_d, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   PAIR_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HEADS_PER_TILE: tl.constexpr, HAS_BIAS: tl.constexpr, ROTATE: tl.constexpr,
                   ANGLES: tl.constexpr):
    """Bias, q/k rotation and store of a tile held as (even, odd) member halves:
    column j of each half is pair ``j % PAIRS`` of head ``j // PAIRS`` of the tile."""
    PAIRS: tl.constexpr = BLOCK_N // (2 * HEADS_PER_TILE)
    HALF: tl.constexpr = BLOCK_N // 2
    cols = tl.arange(0, HALF)
    if HAS_BIAS:
        acc0 += tl.load(bias_ptr + n0 + cols)[None, :]
        acc1 += tl.load(bias_ptr + n0 + HALF + cols)[None, :]
    heads = (pid_n // PAIR_BLOCKS) * HEADS_PER_TILE + cols // PAIRS
    pairs = (pid_n % PAIR_BLOCKS) * PAIRS + cols % PAIRS
    tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    token_ok = tokens < n_tokens
    pair_ok = pairs < HEAD_DIM // 2
    if ROTATE:
        c, s = _cos_sin(tokens, token_ok, pairs, pair_ok, cos_ptr, sin_ptr, coords_ptr,
                        freqs_ptr, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                        ANGLES)
        on = (heads < 2 * HEADS)[None, :]  # q and k heads; v passes through
        y0 = tl.where(on, acc0 * c - acc1 * s, acc0)
        y1 = tl.where(on, acc0 * s + acc1 * c, acc1)
    else:
        y0 = acc0
        y1 = acc1
    ptrs = (out + tokens[:, None] * out_stride_t + heads[None, :] * out_stride_h
            + 2 * pairs[None, :])
    mask = token_ok[:, None] & ((heads < 3 * HEADS) & pair_ok)[None, :]
    tl.store(ptrs, y0.to(out.dtype.element_ty), mask=mask)
    tl.store(ptrs + 1, y1.to(out.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_tokens", "num_programs"])
def _qkv_rope_kernel_ws(
    x, w, out,  # x, W: TMA descriptors (W's box: half a tile); out: a pointer
    bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens, num_programs,
    x_stride_t, w_stride_n, out_stride_t, out_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HIDDEN: tl.constexpr,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    PAIR_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTATE: tl.constexpr,
    ANGLES: tl.constexpr,
    USE_TMA: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Persistent (``num_programs`` programs stride over the tiles), the tile loop
    warp-specialized: a producer warp group issues the next tiles' TMA loads while the
    consumer warp groups multiply and run the epilogue."""
    num_tiles = tl.cdiv(n_tokens, BLOCK_M) * (HEAD_BLOCKS * PAIR_BLOCKS)
    for tile_id in tl.range(tl.program_id(0), num_tiles, num_programs, warp_specialize=True):
        pid_m, pid_n = _tile_coords(tile_id, tl.cdiv(n_tokens, BLOCK_M),
                                    HEAD_BLOCKS * PAIR_BLOCKS, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc0, acc1 = _mainloop_pair_halves(x, w, m0, n0, n_tokens, x_stride_t, w_stride_n,
                                           HIDDEN, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA,
                                           INTERPRETED)
        _pair_epilogue(acc0, acc1, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, m0,
                       n0, pid_n, n_tokens, out_stride_t, out_stride_h, cos_stride_t,
                       cos_stride_d, sin_stride_t, sin_stride_d, HEADS, HEAD_DIM, PAIR_BLOCKS,
                       BLOCK_M, BLOCK_N, HEADS_PER_TILE, HAS_BIAS, ROTATE, ANGLES)


# --------------------------------------------------------------------------
# 6. Launch settings
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class QKVGemmConfig:
    """Launch settings of ``qkv_rope_linear`` (see ``qkv_gemm_config``).

    The defaults: 128x256x64 tiles (16 heads x 8 pairs, Kimi's 36 pairs padded to 40),
    3 stages, 8 warps, group_m 8, the persistent kernel (one program per SM) with the
    subtiled epilogue (a tile rotated and stored in two halves of its heads). What
    ``qkv_gemm_config`` picks on NVIDIA GPUs is ``NVIDIA_QKV_CONFIG`` (the flat layout
    at 128x128, two programs per SM: see there); the history of the heads x pairs
    defaults: on an
    H200 (1152 -> 3 x 16 x 72, bf16, cold, CUDA graphs; ``data/nvidia-h200/
    qkv_gemm_sweep.csv``): the fastest of notebook 05_qkv_gemm's five candidates at
    each of 21,904, 43,808 and 87,616 tokens at commit 2e381e165ba8; at d0cddacf49ec
    (the flat layout among the candidates) the fastest at 87,616 tokens (the encoder's
    16-image bucket), level with the flat layout at 43,808 (p20-p80 overlap) and 0.8%
    slower than it at 21,904. Notebook 05_qkv_gemm re-measures
    ``QKV_CANDIDATE_CONFIGS`` at all three token counts in every GPU run and its
    ``qkv_rope_linear`` rows are the best of them per token count;
    ``tools/qkv_sweep.py`` sweeps more.

    ``warp_specialize=True`` HUNG on an H200 (Triton 3.6; exploration run of
    2026-12-03, 21,904 tokens: no output for ~170 s until a 180 s timeout): do not
    launch it on a GPU; it is tested on the CPU only (interpreter, sm_90 compile)."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    heads_per_tile: int = 16  # a tile: heads_per_tile heads x block_n/(2*heads_per_tile) pairs
    group_m: int = 8
    num_stages: int = 3
    num_warps: int = 8
    persistent: bool = True  # one program per SM striding over the tiles
    epilogue_subtile: bool = True  # rotate and store the tile in two halves of its heads
    use_tma: bool | None = None  # None: TMA where the GPU and the strides allow it
    # ``_qkv_rope_kernel_ws``: persistent, tile loop warp-specialized (Hopper: 4 warps
    # become a producer and two consumer warp groups), even/odd members in two
    # accumulators; needs persistent=True, num_warps=4, TMA, no epilogue_subtile.
    # NOT for GPU use as it stands: on an H200 with Triton 3.6 it HUNG. In an
    # exploration run of tools/qkv_sweep.py (2026-12-03) at 21,904 tokens, the config
    # 128x128x64, 4 stages, 4 warps, persistent, warp_specialize=True printed nothing
    # for ~170 s until the run's 180 s timeout (a hang, or a compile of minutes; not
    # told apart). So no timed list (QKV_CANDIDATE_CONFIGS, QKV_SWEEP_CONFIGS) holds a
    # warp-specialized config and the GPU tests do not launch it; it is kept tested on
    # the CPU only: the interpreter (every path against float64) and an sm_90 compile
    # (QKV_WARP_SPECIALIZED_CONFIGS: producer warp group present, no spills).
    warp_specialize: bool = False
    # The flat layout (``qkv_row_order(flat=True)``): W's rows in their own order, an
    # N tile is block_n consecutive columns of the packed row across head boundaries
    # (heads_per_tile 1), each pair with its own angle (cos/sin gathered per column);
    # only the last tile is padded, and the tile is stored as contiguous columns
    # (2-D TMA box) instead of heads x pairs. H200 exploration, 2026-12-03 (Kimi,
    # 21,904-87,616 tokens): with the rotation compiled out 1.06-1.09x cuBLAS (the
    # heads layout: 1.30-1.33x), with it 1.38-1.41x cuBLAS, level with the heads layout
    # (the per-column cos/sin gathers cost what the store and padding saved). Then the
    # gathers became 16-byte vectors (``_flat_cs``): 1.32-1.41x cuBLAS from the table,
    # 1.27x with the angles computed in-kernel on the SFU (``_cos_sin_of``), in two
    # exploration runs of 2026-12-03; an L1 prefetch of the cos/sin rows before the
    # mainloop gained nothing, and loading a quarter's cos/sin at once spilled.
    flat_pairs: bool = False
    # Persistent grid: programs per SM (1: one per SM). 2 lets one program's epilogue
    # run under the other's mainloop where registers and shared memory allow two
    # (128x128 tiles: ``compile_matrix`` gives both); the launcher does not check
    # occupancy, so a config that cannot hold two just runs them one after the other.
    programs_per_sm: int = 1
    # Flat layout, subtiled: the tile is rotated and stored in this many parts of
    # contiguous columns (8: eighths, the only split of 128x256 on 8 warps without
    # spills on sm_90; 128x128 tiles also compile in quarters and halves).
    epilogue_parts: int = 8

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k", "heads_per_tile", "group_m", "num_warps"):
            _check_power_of_two(f"QKVGemmConfig.{name}", getattr(self, name))
        if min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError("QKVGemmConfig block_m, block_n and block_k must be at least 16 "
                             "(the smallest tensor-core tile)")
        _check_tile_layout(self.block_n, self.heads_per_tile)
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) \
                or self.num_stages < 1:
            raise ValueError(f"QKVGemmConfig.num_stages must be a positive int, "
                             f"got {self.num_stages!r}")
        for name in ("persistent", "epilogue_subtile", "warp_specialize", "flat_pairs"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"QKVGemmConfig.{name} must be a bool, "
                                f"got {type(getattr(self, name)).__name__}")
        if self.flat_pairs:
            if self.heads_per_tile != 1:
                raise ValueError("QKVGemmConfig.flat_pairs takes heads_per_tile=1 (a tile's pairs "
                                 f"run across heads), got {self.heads_per_tile}")
            if self.warp_specialize:
                raise ValueError("QKVGemmConfig.flat_pairs has no warp-specialized kernel")
            if self.block_n < (16 if self.epilogue_subtile else 4):
                raise ValueError("QKVGemmConfig.flat_pairs needs block_n >= 4 (16 with "
                                 "epilogue_subtile: eighths of whole pairs)")
        elif self.epilogue_subtile and self.heads_per_tile < 2:
            raise ValueError("QKVGemmConfig.epilogue_subtile splits a tile's heads in two: "
                             "it needs heads_per_tile >= 2")
        if isinstance(self.programs_per_sm, bool) or not isinstance(self.programs_per_sm, int) \
                or not 1 <= self.programs_per_sm <= 4:
            raise ValueError(f"QKVGemmConfig.programs_per_sm must be an int in 1..4, "
                             f"got {self.programs_per_sm!r}")
        if self.epilogue_parts not in (2, 4, 8) or isinstance(self.epilogue_parts, bool):
            raise ValueError(f"QKVGemmConfig.epilogue_parts must be 2, 4 or 8, "
                             f"got {self.epilogue_parts!r}")
        if self.epilogue_parts != 8 and not (self.flat_pairs and self.epilogue_subtile):
            raise ValueError("QKVGemmConfig.epilogue_parts splits the flat layout's subtiled "
                             "epilogue (flat_pairs=True, epilogue_subtile=True)")
        if self.programs_per_sm > 1 and not self.persistent:
            raise ValueError("QKVGemmConfig.programs_per_sm > 1 is for the persistent grid "
                             "(persistent=True); one program per tile needs none")
        if self.use_tma is not None and not isinstance(self.use_tma, bool):
            raise TypeError("QKVGemmConfig.use_tma must be a bool or None")
        if self.warp_specialize:
            why = [w for w, bad in (("persistent=True", not self.persistent),
                                    ("num_warps=4", self.num_warps != 4),
                                    ("use_tma None or True", self.use_tma is False),
                                    ("epilogue_subtile=False", self.epilogue_subtile)) if bad]
            if why:
                raise ValueError("QKVGemmConfig.warp_specialize (the warp-specialized persistent "
                                 f"kernel) needs {', '.join(why)}")

    @property
    def pairs_per_tile(self) -> int:
        return self.block_n // (2 * self.heads_per_tile)

    @property
    def store_columns(self) -> int:
        """Contiguous columns of one store: a head's share of the tile (heads x pairs
        layout) or the whole tile / its half with ``epilogue_subtile`` (flat pairs)."""
        if self.flat_pairs:  # subtiled: eighths (``_flat_epilogue``)
            return self.block_n // (self.epilogue_parts if self.epilogue_subtile else 1)
        return 2 * self.pairs_per_tile

    @property
    def kernel_name(self) -> str:
        """The name of the Triton kernel this config launches (in this module)."""
        if self.warp_specialize:
            return "_qkv_rope_kernel_ws"
        return "_qkv_rope_kernel_persistent" if self.persistent else "_qkv_rope_kernel"

    @property
    def label(self) -> str:
        """``BMxBNxBKxHPT/stages/warps/group_m`` plus ``/persistent``, ``/ws``,
        ``/subtile``, ``/tma`` or ``/pointers``: how result rows name a config."""
        flags = [f for f, on in (("persistent", self.persistent),
                                 (f"x{self.programs_per_sm}", self.programs_per_sm > 1),
                                 ("ws", self.warp_specialize),
                                 ("subtile" + ("" if self.epilogue_parts == 8 else
                                               str(self.epilogue_parts)),
                                  self.epilogue_subtile),
                                 ("flat", self.flat_pairs),
                                 ("tma", self.use_tma is True),
                                 ("pointers", self.use_tma is False)) if on]
        return "/".join([f"{self.block_m}x{self.block_n}x{self.block_k}x{self.heads_per_tile}",
                         str(self.num_stages), str(self.num_warps), str(self.group_m), *flags])


# Candidates notebook 05_qkv_gemm times on a GPU (its sweep records every one; the
# headline rows of each of our kernels use its fastest of the same run), at most five:
# each costs compiles and time at four token counts in every GPU run. Now: the heads x
# pairs default, the 128x256 flat config (the NVIDIA pick before), ``NVIDIA_QKV_CONFIG``
# and its two closest rivals of the 2026-12-03 explorations (quarters with group_m 8;
# one program per tile, the whole tile at once: the fastest from the table). Before: The heads x pairs default (persistent
# 128x256x64, 3 stages, 8 warps, subtiled epilogue: two halves of the tile's heads, fewer
# live registers) and what might beat it on Kimi's short K (1152 = 18 steps of 64, so the
# epilogue is a large share of a tile and wants to overlap another tile's mainloop): the
# same config one program per tile, no subtiling (the default before 2026-12-03); the
# persistent grid without subtiling; 4 stages,
# one program per tile (196 KB of shared memory at sm_90; persistent it needs 266 KB,
# more than an H200's 227 KB); 128x128 tiles with one warp group, one program
# per tile (98 KB, 166 registers at sm_90: two programs per SM, one's epilogue under
# the other's mainloop). Left out after the H200 exploration run of 2026-12-03 (21,904
# tokens): 256x128 tiles (1.27x the former default's time; again 1.35-1.42x in a run
# of 2026-12-03 at 21,904-87,616 tokens) and every warp-specialized config (it hung:
# see QKVGemmConfig.warp_specialize). The flat layout (persistent, subtiled) replaced
# the one-program-per-tile 128x128 candidate (the slowest of the five at all three
# token counts in the 2e381e165ba8 run) after an exploration run put it level with
# the default. block_n and heads_per_tile become the layout of least padding at that
# width (``with_layout``; a flat config stays as it is).
# What ``qkv_gemm_config`` picks on NVIDIA GPUs: the flat layout at 128x128x64 on one
# warp group (4 warps), 3 stages, the persistent grid with two programs per SM (98 KB of
# shared memory and 168 registers each at sm_90 with the angles: two fit an SM, so one
# program's epilogue runs under the other's mainloop), the epilogue in eighths, group_m
# 16. In two H200 exploration runs of 2026-12-03 (the second session's) (tools/qkv_sweep.py, Kimi 1152 -> 3 x
# 16 x 72, bf16, cold, CUDA graphs) the 128x128 two-programs-per-SM configs were the
# fastest with the angles computed in-kernel: this one 284.7 / 558.4 / 1156.2 us at
# 21,904 / 43,808 / 87,616 tokens (0.979 / 0.966 / 0.999x cuBLAS + fused RoPE of the same
# run) against the 128x256 flat config's 311.5 / 603.0 / 1210.9 us (1.071 / 1.053 /
# 1.045x) in the run before.
NVIDIA_QKV_CONFIG = QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                                  group_m=16, programs_per_sm=2)

QKV_CANDIDATE_CONFIGS = (
    QKVGemmConfig(),
    QKVGemmConfig(heads_per_tile=1, flat_pairs=True),
    NVIDIA_QKV_CONFIG,
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  programs_per_sm=2, epilogue_parts=4),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  persistent=False, epilogue_subtile=False),
)

# What ``tools/qkv_sweep.py`` times on a GPU: the candidates above and their
# neighbours, one program per tile (subtiled epilogue, BLOCK_K 128, one warp
# group at 128x128 with 4 or 2 stages and at 64x256 with 2 stages: two or three
# programs per SM). No warp-specialized config (it hung on an H200). Every entry
# compiles for sm_90 without spills in tests/test_qkv_gemm.py.
QKV_SWEEP_CONFIGS = tuple(dict.fromkeys(QKV_CANDIDATE_CONFIGS + (
    QKVGemmConfig(persistent=False, epilogue_subtile=True),
    QKVGemmConfig(persistent=False, block_k=128, num_stages=2, epilogue_subtile=False),
    QKVGemmConfig(persistent=False, block_n=128, num_warps=4, num_stages=4,
                  epilogue_subtile=False),
    QKVGemmConfig(persistent=False, block_n=128, num_warps=4, num_stages=2,
                  epilogue_subtile=False),
    QKVGemmConfig(persistent=False, block_m=64, num_warps=4, num_stages=2,
                  epilogue_subtile=False),
    # the flat layout (no padding but the last tile's; per-column angles), its
    # epilogue in eighths (whole, in halves or quarters its cos/sin spill on sm_90)
    QKVGemmConfig(block_n=128, num_warps=4, persistent=False, epilogue_subtile=False),
    QKVGemmConfig(heads_per_tile=1, flat_pairs=True, persistent=False),
    QKVGemmConfig(heads_per_tile=1, flat_pairs=True, num_stages=4),
    QKVGemmConfig(heads_per_tile=1, flat_pairs=True, num_stages=4, persistent=False),
    # the flat layout at 128x128, two programs per SM (sm_90 compile, angles kernel:
    # 8 warps 96 registers, 4 warps 168 (subtiled) / 254 (whole); 98 KB of shared
    # memory): one program's epilogue under the other's mainloop
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, persistent=False),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  persistent=False),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  persistent=False, epilogue_subtile=False),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, programs_per_sm=2),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  programs_per_sm=2),
    # 64x256 on one warp group, 2 stages (82 KB, 166 registers): two programs per SM
    QKVGemmConfig(block_m=64, heads_per_tile=1, flat_pairs=True, num_warps=4, num_stages=2,
                  persistent=False),
    # 128x128 on one warp group, two programs per SM, fewer and wider stores
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4, num_stages=2,
                  programs_per_sm=2, epilogue_subtile=False),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  programs_per_sm=2, epilogue_parts=4),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  persistent=False, epilogue_parts=4),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4,
                  persistent=False, epilogue_parts=2),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4, group_m=16,
                  programs_per_sm=2),
    QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True, num_warps=4, group_m=4,
                  programs_per_sm=2),
    # the heads x pairs layout's former defaults
    QKVGemmConfig(persistent=False, epilogue_subtile=False),
    QKVGemmConfig(epilogue_subtile=False),
    QKVGemmConfig(persistent=False, num_stages=4, epilogue_subtile=False),
)))

# Tried on an H200 on 2026-12-04 and taken out again (Kimi 1152 -> 3 x 16 x 72, bf16,
# cold, CUDA graphs, tools/qkv_sweep.py; the code is in the commits named):
# - 192-wide flat tiles as a 128- and a 64-column accumulator (the width of cuBLAS's and
#   QuACK's fastest configs; a third fewer x reads from L2; commit f7b8d4d): with the
#   rotation compiled out 1.37-1.68x cuBLAS at 87,616 and 21,904 tokens (one warp group,
#   BLOCK_K 32, two programs per SM: 255 registers, 1.40-1.47x; 256x192 on two warp
#   groups: 1.37x) against this default's 1.10-1.13x in the same run (a reading, not
#   profiled: the second accumulator's wgmma reads the x tile from shared memory again,
#   and one program per SM leaves the epilogue unhidden).
# - Stores in quarters rotated in eighths (``rotation_parts``, commit d09e92f): the
#   quarters' faster stores (rotation compiled out 5-9% under eighths) did not survive the
#   rotation: with the angles level with this default within the two sweeps' spread
#   (87,616 tokens: 1085.8 / 1134.6 us against 1115.8 / 1115.8).
# tools/qkv_power.py (back to back at 87,616 tokens, no flush) found every GEMM here at
# the H200's 700 W cap (676-693 W, SM clock 1380-1485 of 1980 MHz); in clock cycles a
# call, this default with the rotation compiled out is level with cuBLAS (0.99x), QuACK's
# plain GEMM takes 0.86x, and with the rotation ours takes 1.14x QuACK's RoPE epilogue.
# QuACK's recipe (128x192 tiles in pingpong, W multicast over a 2x1 cluster) is not
# expressible in Triton 3.6: tl.range's warp_specialize is Blackwell-only, and Gluon,
# which has Hopper warp specialization, takes power-of-two tensor shapes only ("Shape
# element 1 must be a power of 2" for a 128x192 wgmma accumulator, sm_90 compile) and its
# Hopper TMA copy has no multicast.

# The warp-specialized kernel's configs, compiled for sm_90 (tests/test_qkv_gemm.py:
# the producer warp group exists, no spills) and never launched on a GPU: the first of
# them hung on an H200 (see QKVGemmConfig.warp_specialize).
QKV_WARP_SPECIALIZED_CONFIGS = (
    QKVGemmConfig(block_n=128, num_warps=4, num_stages=4, warp_specialize=True,
                  epilogue_subtile=False),
    QKVGemmConfig(block_n=128, num_warps=4, warp_specialize=True, epilogue_subtile=False),
    QKVGemmConfig(block_n=128, block_k=128, num_stages=2, num_warps=4, warp_specialize=True,
                  epilogue_subtile=False),
)


def tile_layout(heads: int, head_dim: int, widths=(128, 64), min_pairs: int = 1) -> tuple[int, int]:
    """(block_n, heads_per_tile) with the fewest zero-padded weight rows.

    A tile is heads_per_tile heads x pairs_per_tile pairs; heads are padded to
    a multiple of heads_per_tile and pairs to a multiple of pairs_per_tile.
    Ties go to the wider tile, then to more heads per tile (fewer angles).
    Kimi (16 x 72): (128, 16), 16 heads x 4 pairs, no padding."""
    half = head_dim // 2
    best = None
    for block_n in widths:
        hpt = 1
        while 2 * hpt <= block_n:
            ppt = block_n // (2 * hpt)
            if ppt >= min_pairs:
                rows = (triton.cdiv(3 * heads, hpt) * hpt) * (triton.cdiv(half, ppt) * ppt)
                key = (rows, -block_n, -hpt)
                if best is None or key < best[0]:
                    best = (key, block_n, hpt)
            hpt *= 2
    return best[1], best[2]


def qkv_gemm_config(heads: int, head_dim: int, device: torch.device,
                    element_size: int = 2, *, amd: bool | None = None) -> QKVGemmConfig:
    """A documented heuristic, no autotuning at first call.

    NVIDIA GPUs: ``NVIDIA_QKV_CONFIG``, the flat layout (``flat_pairs``: W in its own
    order, only the last N tile padded, whatever the heads) at 128x128x64 on 4 warps,
    persistent with two programs per SM, epilogue in eighths, group_m 16: the fastest
    with in-kernel angles in the H200 exploration runs of 2026-12-03 (see there; the
    128x256 flat config before it had beaten the heads x pairs layout: 314.0 / 647.4 /
    1341.2 us against 342.2 / 686.4 / 1408.1 at 21,904 / 43,808 / 87,616 tokens); not
    measured at other head counts. AMD GPUs (``amd``; None: ROCm
    builds of torch): 128-wide N tiles (layout of least padding at 128 or 64) with
    2 stages, so the operand buffers fit the 64 KB of LDS of MI300X/MI250 (the
    NVIDIA tiles need 96 KB at 2 stages: the compile matrix's shared bytes), one
    program per tile (the persistent grid's gain was measured on an H200 only); not
    measured on an AMD GPU. The CPU interpreter: small tiles, one program per tile
    (its cost grows with the tile count and size, not with the GEMM's efficiency;
    the persistent kernel has its own CPU tests)."""
    if device.type == "cpu":
        block_n, hpt = tile_layout(heads, head_dim, widths=(64,))
        return QKVGemmConfig(block_m=32, block_n=block_n, block_k=32, heads_per_tile=hpt,
                             group_m=1, num_stages=1, num_warps=4, persistent=False,
                             epilogue_subtile=False)
    if amd is None:
        amd = bool(getattr(torch.version, "hip", None))
    if amd:
        block_n, hpt = tile_layout(heads, head_dim, widths=(128, 64),
                                   min_pairs=max(1, 8 // element_size))
        return QKVGemmConfig(block_n=block_n, heads_per_tile=hpt, num_stages=2,
                             persistent=False, epilogue_subtile=False)
    return NVIDIA_QKV_CONFIG


def with_layout(config: QKVGemmConfig, heads: int, head_dim: int,
                element_size: int = 2) -> QKVGemmConfig:
    """``config`` with the N-tile layout ``qkv_gemm_config`` picks for this shape
    (a flat-pairs config fits every shape as it is)."""
    if not isinstance(config, QKVGemmConfig):
        raise TypeError(f"config must be a QKVGemmConfig, got {type(config).__name__}")
    if config.flat_pairs:
        return config
    block_n, hpt = tile_layout(heads, head_dim, widths=(config.block_n,),
                               min_pairs=max(1, 8 // element_size))
    subtile = config.epilogue_subtile and hpt >= 2
    return QKVGemmConfig(**{**config.__dict__, "block_n": block_n, "heads_per_tile": hpt,
                            "epilogue_subtile": subtile})


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


def _check_common(x, w_qkv, b_qkv, head_dim: int, what: str):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (tokens, hidden), got shape {tuple(x.shape)}")
    if x.dtype not in GEMM_DTYPES:
        raise TypeError(f"x must be bfloat16 or float16, got {x.dtype}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"x must have a unit-stride last dimension, got strides {tuple(x.stride())}")
    if not isinstance(w_qkv, torch.Tensor):
        raise TypeError(f"w_qkv must be a torch.Tensor, got {type(w_qkv).__name__}")
    if w_qkv.dtype != x.dtype:
        raise TypeError(f"w_qkv dtype {w_qkv.dtype} differs from x dtype {x.dtype}")
    if w_qkv.dim() != 2 or w_qkv.shape[1] != x.shape[1]:
        raise ValueError(f"w_qkv must have shape (3*heads*head_dim, {x.shape[1]}) for x of "
                         f"shape {tuple(x.shape)}, got {tuple(w_qkv.shape)}")
    if w_qkv.device != x.device:
        raise ValueError(f"w_qkv is on {w_qkv.device} but x is on {x.device}")
    if head_dim == 0 or w_qkv.shape[0] % (3 * head_dim):
        raise ValueError(f"{what} implies head_dim {head_dim}, which does not divide the "
                         f"{w_qkv.shape[0] // 3} columns of each of q, k, v")
    heads = w_qkv.shape[0] // (3 * head_dim)
    _check_qkv_weight(w_qkv, b_qkv, heads, head_dim)
    return heads, head_dim


def _check_table(name: str, t, tokens: int, half: int, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (math is done in fp32), got {t.dtype}")
    if t.dim() != 2 or t.shape[0] != tokens:
        raise ValueError(f"{name} must have shape (tokens, head_dim/2) with tokens={tokens}, "
                         f"got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")


def qkv_rope_linear(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    config: QKVGemmConfig | None = None,
    permuted: PermutedQKVWeight | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rope(x @ w_qkv^T + b_qkv)`` in one kernel: packed qkv (T, 3, H, D), q and k rotated.

    Args:
        x: (T, hidden) bf16/fp16, unit last stride.
        w_qkv: (3*H*D, hidden), contiguous, x's dtype; b_qkv: (3*H*D,) or None.
        cos, sin: fp32 (T, D/2), any strides (e.g. ``cos_sin_views(freqs_cis)``);
            D is read from their width, H from w_qkv.
        config: launch settings; ``qkv_gemm_config`` by default.
        permuted: the weight in the kernel's order (``permute_qkv_weight``), built
            once where the weights are loaded; omitted, W is permuted on every
            call (one gather of W; nothing is cached, so nothing can go stale).
        out: optional preallocated (T, 3, H, D) contiguous output that shares
            no memory with any input.
    """
    heads, head_dim = _check_cos_sin(x, w_qkv, b_qkv, cos, sin)
    return _launch(x, w_qkv, b_qkv, heads, head_dim, config, permuted, out,
                   cos=cos, sin=sin, coords=None, freqs=None, rotate=True)


def qkv_rope_linear_angles(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    coords: torch.Tensor,
    freqs: torch.Tensor,
    *,
    config: QKVGemmConfig | None = None,
    permuted: PermutedQKVWeight | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``qkv_rope_linear`` with angles computed in-kernel instead of read from a table.

    Args:
        coords: int32 (T, 2) contiguous, each token's (row, column) in its
            image's patch grid (``vision_patch_coords``).
        freqs: fp32 (D/4,) contiguous, Kimi's frequencies
            (``vision_rope_frequencies``); D is read from its length.
    """
    if not isinstance(freqs, torch.Tensor):
        raise TypeError(f"freqs must be a torch.Tensor, got {type(freqs).__name__}")
    if freqs.dtype != torch.float32 or freqs.dim() != 1 or not freqs.is_contiguous():
        raise ValueError(f"freqs must be a contiguous float32 vector (head_dim/4,), got "
                         f"{freqs.dtype} of shape {tuple(freqs.shape)}")
    heads, head_dim = _check_common(x, w_qkv, b_qkv, 4 * freqs.shape[0], "freqs (head_dim/4,)")
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"coords must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype != torch.int32:
        raise TypeError(f"coords must be int32 (row, column) pairs, got {coords.dtype}")
    if tuple(coords.shape) != (x.shape[0], 2) or not coords.is_contiguous():
        raise ValueError(f"coords must be contiguous with shape (tokens, 2) = ({x.shape[0]}, 2), "
                         f"got {tuple(coords.shape)}")
    for name, t in (("coords", coords), ("freqs", freqs)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    return _launch(x, w_qkv, b_qkv, heads, head_dim, config, permuted, out,
                   cos=None, sin=None, coords=coords, freqs=freqs, rotate=True)


def qkv_linear_rotation_compiled_out(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    config: QKVGemmConfig | None = None,
    permuted: PermutedQKVWeight | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Benchmarks only: ``qkv_rope_linear``'s kernel and config with the rotation
    compiled out, so q and k are NOT rotated (packed ``x @ w_qkv^T + b_qkv``). Timed
    beside ``qkv_rope_linear`` at the same config it splits the mainloop's time
    from the epilogue's. Takes (and checks) the same arguments."""
    heads, head_dim = _check_cos_sin(x, w_qkv, b_qkv, cos, sin)
    return _launch(x, w_qkv, b_qkv, heads, head_dim, config, permuted, out,
                   cos=cos, sin=sin, coords=None, freqs=None, rotate=False)


def _check_cos_sin(x, w_qkv, b_qkv, cos, sin) -> tuple[int, int]:
    """All checks of a table call; (heads, head_dim)."""
    if not isinstance(cos, torch.Tensor) or cos.dim() != 2:
        raise ValueError("cos must be a 2-D (tokens, head_dim/2) float32 tensor")
    heads, head_dim = _check_common(x, w_qkv, b_qkv, 2 * cos.shape[1], "cos (tokens, head_dim/2)")
    for name, t in (("cos", cos), ("sin", sin)):
        _check_table(name, t, x.shape[0], head_dim // 2, x.device)
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin differ in shape: {tuple(cos.shape)} vs {tuple(sin.shape)}")
    return heads, head_dim


def _check_out(out, shape, x, inputs: dict) -> None:
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != x.dtype \
            or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {shape} on {x.device}")
    for name, t in inputs.items():
        if t is not None and may_overlap(out, t):
            raise ValueError(f"out shares memory with {name}; give an out that overlaps no input "
                             "(the kernel reads inputs while other tiles write out)")


def _launch(x, w_qkv, b_qkv, heads, head_dim, config, permuted, out, *, cos, sin, coords, freqs,
            rotate: bool):
    """Checks, layout and launch of one of the three kernels (``config.persistent``,
    ``config.warp_specialize``)."""
    tokens, hidden = x.shape
    if config is None:
        config = qkv_gemm_config(heads, head_dim, x.device, x.element_size())
    elif not isinstance(config, QKVGemmConfig):
        raise TypeError(f"config must be a QKVGemmConfig, got {type(config).__name__}")
    if permuted is None:
        permuted = permute_qkv_weight(w_qkv, b_qkv, heads, head_dim, block_n=config.block_n,
                                      heads_per_tile=config.heads_per_tile,
                                      flat=config.flat_pairs)
    elif not isinstance(permuted, PermutedQKVWeight):
        raise TypeError(f"permuted must be a PermutedQKVWeight, got {type(permuted).__name__}")
    if (permuted.heads, permuted.head_dim) != (heads, head_dim) \
            or permuted.weight.shape[1] != hidden or permuted.weight.dtype != x.dtype \
            or permuted.weight.device != x.device:
        raise ValueError("permuted weight was built for another shape, dtype or device "
                         f"({permuted.heads} heads x {permuted.head_dim}, "
                         f"{tuple(permuted.weight.shape)} {permuted.weight.dtype})")
    if (permuted.block_n, permuted.heads_per_tile, permuted.flat) \
            != (config.block_n, config.heads_per_tile, config.flat_pairs):
        raise ValueError(f"permuted weight layout (block_n={permuted.block_n}, heads_per_tile="
                         f"{permuted.heads_per_tile}, flat={permuted.flat}) does not match the "
                         f"config (block_n={config.block_n}, heads_per_tile="
                         f"{config.heads_per_tile}, flat_pairs={config.flat_pairs})")
    if (b_qkv is None) != (permuted.bias is None):
        raise ValueError("permuted weight and b_qkv disagree on whether there is a bias")

    shape = (tokens, 3, heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    else:
        _check_out(out, shape, x, {"x": x, "w_qkv": w_qkv, "b_qkv": b_qkv, "cos": cos,
                                   "sin": sin, "coords": coords, "freqs": freqs,
                                   "permuted.weight": permuted.weight,
                                   "permuted.bias": permuted.bias})
    if tokens == 0:
        return out
    check_triton_device(x, "qkv_rope_linear")

    # the store's view: (T, 3H, D) heads, or (T, 3H x D) rows for the flat-pairs layout
    out_heads = (out.view(tokens, 3 * heads * head_dim) if config.flat_pairs
                 else out.view(tokens, 3 * heads, head_dim))
    use_tma = config.use_tma
    if config.warp_specialize:
        # x and W through TMA, the output through pointers (see _qkv_rope_kernel_ws);
        # use_tma=True: the caller vouches for the device (the compile matrix's meta tensors)
        if use_tma is None and not (tma_supported(x.device) and _tma_aligned(x, permuted.weight)):
            raise ValueError("config.warp_specialize needs TMA loads: an NVIDIA GPU of compute "
                             "capability 9.0+ (or the interpreter) and 16-byte aligned x and W")
        use_tma = True
    elif use_tma is None:
        use_tma = (tma_supported(x.device) and _tma_aligned(x, permuted.weight, out_heads)
                   and config.store_columns * x.element_size() >= 16)
    store_heads = config.heads_per_tile // (2 if config.epilogue_subtile else 1)
    if use_tma and not config.warp_specialize and config.store_columns * x.element_size() < 16:
        raise ValueError(f"config.use_tma: a TMA store box needs at least 16 bytes a row; this "
                         f"config stores {config.store_columns} columns at a time "
                         f"({config.store_columns * x.element_size()} bytes): widen block_n or "
                         "leave use_tma None")
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bk = config.block_m, config.block_k
        w_rows = config.block_n // (2 if config.warp_specialize else 1)
        x_arg = TensorDescriptor.from_tensor(x, [bm, bk])
        w_arg = TensorDescriptor.from_tensor(permuted.weight, [w_rows, bk])
        box = ([bm, config.store_columns] if config.flat_pairs
               else [bm, store_heads, config.store_columns])
        out_arg = (out_heads if config.warp_specialize
                   else TensorDescriptor.from_tensor(out_heads, box))
    else:
        x_arg, w_arg, out_arg = x, permuted.weight, out_heads

    num_tiles = triton.cdiv(tokens, config.block_m) * permuted.head_blocks * permuted.pair_blocks
    angles = coords is not None
    # in-kernel angles: the SFU's cos/sin on CUDA GPUs, tl.cos/tl.sin elsewhere
    fast = not triton_interpreter_enabled() and torch.version.hip is None
    angles_mode = (ANGLES_FAST if fast else ANGLES_PRECISE) if angles else ANGLES_TABLE
    table = freqs if angles else cos  # fp32 stand-ins for the inputs a variant does not read
    args = (x_arg, w_arg, out_arg,
            permuted.bias if permuted.bias is not None else table,
            table if angles else cos, table if angles else sin,
            coords if angles else table, table if not angles else freqs,
            tokens)
    interleaved = config.flat_pairs and not angles and interleaved_cos_sin(cos, sin)
    # the flat epilogue's cos/sin vectors: runs of n % head_dim inside a store's columns
    cs_vec = cos_sin_vector(cos, sin, head_dim, config.store_columns) if interleaved else 1
    strides = (x.stride(0), permuted.weight.stride(0), out_heads.stride(0),
               0 if config.flat_pairs else out_heads.stride(1),
               0 if angles else cos.stride(0) // cs_vec, 0 if angles else cos.stride(1),
               0 if angles else sin.stride(0), 0 if angles else sin.stride(1))
    meta = dict(HIDDEN=hidden, HEADS=heads, HEAD_DIM=head_dim, HEAD_BLOCKS=permuted.head_blocks,
                PAIR_BLOCKS=permuted.pair_blocks, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                BLOCK_K=config.block_k, HEADS_PER_TILE=config.heads_per_tile,
                GROUP_M=config.group_m, HAS_BIAS=permuted.bias is not None, ROTATE=rotate,
                ANGLES=angles_mode, USE_TMA=use_tma,
                # the flat layout's subtiled epilogue: its parts (an int); else a bool
                EPILOGUE_SUBTILE=(config.epilogue_parts if config.flat_pairs and
                                  config.epilogue_subtile else config.epilogue_subtile),
                INTERPRETED=triton_interpreter_enabled(), FLAT=config.flat_pairs,
                INTERLEAVED=interleaved, CS_VEC=cs_vec, num_warps=config.num_warps,
                num_stages=config.num_stages)
    if config.warp_specialize:
        del meta["EPILOGUE_SUBTILE"], meta["FLAT"], meta["INTERLEAVED"], meta["CS_VEC"]
        programs = min(num_tiles, _num_sms(x.device))
        _qkv_rope_kernel_ws[(programs,)](*args, programs, *strides, **meta)
    elif config.persistent:
        programs = min(num_tiles, config.programs_per_sm * _num_sms(x.device))
        _qkv_rope_kernel_persistent[(programs,)](*args, programs, *strides, **meta)
    else:
        _qkv_rope_kernel[(num_tiles,)](*args, *strides, **meta)
    return out


def rotating_qkv_projection(linear: torch.nn.Linear, x: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, heads: int, *,
                            permuted: PermutedQKVWeight | None = None,
                            angles: tuple[torch.Tensor, torch.Tensor] | None = None
                            ) -> torch.Tensor:
    """``qkv_rope_linear`` for a model's QKV ``nn.Linear``: packed (T, 3, H, D), q/k rotated.

    Reads ``linear.weight`` and ``linear.bias`` as they are at each call: without
    ``permuted`` the weight is permuted on every call (one gather of W, or none where
    the flat layout's tiles are W's own order, as at Kimi's 3456 rows; nothing kept
    on the module), so replacing or updating the parameters in any way is always
    seen. A caller that permutes once (``permute_qkv_weight`` with
    ``qkv_gemm_config``'s layout) passes it as ``permuted`` and owns its freshness.
    ``angles`` = (coords, freqs): the angles computed in-kernel
    (``qkv_rope_linear_angles``) instead of read from cos/sin (which give head_dim)."""
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
    if not isinstance(cos, torch.Tensor) or cos.dim() != 2:
        raise ValueError("cos must be a 2-D (tokens, head_dim/2) float32 tensor")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    head_dim = 2 * cos.shape[-1]
    config = qkv_gemm_config(heads, head_dim, x.device, x.element_size())
    if angles is not None:  # (coords, freqs): qkv_rope_linear_angles, cos/sin unread
        if not isinstance(angles, tuple) or len(angles) != 2:
            raise TypeError("angles must be a (coords, freqs) tuple")
        return qkv_rope_linear_angles(x, linear.weight, linear.bias, *angles, config=config,
                                      permuted=permuted)
    return qkv_rope_linear(x, linear.weight, linear.bias, cos, sin, config=config,
                           permuted=permuted)
