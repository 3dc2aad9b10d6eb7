"""RoPE for free: the QKV projection rotates q and k in its epilogue.

``qkv = rope(x @ W^T + b)`` in one Triton kernel: a GEMM whose output tile is
rotated in fp32 registers before it is written, so q and k never travel through
memory unrotated (the standalone RoPE kernel reads and writes them again).

Layout. Kimi's pairs are adjacent columns ``(2j, 2j+1)`` of each head. The
packed output (T, 3, H, D) is viewed as (T, 3H, D): 3H heads (q, then k, then
v). An output tile covers ``heads_per_tile`` consecutive heads x the same
``pairs_per_tile`` pairs ``j`` of each head (Kimi: 16 heads x 4 pairs = 128
columns; 36 pairs a head = 9 pair blocks, 48 heads = 3 head blocks, 27 tiles,
no padding). ``permute_qkv_weight`` reorders W's rows (once per weight) so that
a tile's accumulator columns are ``[even members | odd members]`` of its pairs:
splitting the tile in half stays in registers, the rotation is elementwise,
``join`` restores the interleaved order, and the kernel stores to the ordinary
(T, 3, H, D) addresses: nothing downstream changes. Because all heads of a tile
share the pairs ``j``, a tile needs cos/sin for only (tokens x pairs_per_tile)
angles, broadcast over its heads: the table variant reads 32 bytes a token per
tile, the angles variant computes 4 sin/cos a token per tile from the token's
patch (row, column) and Kimi's frequencies (``freqs.vision_rope_frequencies``:
``angle = col * f[j//2]`` for even j, ``row * f[j//2]`` for odd j, the same
single fp32 multiply as the table). v heads take the same path with the
rotation switched off per head (a select, exact), so every tile runs the same
code: no branch in the persistent loop, which Triton 3.6's loop flattening
needs. Heads and pairs are padded with zero rows to whole tiles when needed.

Loads. On Hopper and newer GPUs, tiles of x and W come through TMA tensor
descriptors and the output leaves through a 3-D descriptor (T, 3H, D) whose
bounds clip the padded heads/pairs and the last token tile; elsewhere
(pre-Hopper, or strides TMA cannot take) the same kernel uses masked pointer
loads and stores. A persistent grid (one program per SM, tiles strided over
them, the tile loop flattened with the K loop) lets Triton's pipeliner fetch
the next tile's operands while the epilogue runs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import check_triton_device, triton_interpreter_enabled

GEMM_DTYPES = (torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------
# Weight layout
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

    @property
    def pairs_per_tile(self) -> int:
        return self.block_n // (2 * self.heads_per_tile)

    @property
    def head_blocks(self) -> int:
        return triton.cdiv(3 * self.heads, self.heads_per_tile)

    @property
    def pair_blocks(self) -> int:
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


def qkv_row_order(heads: int, head_dim: int, block_n: int, heads_per_tile: int) -> torch.Tensor:
    """Source row of W for every row of the permuted weight (-1: a zero pad row).

    Tile ``(head block hb, pair block jb)`` is rows ``(hb * pair_blocks + jb) *
    block_n ...``; inside it, row ``r`` is member ``r // (block_n/2)`` (0 even,
    1 odd) of pair ``jb * pairs_per_tile + r % pairs_per_tile`` of head
    ``hb * heads_per_tile + (r // pairs_per_tile) % heads_per_tile``; heads
    run over q, k, v (3H of them)."""
    _check_tile_layout(block_n, heads_per_tile)
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


def permute_qkv_weight(
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    heads: int,
    head_dim: int,
    *,
    block_n: int = 128,
    heads_per_tile: int = 16,
) -> PermutedQKVWeight:
    """Reorder W_qkv (3*H*D, hidden) and b_qkv for ``qkv_rope_linear`` (once per weight).

    ``block_n``: the GEMM's N tile; ``heads_per_tile``: heads sharing a tile
    (``block_n / (2 * heads_per_tile)`` pairs of each). Inverse:
    ``unpermute_qkv_weight``."""
    _check_qkv_weight(w_qkv, b_qkv, heads, head_dim)
    order = qkv_row_order(heads, head_dim, block_n, heads_per_tile).to(w_qkv.device)
    keep = order >= 0
    src = order.clamp(min=0)
    zero = torch.zeros((), dtype=w_qkv.dtype, device=w_qkv.device)
    weight = torch.where(keep[:, None], w_qkv[src], zero)
    bias = None
    if b_qkv is not None:
        bias = torch.where(keep, b_qkv.float()[src], torch.zeros((), device=b_qkv.device))
    return PermutedQKVWeight(weight.contiguous(), bias, heads, head_dim, block_n, heads_per_tile)


def unpermute_qkv_weight(permuted: PermutedQKVWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The original (W_qkv, b_qkv as fp32) back from a permuted weight."""
    order = qkv_row_order(permuted.heads, permuted.head_dim, permuted.block_n,
                          permuted.heads_per_tile).to(permuted.weight.device)
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


# Permuted weights per source weight, built once: keyed on the weight tensor's
# identity (the entry is dropped when the weight is freed) and checked against
# the tensors' version counters, so an in-place update of W or b rebuilds it.
_PERMUTED: dict[int, tuple[weakref.ref, dict]] = {}


def cached_permuted_weight(w_qkv, b_qkv, heads, head_dim, *, block_n,
                           heads_per_tile) -> PermutedQKVWeight:
    """``permute_qkv_weight`` memoised per (weight, bias, layout)."""
    entry = _PERMUTED.get(id(w_qkv))
    if entry is None or entry[0]() is not w_qkv:
        entry = (weakref.ref(w_qkv), {})
        _PERMUTED[id(w_qkv)] = entry
        weakref.finalize(w_qkv, _PERMUTED.pop, id(w_qkv), None)
    per_weight = entry[1]
    key = (id(b_qkv), heads, head_dim, block_n, heads_per_tile)
    versions = (w_qkv._version, None if b_qkv is None else b_qkv._version)
    hit = per_weight.get(key)
    if hit is not None and hit[0] == versions and hit[1]() is b_qkv:
        return hit[2]
    permuted = permute_qkv_weight(w_qkv, b_qkv, heads, head_dim, block_n=block_n,
                                  heads_per_tile=heads_per_tile)
    bias_ref = (lambda: None) if b_qkv is None else weakref.ref(b_qkv)
    per_weight[key] = (versions, bias_ref, permuted)
    return permuted


# --------------------------------------------------------------------------
# Kernel
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
def _cos_sin(tokens, token_ok, pairs, pair_ok, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
             cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, ANGLES: tl.constexpr):
    """cos/sin (BLOCK_M, PAIRS) of the tile's pairs for each token, fp32."""
    if ANGLES:
        # Kimi: pair 2i turns by col * f_i, pair 2i+1 by row * f_i (one fp32 multiply)
        row = tl.load(coords_ptr + tokens * 2, mask=token_ok, other=0).to(tl.float32)
        col = tl.load(coords_ptr + tokens * 2 + 1, mask=token_ok, other=0).to(tl.float32)
        f = tl.load(freqs_ptr + pairs // 2, mask=pair_ok, other=0.0)
        pos = tl.where((pairs % 2 == 0)[None, :], col[:, None], row[:, None])
        angle = pos * f[None, :]
        c = tl.cos(angle)
        s = tl.sin(angle)
    else:
        mask = token_ok[:, None] & pair_ok[None, :]
        c = tl.load(cos_ptr + tokens[:, None] * cos_stride_t + pairs[None, :] * cos_stride_d,
                    mask=mask, other=1.0)
        s = tl.load(sin_ptr + tokens[:, None] * sin_stride_t + pairs[None, :] * sin_stride_d,
                    mask=mask, other=0.0)
    return c, s


@triton.jit
def _dot(a, b, acc, INTERPRETED: tl.constexpr):
    """acc + a @ b^T. Triton 3.6's interpreter multiplies bf16 blocks as raw
    uint16 bits; there the exact fp32 values are multiplied instead (bf16 and
    fp16 products are exact in fp32, so the result is the GPU's)."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32).T, acc, input_precision="ieee")
    return tl.dot(a, b.T, acc)


@triton.jit
def _qkv_tile(
    tile_id, x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr, n_tokens,
    x_stride_t, w_stride_n, out_stride_t, out_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HIDDEN: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROTATED_HEADS: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr, PAIR_BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr,
    ANGLES: tl.constexpr, USE_TMA: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) output tile: K loop, bias, rotation, store."""
    PAIRS: tl.constexpr = BLOCK_N // (2 * HEADS_PER_TILE)
    pid_m, pid_n = _tile_coords(tile_id, tl.cdiv(n_tokens, BLOCK_M), HEAD_BLOCKS * PAIR_BLOCKS,
                                GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if USE_TMA:
        for ki in range(tl.cdiv(HIDDEN, BLOCK_K)):
            a = x.load([m0, ki * BLOCK_K])
            b = w.load([n0, ki * BLOCK_K])
            acc = _dot(a, b, acc, INTERPRETED)
    else:
        rows = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        wrows = n0 + tl.arange(0, BLOCK_N).to(tl.int64)
        for ki in range(tl.cdiv(HIDDEN, BLOCK_K)):
            ks = ki * BLOCK_K + tl.arange(0, BLOCK_K)
            a = tl.load(x + rows[:, None] * x_stride_t + ks[None, :],
                        mask=(rows < n_tokens)[:, None] & (ks < HIDDEN)[None, :], other=0.0)
            b = tl.load(w + wrows[:, None] * w_stride_n + ks[None, :],
                        mask=(ks < HIDDEN)[None, :], other=0.0)
            acc = _dot(a, b, acc, INTERPRETED)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n0 + tl.arange(0, BLOCK_N))[None, :]

    head0 = (pid_n // PAIR_BLOCKS) * HEADS_PER_TILE
    pair0 = (pid_n % PAIR_BLOCKS) * PAIRS
    # columns [0, BLOCK_N/2) hold the even members of the tile's pairs, the rest the odd
    x0, x1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
    x0 = tl.reshape(x0, (BLOCK_M, HEADS_PER_TILE, PAIRS))
    x1 = tl.reshape(x1, (BLOCK_M, HEADS_PER_TILE, PAIRS))
    tokens = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    heads = head0 + tl.arange(0, HEADS_PER_TILE)
    if ROTATED_HEADS > 0:
        pairs = pair0 + tl.arange(0, PAIRS)
        c, s = _cos_sin(tokens, tokens < n_tokens, pairs, pairs < HEAD_DIM // 2, cos_ptr,
                        sin_ptr, coords_ptr, freqs_ptr, cos_stride_t, cos_stride_d,
                        sin_stride_t, sin_stride_d, ANGLES)
        c = c[:, None, :]  # one angle per (token, pair), shared by the tile's heads
        s = s[:, None, :]
        rotate = (heads < ROTATED_HEADS)[None, :, None]  # q and k heads; v heads pass through
        y0 = tl.where(rotate, x0 * c - x1 * s, x0)
        y1 = tl.where(rotate, x0 * s + x1 * c, x1)
    else:
        y0 = x0
        y1 = x1
    y = tl.reshape(tl.join(y0, y1), (BLOCK_M, HEADS_PER_TILE, 2 * PAIRS))  # interleaved
    if USE_TMA:
        # the descriptor's bounds clip token rows >= T, padded heads and pairs
        out.store([m0, head0, 2 * pair0], y.to(out.dtype))
    else:
        cols = 2 * pair0 + tl.arange(0, 2 * PAIRS)
        ptrs = (out + tokens[:, None, None] * out_stride_t + heads[None, :, None] * out_stride_h
                + cols[None, None, :])
        mask = ((tokens < n_tokens)[:, None, None] & (heads < 3 * HEADS)[None, :, None]
                & (cols < HEAD_DIM)[None, None, :])
        tl.store(ptrs, y.to(out.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_tokens", "num_programs"])
def _qkv_rope_linear_kernel(
    x, w, out,  # TMA descriptors when USE_TMA, else pointers
    bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens, num_programs,
    x_stride_t, w_stride_n, out_stride_t, out_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HIDDEN: tl.constexpr,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTATED_HEADS: tl.constexpr,  # 2 * HEADS (q and k); 0 times the bare GEMM
    HEAD_BLOCKS: tl.constexpr,  # ceil(3 * HEADS / HEADS_PER_TILE)
    PAIR_BLOCKS: tl.constexpr,  # ceil(HEAD_DIM / 2 / pairs per tile)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ANGLES: tl.constexpr,
    USE_TMA: tl.constexpr,
    PERSISTENT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    if PERSISTENT:
        num_tiles = tl.cdiv(n_tokens, BLOCK_M) * (HEAD_BLOCKS * PAIR_BLOCKS)
        for tile_id in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=True,
                                warp_specialize=WARP_SPECIALIZE):
            _qkv_tile(tile_id, x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
                      n_tokens, x_stride_t, w_stride_n, out_stride_t, out_stride_h,
                      cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HIDDEN, HEADS,
                      HEAD_DIM, ROTATED_HEADS, HEAD_BLOCKS, PAIR_BLOCKS, BLOCK_M, BLOCK_N, BLOCK_K,
                      HEADS_PER_TILE, GROUP_M, HAS_BIAS, ANGLES, USE_TMA, INTERPRETED)
    else:
        _qkv_tile(tl.program_id(0), x, w, out, bias_ptr, cos_ptr, sin_ptr, coords_ptr,
                  freqs_ptr, n_tokens, x_stride_t, w_stride_n, out_stride_t, out_stride_h,
                  cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, HIDDEN, HEADS,
                  HEAD_DIM, ROTATED_HEADS, HEAD_BLOCKS, PAIR_BLOCKS, BLOCK_M, BLOCK_N, BLOCK_K,
                  HEADS_PER_TILE, GROUP_M, HAS_BIAS, ANGLES, USE_TMA, INTERPRETED)


# --------------------------------------------------------------------------
# Launch settings
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class QKVGemmConfig:
    """Launch settings of ``qkv_rope_linear`` (see ``qkv_gemm_config``)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    heads_per_tile: int = 16  # a tile: heads_per_tile heads x block_n/(2*heads_per_tile) pairs
    group_m: int = 8
    num_stages: int = 4
    num_warps: int = 8
    persistent: bool = True
    warp_specialize: bool = False  # Triton's producer/consumer warp groups (persistent only)
    use_tma: bool | None = None  # None: TMA where the GPU and the strides allow it

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
        for name in ("persistent", "warp_specialize"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"QKVGemmConfig.{name} must be a bool")
        if self.use_tma is not None and not isinstance(self.use_tma, bool):
            raise TypeError("QKVGemmConfig.use_tma must be a bool or None")

    @property
    def pairs_per_tile(self) -> int:
        return self.block_n // (2 * self.heads_per_tile)


# Measured on an H200 (tools/qkv_probe.py at 1a5bc46, data/nvidia-h200/qkv_gemm_configs.csv:
# 1152 -> 3456, bf16, CUDA graphs): of 12 configs, 128x128x64 tiles, 4 stages, 8 warps,
# one program per tile was fastest at 87,616 tokens (1521 us) and within 3% of the
# fastest at 43,808 (778 vs 758 us). The persistent grid was slower here (1578 us
# at best, with group_m=1; group_m=8 costs 15-20% in the persistent kernel).
GPU_TILES = dict(block_m=128, block_k=64, group_m=8, num_stages=4, num_warps=8, persistent=False)


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
                    element_size: int = 2) -> QKVGemmConfig:
    """A documented heuristic, no autotuning at first call.

    GPUs: the H200-measured tile (``GPU_TILES``) with the N-tile layout of
    least padding (``tile_layout``), at least 16 bytes of each head per tile
    (the smallest TMA box). The CPU interpreter: small tiles (its cost grows
    with the tile count and size, not with the GEMM's efficiency)."""
    if device.type == "cpu":
        block_n, hpt = tile_layout(heads, head_dim, widths=(64,))
        return QKVGemmConfig(block_m=32, block_n=block_n, block_k=32, heads_per_tile=hpt,
                             group_m=1, num_stages=1, num_warps=4, persistent=False)
    block_n, hpt = tile_layout(heads, head_dim, min_pairs=max(1, 8 // element_size))
    return QKVGemmConfig(block_n=block_n, heads_per_tile=hpt, **GPU_TILES)


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
        permuted: the weight in the kernel's order (``permute_qkv_weight``);
            built and cached per weight when omitted.
        out: optional preallocated (T, 3, H, D) contiguous output.
    """
    if not isinstance(cos, torch.Tensor) or cos.dim() != 2:
        raise ValueError("cos must be a 2-D (tokens, head_dim/2) float32 tensor")
    heads, head_dim = _check_common(x, w_qkv, b_qkv, 2 * cos.shape[1], "cos (tokens, head_dim/2)")
    for name, t in (("cos", cos), ("sin", sin)):
        _check_table(name, t, x.shape[0], head_dim // 2, x.device)
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin differ in shape: {tuple(cos.shape)} vs {tuple(sin.shape)}")
    return _launch(x, w_qkv, b_qkv, heads, head_dim, config, permuted, out,
                   cos=cos, sin=sin, coords=None, freqs=None)


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
                   cos=None, sin=None, coords=coords, freqs=freqs)


def _launch(x, w_qkv, b_qkv, heads, head_dim, config, permuted, out, *, cos, sin, coords, freqs,
            rotate=True):
    """Checks, layout and launch; ``rotate=False`` (benchmarks only) runs the same
    kernel with the rotation compiled out: the bare GEMM it is built on."""
    tokens, hidden = x.shape
    if config is None:
        config = qkv_gemm_config(heads, head_dim, x.device, x.element_size())
    elif not isinstance(config, QKVGemmConfig):
        raise TypeError(f"config must be a QKVGemmConfig, got {type(config).__name__}")
    if permuted is None:
        permuted = cached_permuted_weight(w_qkv, b_qkv, heads, head_dim, block_n=config.block_n,
                                          heads_per_tile=config.heads_per_tile)
    elif not isinstance(permuted, PermutedQKVWeight):
        raise TypeError(f"permuted must be a PermutedQKVWeight, got {type(permuted).__name__}")
    if (permuted.heads, permuted.head_dim) != (heads, head_dim) \
            or permuted.weight.shape[1] != hidden or permuted.weight.dtype != x.dtype \
            or permuted.weight.device != x.device:
        raise ValueError("permuted weight was built for another shape, dtype or device "
                         f"({permuted.heads} heads x {permuted.head_dim}, "
                         f"{tuple(permuted.weight.shape)} {permuted.weight.dtype})")
    if (permuted.block_n, permuted.heads_per_tile) != (config.block_n, config.heads_per_tile):
        raise ValueError(f"permuted weight layout (block_n={permuted.block_n}, heads_per_tile="
                         f"{permuted.heads_per_tile}) does not match the config (block_n="
                         f"{config.block_n}, heads_per_tile={config.heads_per_tile})")
    if (b_qkv is None) != (permuted.bias is None):
        raise ValueError("permuted weight and b_qkv disagree on whether there is a bias")

    shape = (tokens, 3, heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != x.dtype \
            or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {shape} on {x.device}")
    if tokens == 0:
        return out
    check_triton_device(x, "qkv_rope_linear")

    out_heads = out.view(tokens, 3 * heads, head_dim)
    use_tma = config.use_tma
    if use_tma is None:
        use_tma = (tma_supported(x.device) and _tma_aligned(x, permuted.weight, out_heads)
                   and 2 * config.pairs_per_tile * x.element_size() >= 16)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bk = config.block_m, config.block_k
        x_arg = TensorDescriptor.from_tensor(x, [bm, bk])
        w_arg = TensorDescriptor.from_tensor(permuted.weight, [config.block_n, bk])
        out_arg = TensorDescriptor.from_tensor(
            out_heads, [bm, config.heads_per_tile, 2 * config.pairs_per_tile])
    else:
        x_arg, w_arg, out_arg = x, permuted.weight, out_heads

    n_tiles = permuted.head_blocks * permuted.pair_blocks
    num_tiles = triton.cdiv(tokens, config.block_m) * n_tiles
    # Triton 3.6's interpreter cannot run a loop with run-time bounds under
    # numpy >= 2.4 (it calls int() on 1-element arrays): there one tile a program.
    persistent = config.persistent and not triton_interpreter_enabled()
    programs = min(num_tiles, _num_sms(x.device)) if persistent else num_tiles
    angles = coords is not None
    table = freqs if angles else cos  # fp32 stand-ins for the inputs a variant does not read
    _qkv_rope_linear_kernel[(programs,)](
        x_arg, w_arg, out_arg,
        permuted.bias if permuted.bias is not None else table,
        table if angles else cos, table if angles else sin,
        coords if angles else table, table if not angles else freqs,
        tokens, programs,
        x.stride(0), permuted.weight.stride(0), out_heads.stride(0), out_heads.stride(1),
        0 if angles else cos.stride(0), 0 if angles else cos.stride(1),
        0 if angles else sin.stride(0), 0 if angles else sin.stride(1),
        HIDDEN=hidden, HEADS=heads, HEAD_DIM=head_dim, ROTATED_HEADS=2 * heads if rotate else 0,
        HEAD_BLOCKS=permuted.head_blocks,
        PAIR_BLOCKS=permuted.pair_blocks, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, HEADS_PER_TILE=config.heads_per_tile, GROUP_M=config.group_m,
        HAS_BIAS=permuted.bias is not None, ANGLES=angles, USE_TMA=use_tma,
        PERSISTENT=persistent, WARP_SPECIALIZE=config.warp_specialize and persistent,
        INTERPRETED=triton_interpreter_enabled(),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def rotating_qkv_projection(linear: torch.nn.Linear, x: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, heads: int) -> torch.Tensor:
    """``qkv_rope_linear`` for a model's QKV ``nn.Linear``: packed (T, 3, H, D), q/k rotated.

    The permuted weight is built once and kept on the module
    (``linear.qkv_rope_weight``); it is rebuilt if the module moves to another
    device or dtype or its weight is updated in place."""
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
    head_dim = 2 * cos.shape[-1]
    config = qkv_gemm_config(heads, head_dim, x.device, x.element_size())
    w, b = linear.weight, linear.bias
    versions = (w._version, None if b is None else b._version)
    cached = getattr(linear, "qkv_rope_weight", None)
    if (cached is None or cached[0] != versions or cached[1].weight.device != w.device
            or cached[1].weight.dtype != w.dtype
            or (cached[1].block_n, cached[1].heads_per_tile) != (config.block_n,
                                                                  config.heads_per_tile)):
        permuted = permute_qkv_weight(w.detach(), None if b is None else b.detach(), heads,
                                      head_dim, block_n=config.block_n,
                                      heads_per_tile=config.heads_per_tile)
        linear.qkv_rope_weight = (versions, permuted)
    return qkv_rope_linear(x, w, b, cos, sin, config=config,
                           permuted=linear.qkv_rope_weight[1])
