"""One Triton launch that rotates q and k together (interleaved / GPT-J pairs).

Layout. A program owns ``BLOCK_T`` tokens x ``BLOCK_H`` heads x the whole
head_dim. Triton blocks must be powers of two, so head_dim is covered by at
most two power-of-two chunks: 72 = 64 + 8, 80 = 64 + 16, 128 = 128 (a second
chunk that is not a power of two, e.g. 24 of 88, is padded and masked). Every
lane does useful work for the common head dims, unlike a 128-wide block for 72.

Why this shape (measured on an H200, see notebooks/02_microbench): cos/sin of
a token are loaded once and broadcast over the program's heads instead of
gathered per element, and no pair ever crosses a chunk, so splitting pairs
stays in registers with no shared-memory layout conversion. q/k strides reach
the kernel divided by ``VEC`` (the widest vector that divides every stride and
base offset), which lets the compiler prove 16-byte alignment and emit vector
loads even though a 72-element head is not a multiple of 16 elements.

All loads are issued before any store so they overlap in the memory system.
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
    check_triton_device,
    check_writable_in_place,
)


@triton.jit
def _rotate_pairs(x, cos, sin, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                  WIDTH: tl.constexpr):
    """(x0 + i x1) * (cos + i sin) on every adjacent pair, in fp32."""
    x0, x1 = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_T, BLOCK_H, WIDTH // 2, 2)))
    c = cos[:, None, :]  # one value per (token, pair), broadcast over heads
    s = sin[:, None, :]
    return tl.reshape(tl.join(x0 * c - x1 * s, x0 * s + x1 * c), (BLOCK_T, BLOCK_H, WIDTH))


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_kernel(
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
    EVICTION: tl.constexpr = "",  # q/k loads' eviction_policy ("": none; FusedConfig)
    STORE_CACHE: tl.constexpr = "",  # q/k stores' cache_modifier ("": none)
):
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


@dataclass(frozen=True)
class FusedConfig:
    """Launch settings of the fused kernel (see ``fused_launch_config``)."""

    block_t: int  # tokens per program
    block_h: int  # heads per program
    num_warps: int
    eviction_policy: str = ""  # of the q/k loads, e.g. "evict_first" (LOAD_EVICTION_POLICIES)
    store_cache_modifier: str = ""  # of the q/k stores, e.g. ".cs" (STORE_CACHE_MODIFIERS)

    def __post_init__(self):
        for name in ("block_t", "block_h", "num_warps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"FusedConfig.{name} must be a positive power of two, got {v!r}")
        check_cache_hints("FusedConfig", self.eviction_policy, self.store_cache_modifier)


# Bytes of q (and as many of k) one program moves. Measured on an H200 (bf16,
# CUDA graphs, 7 shapes from 256 x 3 x 128 to 65536 x 16 x 72, block_t x
# block_h x num_warps swept; data/nvidia-h200/fused_configs.csv): the fastest
# tiles held 1-2 KB of q, about one 16-byte vector per thread, i.e. many small
# programs rather than few large ones. This rule picks the fastest config on 4
# of the 7 shapes and is within 1.6% on the others at 8192 tokens and more; at
# 256 tokens (latency-bound, 2 us) a smaller tile would be 6% faster.
TILE_BYTES = 2048
MAX_BLOCK_H = 16

# The kernel ``fused_qk_rope`` launches when no config is given: "tiles" (this file's
# kernel, BLOCK_T tokens x BLOCK_H heads) or "rows" (``fused_candidates``' whole-token
# rows, ``rows_launch_config``). Making the rows candidate the default is this one line;
# ``default_triton_kernel()`` follows it (profiler attribution, the sweep's is_default).
DEFAULT_LAYOUT = "tiles"
LAYOUTS = {"tiles": "_fused_qk_rope_kernel", "rows": "_fused_qk_rope_rows_kernel"}


def default_triton_kernel() -> str:
    """Name of the Triton kernel ``fused_qk_rope`` launches by default."""
    return LAYOUTS[DEFAULT_LAYOUT]


def fused_launch_config(heads: int, head_dim: int, element_size: int) -> FusedConfig:
    """A documented heuristic instead of autotuning: no per-shape benchmarking at
    first call, and the same config for every token count (so one compile).

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
    return FusedConfig(block_t=block_t, block_h=block_h, num_warps=4)


def fused_grid(n_tokens: int, heads: int, config: FusedConfig) -> tuple[int]:
    """One-dimensional grid: token blocks x head blocks, flattened."""
    return (triton.cdiv(n_tokens, config.block_t) * triton.cdiv(heads, config.block_h),)


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
        inplace: write into ``xq``/``xk`` and return them (q and k must not
            share memory).
        out: optional preallocated (q_out, k_out) of shape (T, H, D) and the
            input dtype, sharing no memory with each other or the other input;
            otherwise new contiguous tensors are returned.
        config: launch settings; ``fused_launch_config`` by default.

    Out of place, the result is differentiable in q and k: the backward pass is
    the inverse rotation (by -angle), again one launch for dq and dk. In place and
    ``out=`` do not record autograd and refuse inputs that require grad.
    """
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if inplace and out is not None:
        raise ValueError("give either inplace=True or out=..., not both")
    if config is not None and not isinstance(config, FusedConfig):
        raise TypeError(f"config must be a FusedConfig, got {type(config).__name__}")
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
        q_out, k_out = xq, xk
    elif out is not None:
        if needs_grad:
            raise ValueError("out=... does not support autograd (inputs require grad); "
                             "leave out unset or use torch.no_grad()")
        q_out, k_out = _check_out(out, xq, xk, reads=(("cos", cos), ("sin", sin)))
    elif needs_grad:
        return _FusedQKRopeFunction.apply(xq, xk, cos, sin, config)
    else:
        q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
        k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
    _launch(xq, xk, q_out, k_out, cos, sin, config, inverse=False)
    return q_out, k_out


class _FusedQKRopeFunction(torch.autograd.Function):
    """Out-of-place rotation with a backward: a rotation is orthogonal, so the
    gradient is the same rotation by -angle (same kernel, one launch)."""

    @staticmethod
    def forward(ctx, xq, xk, cos, sin, config):
        ctx.save_for_backward(cos, sin)
        ctx.config = config
        q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
        k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
        _launch(xq, xk, q_out, k_out, cos, sin, config, inverse=False)
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
        _launch(dq, dk, gq, gk, cos, sin, ctx.config, inverse=True)
        return gq, gk, None, None, None


def _launch(xq, xk, q_out, k_out, cos, sin, config: FusedConfig | None, *,
            inverse: bool) -> None:
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return
    check_triton_device(xq, "fused_qk_rope")
    if config is None and DEFAULT_LAYOUT == "rows":
        from rope_kernels.kernels.fused_candidates import launch_rows

        launch_rows(xq, xk, q_out, k_out, cos, sin, None, inverse=inverse)
        return
    if config is None:
        config = fused_launch_config(heads, head_dim, xq.element_size())
    main, rest = head_dim_chunks(head_dim)
    vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    _fused_qk_rope_kernel[fused_grid(tokens, heads, config)](
        xq, xk, q_out, k_out, cos, sin,
        tokens,
        xq.stride(0) // vec, xq.stride(1) // vec, xk.stride(0) // vec, xk.stride(1) // vec,
        q_out.stride(0) // vec, q_out.stride(1) // vec,
        k_out.stride(0) // vec, k_out.stride(1) // vec,
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        HEADS=heads,
        HEAD_DIM=head_dim,
        MAIN=main,
        REST=rest,
        BLOCK_T=config.block_t,
        BLOCK_H=config.block_h,
        VEC=vec,
        INVERSE=inverse,
        EVICTION=config.eviction_policy,
        STORE_CACHE=config.store_cache_modifier,
        num_warps=config.num_warps,
    )


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
