"""One Triton launch that rotates q and k together: interleaved / GPT-J pairs (Kimi, the
default) or rotate-half / NeoX (Qwen's towers: ``rotation="half"``).

Layout: whole-token rows. A program owns ``BLOCK_T`` whole tokens: each token's q row
and k row, every head (``heads * head_dim`` elements, contiguous in a packed qkv: 2304
bytes each at 16 x 72 bf16). Triton blocks must be powers of two, so a row is covered
by two power-of-two chunks (16 x 72 = 1152 = 1024 + 128; 2 x 72 = 144 = 128 + 16); a
second chunk that is not a power of two is padded and masked. A pair's cos/sin is
fetched by its index within its head ((e % head_dim) / 2), per element in q's own
layout and split like q, so the values land in their pairs' registers with no layout
conversion; every head re-reads the token's head_dim/2 values from L1. From a complex
``freqs_cis`` (cos at even, sin at odd addresses) that is one contiguous vector load.
q/k strides reach the kernel divided by ``VEC`` (the widest vector that divides every
stride and base offset), which lets the compiler prove 16-byte alignment and emit
vector loads even though a 72-element head is not a multiple of 16 elements.

Why this layout: it was the fastest (or within noise of it) of the layouts an H200
exploration timed, out of place and in place, on every Kimi shape; the run and its figures
are in docs/DECISIONS.md ("The fused RoPE kernel"). The committed evidence is the
launch-config sweep (``data/<device>/fused_configs.csv``, written by
``bench.microbench.sweep_fused_configs``), which times the default beside every candidate.

The rotation is one composed function, the kernel's ``PAIR_FN``: ``_rotate_row_pairs``
turns (x[2j], x[2j+1]) from the chunk's own registers (a reshape and split);
``_rotate_row_half`` turns (x[j], x[j + D/2]). Rotate-half tiles a token differently
(``_rotate_halves_rows``, ``ROTATE_HALF``): every head's first and second half as
(heads, D/2) blocks at the same columns (D/2 = 36 -> 32 + 4), so a pair's two elements
sit in the same thread's registers and its cos/sin are one load per column shared by both
halves and (from L1) every head; the interleaved views of a complex freqs_cis are read as
one 64-bit word per column. An earlier layout loaded each element's partner by address
and cos/sin per element (how it fared: docs/DECISIONS.md, "Rotate-half layout").

All loads are issued before any store so they overlap in the memory system (in place, a
rotate-half partner is read before anything of its row is written).
``n_tokens`` is not specialised: one compiled kernel serves every token count.
The grid is one-dimensional (limit 2^31 - 1 programs) and token offsets are
int64, so any T fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (
    check_cos_sin,
    check_outputs_do_not_overlap,
    check_qk,
    check_rotation,
    check_triton_device,
    check_writable_in_place,
    mark_written,
)
from rope_kernels.kernels.launch_plan import KernelLaunch, PlanCache, new_outputs


@triton.jit
def _rotate_row_pairs(x, partner, e, cos, sin, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr,
                      HEAD_DIM: tl.constexpr):
    """(x0 + i x1) * (cos + i sin) on every adjacent pair of a (BLOCK_T, WIDTH) block,
    one cos/sin per pair (already gathered per head), in fp32 (``partner``, ``e``: unused,
    the pair is in the chunk's own registers)."""
    x0, x1 = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_T, WIDTH // 2, 2)))
    return tl.reshape(tl.join(x0 * cos - x1 * sin, x0 * sin + x1 * cos), (BLOCK_T, WIDTH))


@triton.jit
def _rotate_row_half(x, partner, e, cos, sin, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr,
                     HEAD_DIM: tl.constexpr):
    """x[j] * cos - x[j + D/2] * sin (first half), x[j] * cos + x[j - D/2] * sin (second
    half), in fp32: ``x`` is one half's chunk, ``partner`` the other half's at the same
    columns, ``e`` the chunk's element index within its head (first half: e < D/2)."""
    p = partner.to(tl.float32)
    signed = tl.where(e % HEAD_DIM < HEAD_DIM // 2, -p, p)
    return x.to(tl.float32) * cos + signed * sin


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


@triton.jit
def _load_row_chunk(q_tok, k_tok, cos_tok, sin_tok, e, mask, q_stride_h, k_stride_h,
                    cos_stride_d, sin_stride_d, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr,
                    HEAD_DIM: tl.constexpr, VEC: tl.constexpr, HEADS_ADJACENT: tl.constexpr,
                    INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr, EVICTION: tl.constexpr):
    """A chunk of q's and k's row elements ``e`` and their pairs' cos/sin (sin negated for
    the inverse rotation)."""
    q = tl.load(q_tok + _row_offsets(e, q_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                mask=mask, other=0.0, eviction_policy=EVICTION)
    k = tl.load(k_tok + _row_offsets(e, k_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
                mask=mask, other=0.0, eviction_policy=EVICTION)
    cos, sin = _row_cos_sin(cos_tok, sin_tok, e, mask, cos_stride_d, sin_stride_d,
                            BLOCK_T, WIDTH, HEAD_DIM, INTERLEAVED)
    if INVERSE:
        sin = -sin
    return q, k, cos, sin


@triton.jit
def _store_row_chunk(qo_tok, ko_tok, q, k, cos, sin, e, mask, qo_stride_h, ko_stride_h,
                     BLOCK_T: tl.constexpr, WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr,
                     VEC: tl.constexpr, HEADS_ADJACENT: tl.constexpr, PAIR_FN: tl.constexpr,
                     STORE_CACHE: tl.constexpr):
    """A chunk through ``PAIR_FN`` (pairs: a pair's partner is in the chunk's own registers,
    so ``partner`` is the chunk), stored at the outputs' row elements ``e``."""
    out_ty = qo_tok.dtype.element_ty
    tl.store(qo_tok + _row_offsets(e, qo_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
             PAIR_FN(q, q, e, cos, sin, BLOCK_T, WIDTH, HEAD_DIM).to(out_ty), mask=mask,
             cache_modifier=STORE_CACHE)
    tl.store(ko_tok + _row_offsets(e, ko_stride_h, VEC, HEAD_DIM, HEADS_ADJACENT),
             PAIR_FN(k, k, e, cos, sin, BLOCK_T, WIDTH, HEAD_DIM).to(out_ty), mask=mask,
             cache_modifier=STORE_CACHE)


@triton.jit
def _half_cos_sin(cos_tok, sin_tok, j, ok, cos_stride_d, sin_stride_d, BLOCK_T: tl.constexpr,
                  HEADS_BLOCK: tl.constexpr, WIDTH: tl.constexpr, INTERLEAVED: tl.constexpr):
    """cos and sin of columns ``j`` (BLOCK_T, HEADS_BLOCK, WIDTH; the same for every head).
    INTERLEAVED (a complex freqs_cis's views, [c0, s0, c1, s1, ...]): both in one 64-bit
    load per column (little-endian: cos in the low word), so cos/sin take the same vector
    layout as the q/k columns they multiply."""
    if INTERLEAVED:  # each column's (cos, sin) as one 64-bit word, split by bits
        cs = tl.load(cos_tok.to(tl.pointer_type(tl.uint64)) + j, mask=ok, other=0)
        c = (cs & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
        s = (cs >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    else:
        c = tl.load(cos_tok + j * cos_stride_d, mask=ok, other=0.0)
        s = tl.load(sin_tok + j * sin_stride_d, mask=ok, other=0.0)
    return c, s


@triton.jit
def _load_half_columns(q_row, k_row, cos_tok, sin_tok, j, ok, cos_stride_d, sin_stride_d,
                       BLOCK_T: tl.constexpr, HEADS_BLOCK: tl.constexpr, WIDTH: tl.constexpr,
                       HALF: tl.constexpr, INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr,
                       EVICTION: tl.constexpr):
    """Columns ``j`` of q's and k's first and second halves (every head) and their cos/sin
    (sin negated for the inverse rotation)."""
    q1 = tl.load(q_row + j, mask=ok, other=0.0, eviction_policy=EVICTION)
    q2 = tl.load(q_row + HALF + j, mask=ok, other=0.0, eviction_policy=EVICTION)
    k1 = tl.load(k_row + j, mask=ok, other=0.0, eviction_policy=EVICTION)
    k2 = tl.load(k_row + HALF + j, mask=ok, other=0.0, eviction_policy=EVICTION)
    c, s = _half_cos_sin(cos_tok, sin_tok, j, ok, cos_stride_d, sin_stride_d,
                         BLOCK_T, HEADS_BLOCK, WIDTH, INTERLEAVED)
    if INVERSE:
        s = -s
    return q1, q2, k1, k2, c, s


@triton.jit
def _store_half_columns(qo_row, ko_row, q1, q2, k1, k2, c, s, j, ok, BLOCK_T: tl.constexpr,
                        WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr, PAIR_FN: tl.constexpr,
                        STORE_CACHE: tl.constexpr):
    """Each half's columns ``j`` through ``PAIR_FN`` (its partner: the other half's same
    columns; ``PAIR_FN``'s element index within the head: j in the first half, j + D/2 in the
    second), stored where they came from."""
    out_ty = qo_row.dtype.element_ty
    HALF: tl.constexpr = HEAD_DIM // 2
    tl.store(qo_row + j, PAIR_FN(q1, q2, j, c, s, BLOCK_T, WIDTH, HEAD_DIM).to(out_ty),
             mask=ok, cache_modifier=STORE_CACHE)
    tl.store(qo_row + HALF + j, PAIR_FN(q2, q1, j + HALF, c, s, BLOCK_T, WIDTH, HEAD_DIM).to(out_ty),
             mask=ok, cache_modifier=STORE_CACHE)
    tl.store(ko_row + j, PAIR_FN(k1, k2, j, c, s, BLOCK_T, WIDTH, HEAD_DIM).to(out_ty),
             mask=ok, cache_modifier=STORE_CACHE)
    tl.store(ko_row + HALF + j, PAIR_FN(k2, k1, j + HALF, c, s, BLOCK_T, WIDTH, HEAD_DIM).to(out_ty),
             mask=ok, cache_modifier=STORE_CACHE)


@triton.jit
def _rotate_halves_rows(q_tok, k_tok, qo_tok, ko_tok, cos_tok, sin_tok, token_ok,
                        q_stride_h, k_stride_h, qo_stride_h, ko_stride_h,
                        cos_stride_d, sin_stride_d,
                        HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, MAIN: tl.constexpr,
                        REST: tl.constexpr, BLOCK_T: tl.constexpr, VEC: tl.constexpr,
                        HEADS_BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr, PAIR_FN: tl.constexpr,
                        INVERSE: tl.constexpr, EVICTION: tl.constexpr, STORE_CACHE: tl.constexpr):
    """Rotate-half rows: a token's heads as (HEADS_BLOCK, D/2) halves. Column j of the
    first half and column j of the second half are a pair, so each half is loaded as
    contiguous vectors at the same columns (MAIN + REST cover D/2, e.g. 36 = 32 + 4) and
    the rotation needs no partner gather; cos/sin are read once per column and token, by
    every head from L1. Head offsets are the runtime head strides times ``VEC`` (the vector
    width both halves share), so both halves get the same register layout."""
    h = tl.arange(0, HEADS_BLOCK)[None, :, None]
    ok_h = token_ok & (h < HEADS)
    q_row = q_tok + h * (q_stride_h * VEC)
    k_row = k_tok + h * (k_stride_h * VEC)
    qo_row = qo_tok + h * (qo_stride_h * VEC)
    ko_row = ko_tok + h * (ko_stride_h * VEC)
    HALF: tl.constexpr = HEAD_DIM // 2

    # all loads before any store (in place, a head's halves are read before either is written)
    j = tl.arange(0, MAIN)[None, None, :]
    ok = ok_h & (j < HALF)
    q1, q2, k1, k2, c, s = _load_half_columns(q_row, k_row, cos_tok, sin_tok, j + h * 0, ok,
                                              cos_stride_d, sin_stride_d, BLOCK_T, HEADS_BLOCK,
                                              MAIN, HALF, INTERLEAVED, INVERSE, EVICTION)
    if REST > 0:
        j2 = MAIN + tl.arange(0, REST)[None, None, :]
        ok2 = ok_h & (j2 < HALF)
        q3, q4, k3, k4, c2, s2 = _load_half_columns(q_row, k_row, cos_tok, sin_tok, j2 + h * 0,
                                                    ok2, cos_stride_d, sin_stride_d, BLOCK_T,
                                                    HEADS_BLOCK, REST, HALF, INTERLEAVED,
                                                    INVERSE, EVICTION)
    _store_half_columns(qo_row, ko_row, q1, q2, k1, k2, c, s, j, ok, BLOCK_T, MAIN, HEAD_DIM,
                        PAIR_FN, STORE_CACHE)
    if REST > 0:
        _store_half_columns(qo_row, ko_row, q3, q4, k3, k4, c2, s2, j2, ok2, BLOCK_T, REST,
                            HEAD_DIM, PAIR_FN, STORE_CACHE)


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_rows_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,  # in units of VEC elements
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,  # in units of VEC elements
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,  # token strides in CS_VEC units
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    MAIN: tl.constexpr,  # largest power of two <= HEADS * HEAD_DIM (or >= it: one padded block);
    # rotate-half: <= HEAD_DIM / 2
    REST: tl.constexpr,  # power of two covering the rest of the row (half) (0 when none)
    BLOCK_T: tl.constexpr, VEC: tl.constexpr,
    CS_VEC: tl.constexpr,  # widest fp32 vector (<= 4) dividing the cos/sin token stride
    HEADS_ADJACENT: tl.constexpr,  # head stride == HEAD_DIM in q, k and both outputs
    INTERLEAVED: tl.constexpr,  # sin is cos + 1 element, both at pair stride 2 (freqs_cis)
    PAIR_FN: tl.constexpr,  # (x, partner, e, cos, sin, BLOCK_T, WIDTH, HEAD_DIM) -> what a chunk stores
    INVERSE: tl.constexpr = False,  # rotate by -angle (the backward pass)
    EVICTION: tl.constexpr = "",  # q/k loads' eviction_policy ("": none)
    STORE_CACHE: tl.constexpr = "",  # q/k stores' cache_modifier ("": none)
    ROTATE_HALF: tl.constexpr = False,  # rows as (heads, D/2) halves (``_rotate_halves_rows``)
    HEADS_BLOCK: tl.constexpr = 1,  # rotate-half: heads padded to a power of two
):
    """A program rotates BLOCK_T whole tokens: each token's q row and k row (every head).
    ``PAIR_FN`` is what a chunk's pairs become before the store: the rotation
    (``_rotate_row_pairs`` or, with ``ROTATE_HALF``, ``_rotate_row_half``: what every launch
    here passes); ``bench/same_bytes_copy.py`` passes its gate instead (same loads, stores
    and programs, no arithmetic)."""
    ROW: tl.constexpr = HEADS * HEAD_DIM
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    if ROTATE_HALF:  # (BLOCK_T, HEADS_BLOCK, columns) blocks
        t3 = tokens[:, None, None]
        _rotate_halves_rows(q_ptr + t3 * (q_stride_t * VEC), k_ptr + t3 * (k_stride_t * VEC),
                            q_out_ptr + t3 * (qo_stride_t * VEC), k_out_ptr + t3 * (ko_stride_t * VEC),
                            cos_ptr + t3 * (cos_stride_t * CS_VEC), sin_ptr + t3 * (sin_stride_t * CS_VEC),
                            t3 < n_tokens, q_stride_h, k_stride_h, qo_stride_h, ko_stride_h,
                            cos_stride_d, sin_stride_d, HEADS, HEAD_DIM, MAIN, REST, BLOCK_T, VEC,
                            HEADS_BLOCK, INTERLEAVED, PAIR_FN, INVERSE, EVICTION, STORE_CACHE)
    else:  # pairs: whole-token rows in two chunks
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
        q, k, cos, sin = _load_row_chunk(q_tok, k_tok, cos_tok, sin_tok, e, mask, q_stride_h,
                                         k_stride_h, cos_stride_d, sin_stride_d, BLOCK_T, MAIN,
                                         HEAD_DIM, VEC, HEADS_ADJACENT, INTERLEAVED, INVERSE,
                                         EVICTION)
        if REST > 0:
            e2 = MAIN + tl.arange(0, REST)[None, :]
            mask2 = token_ok & (e2 < ROW)
            q2, k2, cos2, sin2 = _load_row_chunk(q_tok, k_tok, cos_tok, sin_tok, e2, mask2,
                                                 q_stride_h, k_stride_h, cos_stride_d,
                                                 sin_stride_d, BLOCK_T, REST, HEAD_DIM, VEC,
                                                 HEADS_ADJACENT, INTERLEAVED, INVERSE, EVICTION)
        _store_row_chunk(qo_tok, ko_tok, q, k, cos, sin, e, mask, qo_stride_h, ko_stride_h,
                         BLOCK_T, MAIN, HEAD_DIM, VEC, HEADS_ADJACENT, PAIR_FN, STORE_CACHE)
        if REST > 0:
            _store_row_chunk(qo_tok, ko_tok, q2, k2, cos2, sin2, e2, mask2, qo_stride_h,
                             ko_stride_h, BLOCK_T, REST, HEAD_DIM, VEC, HEADS_ADJACENT, PAIR_FN,
                             STORE_CACHE)


def head_dim_chunks(head_dim: int) -> tuple[int, int]:
    """(MAIN, REST): 72 -> (64, 8), 80 -> (64, 16), 128 -> (128, 0), 88 -> (64, 32)."""
    main = 1 << (head_dim.bit_length() - 1)
    rest = head_dim - main
    return main, (1 << (rest - 1).bit_length()) if rest else 0


# Cache hints Triton passes to the q/k loads and stores ("": none, the hardware's
# default). The sweep measures them (fused_configs.csv, columns load_eviction_policy
# and store_cache_modifier); none is on by default until a measurement says so.
LOAD_EVICTION_POLICIES = ("", "evict_first", "evict_last")
STORE_CACHE_MODIFIERS = ("", ".wb", ".cg", ".cs", ".wt")


def check_cache_hints(owner: str, eviction_policy, store_cache_modifier) -> None:
    """One-line errors for cache hints Triton would not take."""
    if eviction_policy not in LOAD_EVICTION_POLICIES:
        raise ValueError(f"{owner}.eviction_policy must be one of {LOAD_EVICTION_POLICIES}, "
                         f"got {eviction_policy!r}")
    if store_cache_modifier not in STORE_CACHE_MODIFIERS:
        raise ValueError(f"{owner}.store_cache_modifier must be one of {STORE_CACHE_MODIFIERS}, "
                         f"got {store_cache_modifier!r}")


def vector_width(tensors, element_size: int) -> int:
    """Widest power-of-two element count (at most 16 bytes) dividing every token
    and head stride and every base offset, so vector loads are provably aligned."""
    vec = max(1, 16 // element_size)
    while vec > 1:
        if all(t.stride(0) % vec == 0 and t.stride(1) % vec == 0
               and t.data_ptr() % (vec * element_size) == 0 for t in tensors):
            return vec
        vec //= 2
    return 1


def half_vector_width(tensors, element_size: int, head_dim: int) -> int:
    """Rotate-half: ``vector_width`` that also divides D/2, so a head's first and second
    half start on the same vector boundary (72 -> 36: 4 bf16 elements, 8 bytes)."""
    return _halving_to_divide(vector_width(tensors, element_size), head_dim // 2)


def _halving_to_divide(vec: int, n: int) -> int:
    """``vec`` halved until it divides ``n`` (at least 1)."""
    while vec > 1 and n % vec:
        vec //= 2
    return vec


def qk_strides(xq, xk, q_out, k_out, vec):
    """Token and head strides of q, k and their outputs, in units of ``vec`` elements."""
    return (xq.stride(0) // vec, xq.stride(1) // vec, xk.stride(0) // vec, xk.stride(1) // vec,
            q_out.stride(0) // vec, q_out.stride(1) // vec,
            k_out.stride(0) // vec, k_out.stride(1) // vec)


# Bytes of q (and as many of k) one program moves by default; rows_launch_config
# rounds down to whole tokens (at least one). Chosen from the tiles an H200 exploration
# timed (docs/DECISIONS.md, "The fused RoPE kernel"); the sweep times the same tiles
# (bench/fused_candidates.py's ROWS_TILE_BYTES_SWEPT).
ROWS_TILE_BYTES = 4096
ROWS_MAX_WARPS = 8


@dataclass(frozen=True)
class RowsConfig:
    """Launch settings of ``fused_qk_rope``'s kernel (see ``fused_launch_config``):
    whole tokens per program, warps, the q/k cache hints (off by default; the sweep
    times them) and the padded one-block form (a candidate; two chunks by default)."""

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


def interleaved_cos_sin(cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """fp32 cos and sin are the real and imaginary views of one complex freqs_cis:
    [c0, s0, c1, s1, ...] per token, sin one float after cos (one load reads both)."""
    return (sin.data_ptr() == cos.data_ptr() + 4 and cos.stride() == sin.stride()
            and cos.stride(1) == 2)


def cos_sin_vector(cos: torch.Tensor, sin: torch.Tensor, *counts: int) -> int:
    """The widest fp32 vector (4, 2 or 1 floats) a kernel may load cos/sin rows in:
    it divides both token strides, cos's base address in floats and every one of
    ``counts`` (what else the kernel's offsets step by). The kernels take the token
    strides in units of it."""
    vec = 4
    while vec > 1 and (cos.stride(0) % vec or sin.stride(0) % vec
                       or cos.data_ptr() % (4 * vec) or any(n % vec for n in counts)):
        vec //= 2
    return vec


def row_chunks(heads: int, head_dim: int, padded: bool = False) -> tuple[int, int]:
    """(MAIN, REST) covering a token's ``heads * head_dim`` row: two power-of-two chunks
    (16 x 72 = 1152 -> 1024 + 128), or one padded block (1152 -> 2048, 0)."""
    row = heads * head_dim
    return (1 << (row - 1).bit_length(), 0) if padded else head_dim_chunks(row)


def rows_launch_config(heads: int, head_dim: int, element_size: int,
                       tile_bytes: int = ROWS_TILE_BYTES, *, eviction_policy: str = "",
                       store_cache_modifier: str = "", padded: bool = False,
                       rotation: str = "pairs") -> RowsConfig:
    """Tokens per program: the largest power of two whose q rows fit ``tile_bytes``
    (at least one token). Warps: about one 16-byte vector of the row's first
    power-of-two chunk per thread (no thread holds a copy of another's data), 1-8;
    rotate-half: one vector of the first half's first chunk per head (its vector: the
    widest, up to 16 bytes, that divides D/2)."""
    for name, v in (("heads", heads), ("head_dim", head_dim), ("element_size", element_size),
                    ("tile_bytes", tile_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    row_bytes = heads * head_dim * element_size
    block_t = 1 << max(0, (tile_bytes // row_bytes).bit_length() - 1)
    if rotation == "half":
        vec = _halving_to_divide(max(16 // element_size, 1), head_dim // 2)
        main, _ = head_dim_chunks(max(head_dim // 2, 1))
        vectors = block_t * (1 << (heads - 1).bit_length()) * max(main // vec, 1)
    else:
        main, _ = row_chunks(heads, head_dim, padded)
        if padded:  # the vectors that hold data
            main = heads * head_dim
        vectors = block_t * main * element_size // 16
    warps = 1 << max(0, (vectors // 32).bit_length() - 1)
    return RowsConfig(block_t, min(max(warps, 1), ROWS_MAX_WARPS), eviction_policy,
                      store_cache_modifier, padded)


def fused_launch_config(heads: int, head_dim: int, element_size: int,
                        rotation: str = "pairs") -> RowsConfig:
    """The launch settings ``fused_qk_rope`` uses when given none: a documented
    heuristic instead of autotuning (no per-shape benchmarking at first call, and the
    same config for every token count, so one compile): ``rows_launch_config`` at
    ``ROWS_TILE_BYTES``, two chunks per row (per half, rotate-half), no cache hints."""
    return rows_launch_config(heads, head_dim, element_size, rotation=rotation)


# Elements one Triton block may hold (tl.arange / a tensor's numel): 2^20 in Triton 2-3.
TRITON_MAX_TENSOR_NUMEL = getattr(tl, "TRITON_MAX_TENSOR_NUMEL", 1 << 20)


def check_block_fits(config: RowsConfig, heads: int, head_dim: int, main: int) -> None:
    """A program holds ``block_t`` tokens x the row's larger chunk (``main``) in one
    Triton block, which may hold at most ``TRITON_MAX_TENSOR_NUMEL`` (2^20) elements:
    refuse a config or a row beyond it with what would fit (integer math, before launch)."""
    if config.block_t * main <= TRITON_MAX_TENSOR_NUMEL:
        return
    row = f"{heads} heads x {head_dim} = {heads * head_dim} elements"
    if main > TRITON_MAX_TENSOR_NUMEL:
        raise ValueError(f"fused_qk_rope: a token's row ({row}{', padded' if config.padded else ''}) "
                         f"needs a block of {main} elements, over Triton's limit of "
                         f"{TRITON_MAX_TENSOR_NUMEL} per block; rotate the heads in groups "
                         "(e.g. xq[:, :h], xk[:, :h]) whose rows fit")
    fits = TRITON_MAX_TENSOR_NUMEL // main
    raise ValueError(f"fused_qk_rope: RowsConfig(block_t={config.block_t}) x {main} row "
                     f"elements ({row}) is {config.block_t * main} elements per block, over "
                     f"Triton's limit of {TRITON_MAX_TENSOR_NUMEL}; use block_t <= {fits}")


def fused_grid(n_tokens: int, config: RowsConfig) -> tuple[int]:
    """One-dimensional grid: a program per ``config.block_t`` tokens."""
    return (triton.cdiv(n_tokens, config.block_t),)


# The Triton kernel fused_qk_rope launches (profiler attribution, launch counts).
DEFAULT_TRITON_KERNEL = "_fused_qk_rope_rows_kernel"


def fused_qk_rope(
    xq: torch.Tensor,
    xk: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rotation: str = "pairs",
    inplace: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: RowsConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by (cos, sin) in one Triton launch, fp32 math.

    Args:
        xq, xk: (T, H, D) fp32/fp16/bf16, any strides with a unit last stride
            (e.g. views of a packed (T, 3, H, D) qkv).
        cos, sin: fp32 (T, D/2), contiguous or strided (e.g. the real and
            imaginary views of a complex64 ``freqs_cis``): column j is pair j's angle.
        rotation: how a head's elements pair up (``vocabulary.ROTATIONS``): "pairs"
            (Kimi's interleaved x[2j], x[2j+1]; the default) or "half" (Qwen's
            rotate-half x[j], x[j + D/2]).
        inplace: write into ``xq``/``xk`` and return them (q and k must not
            share memory).
        out: optional preallocated (q_out, k_out) of shape (T, H, D) and the
            input dtype, sharing no memory with each other or the other input;
            otherwise new contiguous tensors are returned.
        config: launch settings; ``fused_launch_config`` by default.

    Out of place, the result is differentiable in q and k: the backward pass is
    the inverse rotation (by -angle), again one launch for dq and dk. In place and
    ``out=`` do not record autograd and refuse inputs that require grad.

    Host time: a call whose inputs match the layout of an earlier checked call
    (``kernels.launch_plan``) skips the checks that depend only on that layout and
    launches with the arguments ``rows_launch`` derived then.
    """
    if out is None and config is None:
        done = _PLANS.call(xq, xk, cos, sin, inplace, extra=(rotation,))
        if done is not None:
            return done
    check_rotation(rotation)
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if inplace and out is not None:
        raise ValueError("give either inplace=True or out=..., not both")
    if config is not None and not isinstance(config, RowsConfig):
        raise TypeError(f"config must be a RowsConfig, got {type(config).__name__}")
    needs_grad = torch.is_grad_enabled() and (xq.requires_grad or xk.requires_grad)
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("fused_qk_rope does not differentiate with respect to cos/sin; "
                         "pass cos.detach(), sin.detach()")
    if inplace:
        if needs_grad:
            leaf = any(x.requires_grad and (x.is_leaf or x._base is not None and x._base.is_leaf)
                       for x in (xq, xk))
            raise ValueError("inplace=True on " + ("a leaf tensor (or a view of one) " if leaf
                             else "a tensor ") + "that requires grad: autograd cannot record "
                             "it; use inplace=False or torch.no_grad()")
        check_writable_in_place(xq, xk, reads=(("cos", cos), ("sin", sin)))
        mark_written(xq, xk)
        q_out, k_out = xq, xk
    elif out is not None:
        if needs_grad:
            raise ValueError("out=... does not support autograd (inputs require grad); "
                             "leave out unset or use torch.no_grad()")
        q_out, k_out = _check_out(out, xq, xk, reads=(("cos", cos), ("sin", sin)))
        mark_written(q_out, k_out)
    elif needs_grad:
        return _FusedQKRopeFunction.apply(xq, xk, cos, sin, config, rotation)
    else:
        q_out, k_out = new_outputs(xq)
    if out is None and config is None and not needs_grad:
        plan = _PLANS.remember(xq, xk, q_out, k_out, cos, sin, inplace,
                               lambda: rows_launch(xq, xk, q_out, k_out, cos, sin, None,
                                                   rotation=rotation),
                               extra=(rotation,))
        if plan is not None:
            if plan.launch is not None:
                plan.launch.launch(xq, xk, q_out, k_out, cos, sin)
            return q_out, k_out
    _launch_rows(xq, xk, q_out, k_out, cos, sin, config, rotation=rotation)
    return q_out, k_out


# Layouts checked before (kernels/launch_plan.py): a call on one skips the checks that depend
# only on its layout and launches with the arguments ``rows_launch`` derived then.
_PLANS = PlanCache()


class _FusedQKRopeFunction(torch.autograd.Function):
    """Out-of-place rotation with a backward: a rotation is orthogonal, so the
    gradient is the same rotation by -angle (same kernel, one launch)."""

    @staticmethod
    def forward(ctx, xq, xk, cos, sin, config, rotation="pairs"):
        ctx.save_for_backward(cos, sin)
        ctx.config, ctx.rotation = config, rotation
        q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
        k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
        _launch_rows(xq, xk, q_out, k_out, cos, sin, config, rotation=rotation)
        return q_out, k_out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        grads = []
        for g, like in ((dq, dk), (dk, dq)):
            if g is None:  # only one output was used
                g = torch.zeros_like(like)
            grads.append(g if g.stride(-1) == 1 or g.shape[-1] == 1 else g.contiguous())
        dq, dk = grads
        gq = torch.empty(dq.shape, dtype=dq.dtype, device=dq.device)
        gk = torch.empty(dk.shape, dtype=dk.dtype, device=dk.device)
        _launch_rows(dq, dk, gq, gk, cos, sin, ctx.config, inverse=True, rotation=ctx.rotation)
        return gq, gk, None, None, None, None


def rows_launch(xq, xk, q_out, k_out, cos, sin, config: RowsConfig | None, *,
                inverse: bool = False, pair_fn=None, rotation: str = "pairs",
                n_tokens: int | None = None) -> KernelLaunch | None:
    """The rows kernel's launch on checked tensors of this layout (None: nothing to launch):
    the one derivation of its grid, scalars and constexprs, used by every launch (checked,
    planned, backward, the same-bytes copy's ``fused`` member). ``pair_fn``: the kernel's
    ``PAIR_FN`` (None: the rotation; ``bench.same_bytes_copy`` passes its gate); ``rotation``:
    "pairs" or "half" (checked by the caller); ``n_tokens`` (tests only): stop short of the
    tensors."""
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return None
    half = rotation == "half"
    if config is None:
        config = fused_launch_config(heads, head_dim, xq.element_size(), rotation=rotation)
    elif half and config.padded:
        raise ValueError("RowsConfig(padded=True) is a pairs layout (one padded row block); "
                         "rotation='half' tiles each head's halves")
    if half:  # each head's halves: (heads padded, columns of D/2 in two chunks)
        main, rest = head_dim_chunks(head_dim // 2)
        heads_block = 1 << (heads - 1).bit_length()
        check_block_fits(config, heads, head_dim, heads_block * main)
        vec = half_vector_width((xq, xk, q_out, k_out), xq.element_size(), head_dim)
    else:
        main, rest = row_chunks(heads, head_dim, config.padded)
        heads_block = 1
        check_block_fits(config, heads, head_dim, main)
        vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    check_triton_device(xq, "fused_qk_rope")
    cs_vec = cos_sin_vector(cos, sin)
    scalars = (tokens if n_tokens is None else n_tokens, *qk_strides(xq, xk, q_out, k_out, vec),
               cos.stride(0) // cs_vec, cos.stride(1), sin.stride(0) // cs_vec, sin.stride(1))
    constexprs = dict(  # by name (KernelLaunch orders them as the kernel's parameters)
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t, VEC=vec,
        CS_VEC=cs_vec,
        HEADS_ADJACENT=not half and (heads == 1 or all(t.stride(1) == head_dim
                                                       for t in (xq, xk, q_out, k_out))),
        INTERLEAVED=interleaved_cos_sin(cos, sin),  # cos and sin in one vector load
        PAIR_FN=(_rotate_row_half if half else _rotate_row_pairs) if pair_fn is None else pair_fn,
        INVERSE=inverse, EVICTION=config.eviction_policy, STORE_CACHE=config.store_cache_modifier,
        ROTATE_HALF=half, HEADS_BLOCK=heads_block)
    return KernelLaunch(_fused_qk_rope_rows_kernel, fused_grid(tokens, config), scalars,
                        constexprs, config.num_warps)


def _launch_rows(xq, xk, q_out, k_out, cos, sin, config: RowsConfig | None, **options) -> None:
    """Derive (``rows_launch``) and launch once: a call whose layout is not planned."""
    launch = rows_launch(xq, xk, q_out, k_out, cos, sin, config, **options)
    if launch is not None:
        launch.launch(xq, xk, q_out, k_out, cos, sin)


def _check_out(out, xq: torch.Tensor, xk: torch.Tensor,
               reads=()) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a (q_out, k_out) pair of tensors")
    for name, t in zip(("q_out", "k_out"), out):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != xq.shape or t.dtype != xq.dtype or t.device != xq.device:
            raise ValueError(
                f"{name} must match xq: shape {tuple(xq.shape)}, {xq.dtype} on {xq.device}; "
                f"got {tuple(t.shape)}, {t.dtype} on {t.device}"
            )
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit-stride last dimension")
    check_outputs_do_not_overlap(xq, xk, out[0], out[1], reads)
    return out[0], out[1]
