"""One Triton launch that rotates q and k together (interleaved / GPT-J pairs).

Layout choice. A token's heads usually sit next to each other (head stride ==
head_dim, true for contiguous (T, H, D) tensors and for q/k views of a packed
(T, 3, H, D) qkv), so one token's q is a single run of ``H*D`` elements. We tile
that run as ``BLOCK_T`` tokens x ``BLOCK_C`` columns with ``BLOCK_C`` a power of
two, so the columns are provably contiguous and loads vectorise to 16 bytes,
whatever head_dim is: 16 x 72 = 1152 columns are 4.5 tiles of 256 with one
half-masked tile, instead of 72 of every 128 lanes busy in a per-head tile.
The frequency of column pair ``p`` is ``p % (D/2)``: a gather, served by L1
since a token's cos/sin row is at most a few hundred bytes shared by all heads.

Each program loads its q and k tiles, splits the pairs in registers, rotates in
fp32 and stores: q and k are read and written once, cos/sin read once from
DRAM, which is the minimal traffic. ``n_tokens`` is not specialised, so one
compiled kernel serves every token count; the grid is one-dimensional (limit
2^31 - 1 programs) and token offsets are int64, so any T fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels._checks import (
    check_cos_sin,
    check_qk,
    check_triton_device,
    check_writable_in_place,
)


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HEAD_DIM: tl.constexpr,
    ROW: tl.constexpr,  # heads * head_dim: the columns of one token
    HEADS_DENSE: tl.constexpr,  # every tensor has head stride == HEAD_DIM
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    N_COL_BLOCKS: tl.constexpr = (ROW + BLOCK_C - 1) // BLOCK_C
    HALF_C: tl.constexpr = BLOCK_C // 2
    pid = tl.program_id(0)
    col_block = pid % N_COL_BLOCKS
    tokens = (pid // N_COL_BLOCKS).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = col_block * BLOCK_C + tl.arange(0, BLOCK_C)
    pair_cols = col_block * HALF_C + tl.arange(0, HALF_C)
    freq_idx = pair_cols % (HEAD_DIM // 2)

    token_ok = tokens < n_tokens
    mask = token_ok[:, None] & (cols < ROW)[None, :]
    pair_mask = token_ok[:, None] & (pair_cols < ROW // 2)[None, :]

    if HEADS_DENSE:
        col_off = cols
        q_off = tokens[:, None] * q_stride_t + col_off[None, :]
        k_off = tokens[:, None] * k_stride_t + col_off[None, :]
        qo_off = tokens[:, None] * qo_stride_t + col_off[None, :]
        ko_off = tokens[:, None] * ko_stride_t + col_off[None, :]
    else:
        head = cols // HEAD_DIM
        dim = cols % HEAD_DIM
        q_off = tokens[:, None] * q_stride_t + (head * q_stride_h + dim)[None, :]
        k_off = tokens[:, None] * k_stride_t + (head * k_stride_h + dim)[None, :]
        qo_off = tokens[:, None] * qo_stride_t + (head * qo_stride_h + dim)[None, :]
        ko_off = tokens[:, None] * ko_stride_t + (head * ko_stride_h + dim)[None, :]

    # Issue all loads before any math so the memory system has them in flight.
    q = tl.load(q_ptr + q_off, mask=mask, other=0.0)
    k = tl.load(k_ptr + k_off, mask=mask, other=0.0)
    cos = tl.load(cos_ptr + tokens[:, None] * cos_stride_t + freq_idx[None, :] * cos_stride_d,
                  mask=pair_mask, other=0.0)
    sin = tl.load(sin_ptr + tokens[:, None] * sin_stride_t + freq_idx[None, :] * sin_stride_d,
                  mask=pair_mask, other=0.0)

    q0, q1 = tl.split(tl.reshape(q.to(tl.float32), (BLOCK_T, HALF_C, 2)))
    k0, k1 = tl.split(tl.reshape(k.to(tl.float32), (BLOCK_T, HALF_C, 2)))
    q_rot = tl.reshape(tl.join(q0 * cos - q1 * sin, q0 * sin + q1 * cos), (BLOCK_T, BLOCK_C))
    k_rot = tl.reshape(tl.join(k0 * cos - k1 * sin, k0 * sin + k1 * cos), (BLOCK_T, BLOCK_C))
    tl.store(q_out_ptr + qo_off, q_rot.to(q_out_ptr.dtype.element_ty), mask=mask)
    tl.store(k_out_ptr + ko_off, k_rot.to(k_out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class FusedConfig:
    """Launch settings of the fused kernel (see ``fused_launch_config``)."""

    block_t: int
    block_c: int
    num_warps: int

    def __post_init__(self):
        for name in ("block_t", "block_c", "num_warps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"FusedConfig.{name} must be a positive power of two, got {v!r}")
        if self.block_c < 2:
            raise ValueError(f"FusedConfig.block_c must be at least 2 (one pair), got {self.block_c}")


# Bytes of q (and as many of k) one program moves. 8 KB per tensor keeps 32
# bytes per thread per tensor in flight at 4 warps: enough independent loads to
# cover DRAM latency without so few programs that the tail of the grid idles.
TILE_BYTES = 8192
MAX_BLOCK_C = 256


def _pick_block_c(row: int) -> int:
    """Widest power-of-two column tile that wastes at most 1/8 of its lanes."""
    block_c = MAX_BLOCK_C
    while block_c > 2:
        padded = -(-row // block_c) * block_c
        if padded * 8 <= row * 9:
            return block_c
        block_c //= 2
    return 2


def fused_launch_config(heads: int, head_dim: int, element_size: int) -> FusedConfig:
    """A documented heuristic instead of autotuning: no per-shape benchmarking
    at first call, and the same config for every token count."""
    block_c = _pick_block_c(heads * head_dim)
    block_t = max(1, (TILE_BYTES // element_size) // block_c)
    # 4 warps is 128 threads on NVIDIA and 256 on AMD's 64-wide wavefronts: both
    # valid block sizes, and enough lanes for a 4096-element tile.
    return FusedConfig(block_t=block_t, block_c=block_c, num_warps=4)


def fused_grid(n_tokens: int, heads: int, head_dim: int, config: FusedConfig) -> tuple[int]:
    """One-dimensional grid: token blocks x column blocks, flattened."""
    row = heads * head_dim
    return (triton.cdiv(n_tokens, config.block_t) * triton.cdiv(row, config.block_c),)


def fused_qk_rope(
    xq: torch.Tensor,
    xk: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    inplace: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: FusedConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by (cos, sin) in one Triton launch, fp32 math.

    Args:
        xq, xk: (T, H, D) fp32/fp16/bf16, any strides with a unit last stride
            (e.g. views of a packed (T, 3, H, D) qkv).
        cos, sin: fp32 (T, D/2), contiguous or strided (e.g. the real and
            imaginary views of a complex64 ``freqs_cis``).
        inplace: write into ``xq``/``xk`` and return them.
        out: optional preallocated (q_out, k_out) of shape (T, H, D) and the
            input dtype; otherwise new contiguous tensors are returned.
        config: launch settings; ``fused_launch_config`` by default.
    """
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if inplace and out is not None:
        raise ValueError("give either inplace=True or out=..., not both")
    if inplace:
        check_writable_in_place(xq, xk)
        q_out, k_out = xq, xk
    elif out is not None:
        q_out, k_out = _check_out(out, xq)
    else:
        q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
        k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return q_out, k_out
    check_triton_device(xq, "fused_qk_rope")
    if config is None:
        config = fused_launch_config(heads, head_dim, xq.element_size())
    elif not isinstance(config, FusedConfig):
        raise TypeError(f"config must be a FusedConfig, got {type(config).__name__}")

    heads_dense = all(
        t.stride(1) == head_dim or heads == 1 for t in (xq, xk, q_out, k_out)
    )
    _fused_qk_rope_kernel[fused_grid(tokens, heads, head_dim, config)](
        xq, xk, q_out, k_out, cos, sin,
        tokens,
        xq.stride(0), xq.stride(1), xk.stride(0), xk.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        HEAD_DIM=head_dim,
        ROW=heads * head_dim,
        HEADS_DENSE=heads_dense,
        BLOCK_T=config.block_t,
        BLOCK_C=config.block_c,
        num_warps=config.num_warps,
    )
    return q_out, k_out


def _check_out(out, xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    check_writable_in_place(*out)
    return out[0], out[1]
