"""The same-bytes copy: a reference that moves exactly the bytes one RoPE call moves.

What it is. A Triton kernel that reads q and k where a RoPE call reads them (the
strided views of the packed (T, 3, H, D) qkv), reads the fp32 cos and sin of every
token once (the strided real/imaginary views of ``freqs_cis``), and writes q and k
unchanged: out of place into fresh contiguous (T, H, D) outputs, like an
out-of-place variant, or in place back into q and k, like an in-place variant. It
does no arithmetic, so no RoPE kernel that moves the same bytes can beat it beyond
noise: it is the limit at that size, timed exactly like the variants (same input
sets, same timer, same rounds).

Why not ``clone()``. A clone of a contiguous buffer is one ``cudaMemcpyAsync``,
whose speed on an H200 depends on the byte count's alignment: at Kimi's token
counts (multiples of 5476) it ran at 40-65% of the large-copy ceiling, so the
fused kernel read "108-140% of a copy". An SM copy has no such cliff.

The cos/sin reads. A copy would not need them, so the kernel compares them with
``never`` (a NaN passed at run time, equal to nothing) and would zero the token's
first column block where one matched: the compiler cannot drop the loads, and the
stored values are the loaded ones bit for bit. Each token's cos/sin are read by the program holding
its first column block only, so they cross the memory bus once, as in
``minimal_bytes``.

Layout. A program owns ``block_t`` tokens x ``block_c`` contiguous elements of a
token's heads x head_dim row (the row is contiguous in a packed qkv view);
``same_bytes_copy_config`` picks the tile (see there). Token offsets are int64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (check_freqs_cis, check_qk, check_triton_device,
                                         check_writable_in_place)
from rope_kernels.kernels.reference import cos_sin_views


@triton.jit(do_not_specialize=["n_tokens", "never"])
def _same_bytes_copy_kernel(
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
    pair_mask = token_ok[:, None] & (j < PAIRS) & (col_block == 0)
    cos = tl.load(cos_ptr + t2 * cos_stride_t + j * cos_stride_d, mask=pair_mask, other=0.0)
    sin = tl.load(sin_ptr + t2 * sin_stride_t + j * sin_stride_d, mask=pair_mask, other=0.0)
    hits = tl.sum(((cos == never) | (sin == never)).to(tl.int32), axis=1)
    keep = (hits == 0)[:, None]
    tl.store(q_out_ptr + t2 * (qo_stride_t * VEC) + c2, tl.where(keep, q, 0.0), mask=mask)
    tl.store(k_out_ptr + t2 * (ko_stride_t * VEC) + c2, tl.where(keep, k, 0.0), mask=mask)


# Bytes of q (and as many of k) one program moves: the fused kernel's tile
# (``fused.TILE_BYTES``, measured there), about one 16-byte vector per thread of
# 4 warps, so both kernels run the same number of similar programs.
TILE_BYTES = 2048
MIN_SEGMENT_BYTES = 32  # one DRAM sector: narrower column blocks waste bus bytes


@dataclass(frozen=True)
class CopyConfig:
    """Launch settings of the same-bytes copy (see ``same_bytes_copy_config``)."""

    block_t: int  # tokens per program
    block_c: int  # contiguous elements of a token's row per program
    num_warps: int


def same_bytes_copy_config(heads: int, head_dim: int, element_size: int) -> CopyConfig:
    """Column blocks: the largest power of two dividing the row (heads x head_dim),
    so no lane is masked off (1152 = 9 x 128 at 16 x 72), capped at the tile; when
    that is narrower than a DRAM sector, the row's power-of-two cover instead.
    Tokens per program fill the rest of ``TILE_BYTES``."""
    for name, v in (("heads", heads), ("head_dim", head_dim), ("element_size", element_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    row = heads * head_dim
    tile = max(1, TILE_BYTES // element_size)
    block_c = min(row & -row, tile)
    if block_c * element_size < MIN_SEGMENT_BYTES:
        block_c = min(triton.next_power_of_2(row), tile)
    return CopyConfig(block_t=max(1, tile // block_c), block_c=block_c, num_warps=4)


def _token_vector_width(tensors, element_size: int) -> int:
    """Widest power-of-two element count (at most 16 bytes) dividing every token
    stride and base offset, so row loads are provably aligned vectors."""
    vec = max(1, 16 // element_size)
    while vec > 1:
        if all(t.stride(0) % vec == 0 and t.data_ptr() % (vec * element_size) == 0
               for t in tensors):
            return vec
        vec //= 2
    return 1


def _check_rows(xq: torch.Tensor, xk: torch.Tensor) -> None:
    _, heads, head_dim = xq.shape
    for name, x in (("xq", xq), ("xk", xk)):
        if heads > 1 and x.stride(1) != head_dim:
            raise ValueError(f"{name}: same_bytes_copy needs each token's heads x head_dim row "
                             f"contiguous (head stride {head_dim}), got strides {tuple(x.stride())}")


def launch_same_bytes_copy(xq, xk, q_out, k_out, cos, sin, *, n_tokens: int | None = None,
                           never: float = math.nan) -> None:
    """Launch the copy kernel on checked tensors. ``n_tokens`` and ``never`` exist
    for the tests: fewer tokens (a copy that stops short) and a ``never`` equal to
    a cos value (which proves the cos/sin loads happen) must both be caught."""
    tokens, heads, head_dim = xq.shape
    n_tokens = tokens if n_tokens is None else n_tokens
    if tokens == 0 or heads == 0:
        return
    check_triton_device(xq, "same_bytes_copy")
    cfg = same_bytes_copy_config(heads, head_dim, xq.element_size())
    vec = _token_vector_width((xq, xk, q_out, k_out), xq.element_size())
    row = heads * head_dim
    grid = (triton.cdiv(tokens, cfg.block_t) * triton.cdiv(row, cfg.block_c),)
    _same_bytes_copy_kernel[grid](
        xq, xk, q_out, k_out, cos, sin,
        n_tokens,
        xq.stride(0) // vec, xk.stride(0) // vec, q_out.stride(0) // vec, k_out.stride(0) // vec,
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        float(never),
        ROW=row,
        PAIRS=head_dim // 2,
        BLOCK_PAIRS=triton.next_power_of_2(head_dim // 2),
        BLOCK_T=cfg.block_t,
        BLOCK_C=cfg.block_c,
        VEC=vec,
        num_warps=cfg.num_warps,
    )


def same_bytes_copy(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor, *,
                    inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy q and k, reading cos/sin too: the bytes an out-of-place RoPE call moves
    (fresh contiguous outputs), or with ``inplace=True`` an in-place one's (q and k
    rewritten where they are). Same signature as a registry variant, so it is timed
    on the variants' own input sets. Returns the outputs (equal to q and k, bit for bit)."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    _check_rows(xq, xk)
    cos, sin = cos_sin_views(freqs_cis)
    if inplace:
        check_writable_in_place(xq, xk)
        q_out, k_out = xq, xk
    else:
        q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
        k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
    launch_same_bytes_copy(xq, xk, q_out, k_out, cos, sin)
    return q_out, k_out


def same_bytes_copy_inplace(xq, xk, freqs_cis):
    """``same_bytes_copy`` in place: the reference for in-place variants."""
    return same_bytes_copy(xq, xk, freqs_cis, inplace=True)
