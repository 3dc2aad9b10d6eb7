"""The same-bytes copy: a reference that moves exactly the bytes one RoPE call moves.

What it is. Triton kernels that read q and k where a RoPE call reads them (the
strided views of the packed (T, 3, H, D) qkv), read the fp32 cos and sin of every
token once (the strided real/imaginary views of ``freqs_cis``), and write q and k
unchanged: out of place into fresh contiguous (T, H, D) outputs, like an
out-of-place variant, or in place back into q and k, like an in-place variant. They
do no arithmetic, so no RoPE kernel that moves the same bytes should beat them
beyond noise: timed exactly like the variants (same input sets, same timer, same
rounds), the fastest of them is the limit at that size.

Why several tilings. How fast a copy runs depends on how its programs cut the
bytes, and the variants cut them differently: the fused kernel moves whole tokens
(every head of a few tokens), SGLang's Triton kernel flat blocks of 128 pairs,
vLLM's kernel a token per program. One tiling is not a limit for all of them: a
lone ``row`` (below) was slower than the in-place fused kernel at 2 and 4 heads x 72
(its 32-byte column blocks scatter each token's row over many programs, and in place
it wrote them back the same way; the figures: docs/DECISIONS.md, "The same-bytes copy:
a family of tilings, not clone()"). So ``same_bytes_copy_tilings`` gives a small family that covers the
variants' access patterns, the benchmark times every member in the same rounds,
and the reference is the fastest member's median (``bench.microbench``:
``same_bytes_copy_us`` and ``same_bytes_copy_tiling``):

- ``row``: ``block_t`` tokens x ``block_c`` contiguous elements of a token's
  heads x head_dim row (the row is contiguous in a packed qkv view);
- ``tokens``: ``block_t`` whole tokens per program, each token's q and k rows in
  two power-of-two chunks (1152 = 1024 + 128 at 16 x 72), every load issued before
  any store, cos/sin read per element as the fused kernel reads them: the fused
  kernel's own layout, at a 4 KB and a 1 KB tile;
- ``flat``: ``block`` consecutive elements of the flattened (T, H x D) rows, cut
  across tokens and heads like SGLang's kernel (no padded lanes);
- ``heads``: vLLM 0.33's cut, ``block_t`` tokens x one head of q or of k a program,
  each program reading its tokens' cos/sin as one contiguous row of freqs_cis's
  floats (element d gating element d);
- ``pairs``: SGLang's vision cut, ``block`` consecutive pairs of the flattened
  (T, H, D/2) pairs a program, q's and k's, each pair reading its own cos and sin;
- ``pair_scalars``: the same cut with SGLang's own loads and index math: a pair's
  two elements loaded and stored apart (scalars), the mask on the pair index (why:
  docs/DECISIONS.md, "The `pair_scalars` member: SGLang's own loads");
- ``fused``: the fused rows kernel itself (``kernels/fused.py``) at its default
  launch, compiled with ``_gate_row_pairs`` as its ``PAIR_FN`` (``launch_fused_rows_copy``):
  its rotation replaced by a gate on cos/sin, every load, store, mask and program the same. The fused kernel cannot beat this member
  beyond noise by construction: the difference is exactly the rotation's arithmetic.

Why not ``clone()``. A clone of a contiguous buffer is one ``cudaMemcpyAsync``,
whose speed on an H200 depends on the byte count's alignment: at Kimi's token
counts (multiples of 5476) it ran well below the large-copy ceiling, so the fused
kernel read above 100% of a copy (the figures: docs/DECISIONS.md, "The same-bytes
copy: a family of tilings, not clone()"). An SM copy has no such cliff.

The cos/sin reads. A copy would not need them, so the kernels compare them with
``never`` (a NaN passed at run time, equal to nothing) and would zero what
depends on a match: the compiler cannot drop the loads, and the stored values are
the loaded ones bit for bit (the ``fused`` member, whose kernel takes no ``never``, gates
on cos and sin not being NaN: equally undecidable at compile time). In ``row``, ``tokens`` and ``flat`` each token's
cos/sin are read by one program only (the one holding the token's first column
block, the token itself, or its first ``head_dim/2`` row elements); in ``heads``,
``pairs``, ``pair_scalars`` and ``fused`` by every program holding part of the token, as
the kernels they copy read them (from L2 after the first). Either way they cross the DRAM bus
once, as in ``minimal_bytes``. Addresses are int64; ``flat`` and the pair cuts split
their element (pair) index into token and column in int32 while it stays below
2**31, as SGLang's kernel does (at launch-bound sizes the int64 division's latency
alone made the copy slower than the kernel it bounds), else in int64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (check_freqs_cis, check_qk, check_triton_device,
                                         check_writable_in_place)
from rope_kernels.kernels.fused import (RowsConfig, fused_launch_config, interleaved_cos_sin,
                                        row_chunks, rows_launch, rows_launch_config)
from rope_kernels.kernels.reference import cos_sin_views


@triton.jit
def _gate_row_pairs(x, partner, e, cos, sin, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr,
                    HEAD_DIM: tl.constexpr):
    """The ``fused`` member's ``PAIR_FN`` (the kernel's pairs layout; ``partner``, ``e``:
    unused): x unchanged (bit for bit) where its pair's cos and sin are numbers (always, for
    a real table), else 0. The stores depend on the cos/sin loads as the rotation's do, so
    the compiler keeps them; no arithmetic on x."""
    keep = (cos == cos) & (sin == sin)
    return tl.where(tl.reshape(tl.join(keep, keep), (BLOCK_T, WIDTH)), x, 0.0)


def launch_fused_rows_copy(xq, xk, q_out, k_out, cos, sin, config: RowsConfig, *,
                           n_tokens: int | None = None) -> None:
    """The ``fused`` member: the fused kernel's own launch (``fused.rows_launch``, any q/k
    strides) with ``_gate_row_pairs`` for its rotation; ``n_tokens`` (tests): stop short."""
    launch = rows_launch(xq, xk, q_out, k_out, cos, sin, config, pair_fn=_gate_row_pairs,
                         n_tokens=n_tokens)
    if launch is not None:
        launch.launch(xq, xk, q_out, k_out, cos, sin)


@triton.jit(do_not_specialize=["n_tokens", "never"])
def _copy_row_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, k_stride_t, qo_stride_t, ko_stride_t,  # in units of VEC elements
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    never,  # a NaN at run time: no cos/sin value equals it
    ROW: tl.constexpr,  # heads * head_dim: one token's contiguous row of q (and of k)
    PAIRS: tl.constexpr,  # head_dim // 2: cos (and sin) values per token
    BLOCK_PAIRS: tl.constexpr,  # power of two >= PAIRS
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    VEC: tl.constexpr,
):
    N_COL_BLOCKS: tl.constexpr = (ROW + BLOCK_C - 1) // BLOCK_C
    pid = tl.program_id(0)
    col_block = pid % N_COL_BLOCKS
    tokens = (pid // N_COL_BLOCKS).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = col_block * BLOCK_C + tl.arange(0, BLOCK_C)
    token_ok = tokens < n_tokens
    mask = token_ok[:, None] & (cols < ROW)[None, :]
    t2 = tokens[:, None]
    c2 = cols[None, :]
    q = tl.load(q_ptr + t2 * (q_stride_t * VEC) + c2, mask=mask)
    k = tl.load(k_ptr + t2 * (k_stride_t * VEC) + c2, mask=mask)
    j = tl.arange(0, BLOCK_PAIRS)[None, :]
    # only the first column block reads cos/sin; said as a block comparison, so the mask
    # stays boolean in Triton's interpreter (see kernels/interpreter.py, Triton 3.9)
    pair_mask = token_ok[:, None] & ((j + col_block * BLOCK_PAIRS) < PAIRS)
    cos = tl.load(cos_ptr + t2 * cos_stride_t + j * cos_stride_d, mask=pair_mask, other=0.0)
    sin = tl.load(sin_ptr + t2 * sin_stride_t + j * sin_stride_d, mask=pair_mask, other=0.0)
    hits = tl.sum(((cos == never) | (sin == never)).to(tl.int32), axis=1)
    keep = (hits == 0)[:, None]
    tl.store(q_out_ptr + t2 * (qo_stride_t * VEC) + c2, tl.where(keep, q, 0.0), mask=mask)
    tl.store(k_out_ptr + t2 * (ko_stride_t * VEC) + c2, tl.where(keep, k, 0.0), mask=mask)


@triton.jit(do_not_specialize=["n_tokens", "never"])
def _copy_tokens_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, k_stride_t, qo_stride_t, ko_stride_t,  # in units of VEC elements
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    never,
    ROW: tl.constexpr,
    PAIRS: tl.constexpr,
    MAIN: tl.constexpr,  # largest power of two <= ROW
    REST: tl.constexpr,  # power of two covering ROW - MAIN (0 when none)
    BLOCK_T: tl.constexpr,
    VEC: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,  # sin is cos + 1 element, both at pair stride 2 (freqs_cis)
):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_ok = tokens < n_tokens
    t2 = tokens[:, None]
    ok = token_ok[:, None]
    c = tl.arange(0, MAIN)[None, :]
    # every load before any store, as the fused kernels do
    q = tl.load(q_ptr + t2 * (q_stride_t * VEC) + c, mask=ok)
    k = tl.load(k_ptr + t2 * (k_stride_t * VEC) + c, mask=ok)
    if REST > 0:
        c2 = MAIN + tl.arange(0, REST)[None, :]
        m2 = ok & (c2 < ROW)
        q2 = tl.load(q_ptr + t2 * (q_stride_t * VEC) + c2, mask=m2)
        k2 = tl.load(k_ptr + t2 * (k_stride_t * VEC) + c2, mask=m2)
    if INTERLEAVED:
        # The fused rows kernel's own cos/sin reads: every element of the row loads the
        # token's [c0, s0, c1, s1, ...] value at e % HEAD_DIM (one contiguous load a
        # head, the same HEAD_DIM floats for every head: L1 hits after the first).
        cs = tl.load(cos_ptr + t2 * cos_stride_t + c % HEAD_DIM, mask=ok, other=0.0)
        keep = cs != never
        if REST > 0:
            cs2 = tl.load(cos_ptr + t2 * cos_stride_t + c2 % HEAD_DIM, mask=m2, other=0.0)
            keep2 = cs2 != never
    else:
        # Separate cos and sin: the row's first PAIRS elements read the token's values
        # (MAIN >= PAIRS), each gating only its own element.
        pair_mask = ok & (c < PAIRS)
        cos = tl.load(cos_ptr + t2 * cos_stride_t + c * cos_stride_d, mask=pair_mask, other=0.0)
        sin = tl.load(sin_ptr + t2 * sin_stride_t + c * sin_stride_d, mask=pair_mask, other=0.0)
        keep = (cos != never) & (sin != never)
        if REST > 0:
            keep2 = c2 >= 0  # the tail's elements were not gated by a cos/sin of theirs
    tl.store(q_out_ptr + t2 * (qo_stride_t * VEC) + c, tl.where(keep, q, 0.0), mask=ok)
    tl.store(k_out_ptr + t2 * (ko_stride_t * VEC) + c, tl.where(keep, k, 0.0), mask=ok)
    if REST > 0:
        tl.store(q_out_ptr + t2 * (qo_stride_t * VEC) + c2, tl.where(keep2, q2, 0.0), mask=m2)
        tl.store(k_out_ptr + t2 * (ko_stride_t * VEC) + c2, tl.where(keep2, k2, 0.0), mask=m2)


@triton.jit(do_not_specialize=["n_tokens", "never"])
def _copy_flat_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, k_stride_t, qo_stride_t, ko_stride_t,  # in units of VEC elements
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    never,
    ROW: tl.constexpr,
    PAIRS: tl.constexpr,
    BLOCK: tl.constexpr,
    VEC: tl.constexpr,
    WIDE: tl.constexpr,  # element indices reach 2**31: int64 index math
):
    if WIDE:
        e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:  # int32 index math (a division by a constant is one multiply-high)
        e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tokens = e // ROW
    cols = e - tokens * ROW
    ok = tokens < n_tokens
    tokens = tokens.to(tl.int64)
    # The elements at columns [0, PAIRS) of a token's row read its cos/sin: once a token.
    pair_ok = ok & (cols < PAIRS)
    cos = tl.load(cos_ptr + tokens * cos_stride_t + cols * cos_stride_d, mask=pair_ok, other=0.0)
    sin = tl.load(sin_ptr + tokens * sin_stride_t + cols * sin_stride_d, mask=pair_ok, other=0.0)
    keep = (cos != never) & (sin != never)
    q = tl.load(q_ptr + tokens * (q_stride_t * VEC) + cols, mask=ok)
    k = tl.load(k_ptr + tokens * (k_stride_t * VEC) + cols, mask=ok)
    tl.store(q_out_ptr + tokens * (qo_stride_t * VEC) + cols, tl.where(keep, q, 0.0), mask=ok)
    tl.store(k_out_ptr + tokens * (ko_stride_t * VEC) + cols, tl.where(keep, k, 0.0), mask=ok)


@triton.jit
def _copy_head(src, dst, src_stride_t, dst_stride_t, head, tokens, cos_ptr, sin_ptr,
               n_tokens, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, never,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, VEC: tl.constexpr,
               INTERLEAVED: tl.constexpr):
    """One head of BLOCK_T tokens, each element gated by a cos/sin value of its pair:
    with freqs_cis's views, the token's HEAD_DIM floats [c0, s0, c1, s1, ...] as one
    contiguous row, element d gating element d."""
    d = tl.arange(0, BLOCK_D)[None, :]
    t2 = tokens[:, None]
    ok = (tokens < n_tokens)[:, None] & (d < HEAD_DIM)
    x = tl.load(src + t2 * (src_stride_t * VEC) + head * HEAD_DIM + d, mask=ok)
    if INTERLEAVED:
        cs = tl.load(cos_ptr + t2 * cos_stride_t + d, mask=ok, other=0.0)
        keep = cs != never
    else:
        cos = tl.load(cos_ptr + t2 * cos_stride_t + (d // 2) * cos_stride_d, mask=ok, other=0.0)
        sin = tl.load(sin_ptr + t2 * sin_stride_t + (d // 2) * sin_stride_d, mask=ok, other=0.0)
        keep = (cos != never) & (sin != never)
    tl.store(dst + t2 * (dst_stride_t * VEC) + head * HEAD_DIM + d, tl.where(keep, x, 0.0),
             mask=ok)


@triton.jit(do_not_specialize=["n_tokens", "never"])
def _copy_heads_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, k_stride_t, qo_stride_t, ko_stride_t,  # in units of VEC elements
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    never,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # power of two >= HEAD_DIM
    BLOCK_T: tl.constexpr,
    VEC: tl.constexpr,
    INTERLEAVED: tl.constexpr,  # sin is cos + 1 element, both at pair stride 2 (freqs_cis)
):
    """vLLM's packed-qk cut: program (BLOCK_T tokens, one head of q or of k); every
    program reads its tokens' cos/sin (from L2 after the first program of a token)."""
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    pid_h = tl.program_id(1)
    if pid_h < HEADS:
        _copy_head(q_ptr, q_out_ptr, q_stride_t, qo_stride_t, pid_h, tokens, cos_ptr, sin_ptr,
                   n_tokens, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d, never,
                   HEAD_DIM, BLOCK_D, VEC, INTERLEAVED)
    else:
        _copy_head(k_ptr, k_out_ptr, k_stride_t, ko_stride_t, pid_h - HEADS, tokens, cos_ptr,
                   sin_ptr, n_tokens, cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                   never, HEAD_DIM, BLOCK_D, VEC, INTERLEAVED)


@triton.jit(do_not_specialize=["n_tokens", "never"])
def _copy_pairs_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    # strides specialized (constexpr), as SGLang's kernel takes them: its address math
    # folds to constants, and a copy that computed more would not bound it
    q_stride_t: tl.constexpr, k_stride_t: tl.constexpr,  # in units of VEC elements
    qo_stride_t: tl.constexpr, ko_stride_t: tl.constexpr,
    cos_stride_t: tl.constexpr, cos_stride_d: tl.constexpr,
    sin_stride_t: tl.constexpr, sin_stride_d: tl.constexpr,
    never,
    ROW: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,  # pairs per program
    VEC: tl.constexpr,
    WIDE: tl.constexpr,  # offsets reach 2**31: int64 index math
):
    """SGLang's vision cut: BLOCK consecutive pairs of the flattened (T, H, D/2) pairs
    per program, q's and k's; every pair reads its own cos and sin (the token's, again
    for each head: from L2 after the first)."""
    if WIDE:
        p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:  # int32 index math, as SGLang's kernel does
        p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tokens = p // (ROW // 2)
    col = 2 * (p - tokens * (ROW // 2))
    pair = (col % HEAD_DIM) // 2
    ok = (tokens < n_tokens)[:, None]
    t2 = tokens[:, None]
    e = col[:, None] + tl.arange(0, 2)[None, :]  # the pair's two elements
    q = tl.load(q_ptr + t2 * (q_stride_t * VEC) + e, mask=ok)
    k = tl.load(k_ptr + t2 * (k_stride_t * VEC) + e, mask=ok)
    cos = tl.load(cos_ptr + tokens * cos_stride_t + pair * cos_stride_d, mask=tokens < n_tokens,
                  other=0.0)
    sin = tl.load(sin_ptr + tokens * sin_stride_t + pair * sin_stride_d, mask=tokens < n_tokens,
                  other=0.0)
    keep = ((cos != never) & (sin != never))[:, None]
    tl.store(q_out_ptr + t2 * (qo_stride_t * VEC) + e, tl.where(keep, q, 0.0), mask=ok)
    tl.store(k_out_ptr + t2 * (ko_stride_t * VEC) + e, tl.where(keep, k, 0.0), mask=ok)


@triton.jit(do_not_specialize=["n_pairs", "never"])
def _copy_pair_scalars_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_pairs,
    q_stride_t: tl.constexpr, k_stride_t: tl.constexpr,  # in elements
    qo_stride_t: tl.constexpr, ko_stride_t: tl.constexpr,
    cos_stride_t: tl.constexpr, cos_stride_d: tl.constexpr,
    sin_stride_t: tl.constexpr, sin_stride_d: tl.constexpr,
    never,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,  # pairs per program
    WIDE: tl.constexpr,  # offsets reach 2**31: int64 index math
):
    """SGLang's vision cut with SGLang's loads: ``pairs``' program, but every element
    its own scalar load and store (a pair's real and imaginary parts apart), the
    mask on the pair index itself, and the pair split into (token, head, pair) as
    SGLang's kernel splits it."""
    if WIDE:
        p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = p < n_pairs
    row = p // (HEAD_DIM // 2)
    pair = p - row * (HEAD_DIM // 2)
    token = row // HEADS
    col = (row - token * HEADS) * HEAD_DIM + 2 * pair
    cos = tl.load(cos_ptr + token * cos_stride_t + pair * cos_stride_d, mask=ok, other=0.0)
    sin = tl.load(sin_ptr + token * sin_stride_t + pair * sin_stride_d, mask=ok, other=0.0)
    q0 = tl.load(q_ptr + token * q_stride_t + col, mask=ok)
    q1 = tl.load(q_ptr + token * q_stride_t + col + 1, mask=ok)
    k0 = tl.load(k_ptr + token * k_stride_t + col, mask=ok)
    k1 = tl.load(k_ptr + token * k_stride_t + col + 1, mask=ok)
    keep = (cos != never) & (sin != never)
    tl.store(q_out_ptr + token * qo_stride_t + col, tl.where(keep, q0, 0.0), mask=ok)
    tl.store(q_out_ptr + token * qo_stride_t + col + 1, tl.where(keep, q1, 0.0), mask=ok)
    tl.store(k_out_ptr + token * ko_stride_t + col, tl.where(keep, k0, 0.0), mask=ok)
    tl.store(k_out_ptr + token * ko_stride_t + col + 1, tl.where(keep, k1, 0.0), mask=ok)


# Bytes of q (and as many of k) one ``row`` program moves: the fused kernel's tile
# (``fused.TILE_BYTES``), about one 16-byte vector per thread of 4 warps.
TILE_BYTES = 2048
MIN_SEGMENT_BYTES = 32  # one DRAM sector: narrower column blocks waste bus bytes
LAYOUTS = ("row", "tokens", "flat", "fused", "heads", "pairs", "pair_scalars")
# ``tokens`` tiles: bytes of q rows per program (whole tokens, at least one). 4 KB
# and 1 KB were the fastest tiles of the fused kernel's rows layout in an H200
# exploration run (tools/fused_explore.py, 2026-12-03).
TOKENS_TILE_BYTES = (4096, 1024)
# ``flat`` blocks: (elements, warps). 256 elements on 4 warps is SGLang's program
# (128 pairs, a pair a thread), on 2 warps 8 bytes a thread; 1024 on 4 warps is one
# 16-byte vector per thread at bf16.
FLAT_BLOCKS = ((256, 2), (256, 4), (1024, 4))
# ``heads``: vLLM 0.33 packed_qk_rope_'s program, 4 tokens x one head (2 warps up to
# head_dim 64, else 4); ``pairs``: SGLang's vision kernel's, 128 pairs on 4 warps.
# Both read cos/sin as those kernels do: every program its tokens' (L2 after the first).
HEADS_BLOCK_T = 4
PAIRS_BLOCK = 128


@dataclass(frozen=True)
class CopyTiling:
    """How one same-bytes copy cuts the bytes into programs (see the module docstring)."""

    layout: str  # one of LAYOUTS
    block_t: int = 1  # tokens per program (row, tokens, heads)
    block_c: int = 0  # row: contiguous elements of a token's row per program
    block: int = 0  # flat: consecutive elements per program; pairs, pair_scalars: pairs
    num_warps: int = 4  # (fused: the fused kernel's default launch; block_t and warps are its)

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"CopyTiling.layout must be one of {LAYOUTS}, got {self.layout!r}")
        needed = {"row": ("block_t", "block_c"), "tokens": ("block_t",),
                  "flat": ("block",), "fused": ("block_t",), "heads": ("block_t",),
                  "pairs": ("block",), "pair_scalars": ("block",)}[self.layout]
        for name in needed + ("num_warps",):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"CopyTiling.{name} must be a positive power of two for the "
                                 f"{self.layout} layout, got {v!r}")

    @property
    def label(self) -> str:
        """Short name for result rows: row:64x16, tokens:8, flat:1024 (then /warps)."""
        size = {"row": f"{self.block_t}x{self.block_c}", "tokens": f"{self.block_t}",
                "flat": f"{self.block}", "fused": f"{self.block_t}",
                "heads": f"{self.block_t}", "pairs": f"{self.block}",
                "pair_scalars": f"{self.block}"}[self.layout]
        return f"{self.layout}:{size}/{self.num_warps}"


def same_bytes_copy_config(heads: int, head_dim: int, element_size: int) -> CopyTiling:
    """The ``row`` tiling. Column blocks: the largest power of two dividing the row
    (heads x head_dim), so no lane is masked off (1152 = 9 x 128 at 16 x 72), capped
    at the tile; when that is narrower than a DRAM sector, the row's power-of-two
    cover instead. Tokens per program fill the rest of ``TILE_BYTES``."""
    _check_ints(heads=heads, head_dim=head_dim, element_size=element_size)
    row = heads * head_dim
    tile = max(1, TILE_BYTES // element_size)
    block_c = min(row & -row, tile)
    if block_c * element_size < MIN_SEGMENT_BYTES:
        block_c = min(triton.next_power_of_2(row), tile)
    return CopyTiling("row", block_t=max(1, tile // block_c), block_c=block_c, num_warps=4)


def tokens_tiling(heads: int, head_dim: int, element_size: int, tile_bytes: int) -> CopyTiling:
    """Whole tokens per program as the fused kernel tiles its rows (``rows_launch_config``
    at ``tile_bytes``, the one place row tiling is decided): the largest power of two whose
    q rows fit (at least one); about one 16-byte vector per thread of the row's first
    power-of-two chunk, 1 to 8 warps."""
    _check_ints(heads=heads, head_dim=head_dim, element_size=element_size, tile_bytes=tile_bytes)
    config = rows_launch_config(heads, head_dim, element_size, tile_bytes)
    return CopyTiling("tokens", block_t=config.block_t, num_warps=config.num_warps)


def fused_tiling(heads: int, head_dim: int, element_size: int) -> CopyTiling:
    """The ``fused`` member: the fused kernel's default launch (``fused_launch_config``)."""
    _check_ints(heads=heads, head_dim=head_dim, element_size=element_size)
    config = fused_launch_config(heads, head_dim, element_size)
    return CopyTiling("fused", block_t=config.block_t, num_warps=config.num_warps)


def same_bytes_copy_tilings(heads: int, head_dim: int, element_size: int) -> tuple[CopyTiling, ...]:
    """The family the benchmark times (the reference is its fastest member): the
    ``row`` tiling, ``tokens`` at each of ``TOKENS_TILE_BYTES``, the ``FLAT_BLOCKS``,
    ``fused`` (the fused kernel's own launch with its rotation compiled out), and the
    engines' cuts: ``heads`` (vLLM's), ``pairs`` and ``pair_scalars`` (SGLang's)."""
    _check_ints(heads=heads, head_dim=head_dim, element_size=element_size)
    family = [fused_tiling(heads, head_dim, element_size),
              same_bytes_copy_config(heads, head_dim, element_size)]
    family += [tokens_tiling(heads, head_dim, element_size, b) for b in TOKENS_TILE_BYTES]
    family += [CopyTiling("flat", block=b, num_warps=w) for b, w in FLAT_BLOCKS]
    family += [CopyTiling("heads", block_t=HEADS_BLOCK_T, num_warps=2 if head_dim <= 64 else 4),
               CopyTiling("pairs", block=PAIRS_BLOCK, num_warps=4),
               CopyTiling("pair_scalars", block=PAIRS_BLOCK, num_warps=4)]
    return tuple(dict.fromkeys(family))


def _check_ints(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def _vector_width(tensors, element_size: int) -> int:
    """Widest power-of-two element count (at most 16 bytes) dividing every token
    stride and base offset, so row loads are provably aligned vectors."""
    vec = max(1, 16 // element_size)
    while vec > 1:
        if all(t.stride(0) % vec == 0 and t.data_ptr() % (vec * element_size) == 0
               for t in tensors):
            return vec
        vec //= 2
    return 1


def _check_rows(xq: torch.Tensor, xk: torch.Tensor, layout: str) -> None:
    _, heads, head_dim = xq.shape
    for name, x in (("xq", xq), ("xk", xk)):
        if heads > 1 and x.stride(1) != head_dim:
            raise ValueError(f"{name}: the {layout} same-bytes copy needs each token's heads x "
                             f"head_dim row contiguous (head stride {head_dim}), got strides "
                             f"{tuple(x.stride())}")


def _reaches_int32(tokens: int, row: int, *tensors: torch.Tensor) -> bool:
    """Whether an element offset (a token times the largest stride, plus a row) can
    reach 2**31: the pair kernels (``pairs``, ``pair_scalars``) then need int64 offsets."""
    return (tokens + 1) * max(max(t.stride()) for t in tensors) + row >= 2**31


def launch_same_bytes_copy(xq, xk, q_out, k_out, cos, sin, *, tiling: CopyTiling | None = None,
                           n_tokens: int | None = None, never: float = math.nan,
                           wide: bool | None = None) -> None:
    """Launch one copy kernel on checked tensors (``tiling``: the ``row`` tiling by
    default). ``n_tokens`` and ``never`` exist for the tests: fewer tokens (a copy
    that stops short) and a ``never`` equal to a cos value (which proves the cos/sin
    loads happen) must both be caught; ``wide`` forces the int64 index math of
    ``flat``, ``pairs`` and ``pair_scalars`` (None: where the indices reach 2**31)."""
    tokens, heads, head_dim = xq.shape
    n_tokens = tokens if n_tokens is None else n_tokens
    if tokens == 0 or heads == 0:
        return
    check_triton_device(xq, "same_bytes_copy")
    es = xq.element_size()
    tiling = same_bytes_copy_config(heads, head_dim, es) if tiling is None else tiling
    if not isinstance(tiling, CopyTiling):
        raise TypeError(f"tiling must be a CopyTiling, got {type(tiling).__name__}")
    if tiling.layout == "fused":  # the fused kernel's own program (any q/k strides)
        if not math.isnan(never):
            raise ValueError("the fused member gates on NaN cos/sin (its kernel takes no "
                             "never); test it with a NaN in the table instead")
        launch_fused_rows_copy(xq, xk, q_out, k_out, cos, sin,
                               RowsConfig(tiling.block_t, tiling.num_warps), n_tokens=n_tokens)
        return
    tensors = (xq, xk, q_out, k_out)
    row = heads * head_dim
    trig = (cos, sin, cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1), float(never))
    _check_rows(xq, xk, tiling.layout)
    vec = _vector_width(tensors, es)
    strides = tuple(t.stride(0) // vec for t in tensors)
    if tiling.layout == "row":
        grid = (triton.cdiv(tokens, tiling.block_t) * triton.cdiv(row, tiling.block_c),)
        _copy_row_kernel[grid](
            xq, xk, q_out, k_out, *trig[:2], n_tokens, *strides, *trig[2:],
            ROW=row, PAIRS=head_dim // 2, BLOCK_PAIRS=triton.next_power_of_2(head_dim // 2),
            BLOCK_T=tiling.block_t, BLOCK_C=tiling.block_c, VEC=vec, num_warps=tiling.num_warps)
    elif tiling.layout == "tokens":
        main, rest = row_chunks(heads, head_dim)  # the fused rows kernel's two chunks
        _copy_tokens_kernel[(triton.cdiv(tokens, tiling.block_t),)](
            xq, xk, q_out, k_out, *trig[:2], n_tokens, *strides, *trig[2:],
            ROW=row, PAIRS=head_dim // 2, MAIN=main, REST=rest, BLOCK_T=tiling.block_t, VEC=vec,
            HEAD_DIM=head_dim, INTERLEAVED=interleaved_cos_sin(cos, sin), num_warps=tiling.num_warps)
    elif tiling.layout == "heads":
        _copy_heads_kernel[(triton.cdiv(tokens, tiling.block_t), 2 * heads)](
            xq, xk, q_out, k_out, *trig[:2], n_tokens, *strides, *trig[2:],
            HEADS=heads, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
            BLOCK_T=tiling.block_t, VEC=vec, INTERLEAVED=interleaved_cos_sin(cos, sin),
            num_warps=tiling.num_warps)
    elif tiling.layout == "pair_scalars":
        _copy_pair_scalars_kernel[(triton.cdiv(tokens * row // 2, tiling.block),)](
            xq, xk, q_out, k_out, *trig[:2], n_tokens * row // 2,
            *(t.stride(0) for t in tensors), *trig[2:],
            HEADS=heads, HEAD_DIM=head_dim, BLOCK=tiling.block,
            WIDE=_reaches_int32(tokens, row, xq, xk, q_out, k_out, cos, sin)
            if wide is None else wide,
            num_warps=tiling.num_warps)
    elif tiling.layout == "pairs":
        _copy_pairs_kernel[(triton.cdiv(tokens * row // 2, tiling.block),)](
            xq, xk, q_out, k_out, *trig[:2], n_tokens, *strides, *trig[2:],
            ROW=row, HEAD_DIM=head_dim, BLOCK=tiling.block, VEC=vec,
            WIDE=_reaches_int32(tokens, row, xq, xk, q_out, k_out, cos, sin)
            if wide is None else wide,
            num_warps=tiling.num_warps)
    else:
        grid = (triton.cdiv(tokens * row, tiling.block),)
        _copy_flat_kernel[grid](
            xq, xk, q_out, k_out, *trig[:2], n_tokens, *strides, *trig[2:],
            ROW=row, PAIRS=head_dim // 2, BLOCK=tiling.block, VEC=vec,
            WIDE=tokens * row + tiling.block >= 2**31 if wide is None else wide,
            num_warps=tiling.num_warps)


def same_bytes_copy(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor, *,
                    inplace: bool = False,
                    tiling: CopyTiling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy q and k, reading cos/sin too: the bytes an out-of-place RoPE call moves
    (fresh contiguous outputs), or with ``inplace=True`` an in-place one's (q and k
    rewritten where they are). Same signature as a registry variant, so it is timed
    on the variants' own input sets; ``tiling`` picks a member of
    ``same_bytes_copy_tilings`` (the ``row`` tiling by default). Returns the outputs
    (equal to q and k, bit for bit)."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if tiling is not None and not isinstance(tiling, CopyTiling):
        raise TypeError(f"tiling must be a CopyTiling, got {type(tiling).__name__}")
    if tiling is None or tiling.layout != "fused":
        _check_rows(xq, xk, "row" if tiling is None else tiling.layout)
    cos, sin = cos_sin_views(freqs_cis)
    if inplace:
        check_writable_in_place(xq, xk)
        q_out, k_out = xq, xk
    else:
        q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
        k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
    launch_same_bytes_copy(xq, xk, q_out, k_out, cos, sin, tiling=tiling)
    return q_out, k_out


def same_bytes_copy_inplace(xq, xk, freqs_cis, *, tiling: CopyTiling | None = None):
    """``same_bytes_copy`` in place: the reference for in-place variants."""
    return same_bytes_copy(xq, xk, freqs_cis, inplace=True, tiling=tiling)
