"""This project's re-creation of what vLLM PR #50400 merged (variant ``vllm_merged_recreated``).

A CPU-test stand-in written for this study, never a peer: the real merged path, with
vLLM's own rotary kernel, is ``rope_kernels.peers.vllm.vllm_merged_rope``.

The merged Kimi-K2.5 vision tower does not call a fused q/k kernel. Per layer
it copies ``freqs_cis.real`` and ``.imag`` into contiguous fp32 cos/sin, then
calls vLLM's generic ``ApplyRotaryEmb(is_neox_style=False,
enable_fp32_compute=True)`` once for q and once for k. Each call upcasts x to
fp32, runs a flash-attention-style Triton rotary kernel (a program per 4-token
tile and head, head_dim rounded up to a power-of-two block, interleaved pairs,
out of place) and casts the result back: 2 + 2 x 3 = 8 launches per layer.

The rotary kernel below is written for this study in that style; it is not
vLLM's or flash-attention's source.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_triton_device

TOKENS_PER_PROGRAM = 4


@triton.jit
def _rotary_interleaved_kernel(
    out_ptr, x_ptr, cos_ptr, sin_ptr,
    n_tokens,
    out_stride_t, out_stride_h, x_stride_t, x_stride_h, cs_stride_t,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next power of two >= HEAD_DIM
    BLOCK_T: tl.constexpr,
):
    head = tl.program_id(1).to(tl.int64)
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    # Each lane needs its pair partner: d ^ 1, i.e. d+1 for even d, d-1 for odd.
    partner = d + ((d + 1) % 2) * 2 - 1
    mask = (tokens < n_tokens)[:, None] & (d < HEAD_DIM)[None, :]

    x_row = x_ptr + tokens[:, None] * x_stride_t + head * x_stride_h
    x = tl.load(x_row + d[None, :], mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(x_row + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    cs_off = tokens[:, None] * cs_stride_t + (d // 2)[None, :]
    cos = tl.load(cos_ptr + cs_off, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + cs_off, mask=mask, other=0.0).to(tl.float32)
    # even lane: x0*cos - x1*sin ; odd lane: x1*cos + x0*sin
    signed_sin = tl.where((d % 2 == 0)[None, :], -sin, sin)
    out = x * cos + x_partner * signed_sin
    out_row = out_ptr + tokens[:, None] * out_stride_t + head * out_stride_h
    tl.store(out_row + d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Out-of-place interleaved rotary of one (T, H, D) tensor, like flash-attention's
    ``apply_rotary(..., interleaved=True)``. cos/sin must be contiguous (T, D/2)."""
    tokens, heads, head_dim = x.shape
    if x.stride(-1) != 1:
        raise ValueError("x must have a unit-stride last dimension")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (tokens, head_dim // 2) or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (tokens, head_dim/2) = "
                             f"{(tokens, head_dim // 2)}, got {tuple(t.shape)}")
    if heads > 65535:
        raise ValueError(f"heads ({heads}) exceeds the grid's 65535 limit on axis 1")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if tokens == 0 or heads == 0:
        return out
    check_triton_device(x, "vllm_merged_recreated")
    grid = (triton.cdiv(tokens, TOKENS_PER_PROGRAM), heads)
    _rotary_interleaved_kernel[grid](
        out, x, cos, sin,
        tokens,
        out.stride(0), out.stride(1), x.stride(0), x.stride(1), cos.stride(0),
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_T=TOKENS_PER_PROGRAM,
        num_warps=4,
    )
    return out


def vllm_merged_recreated_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged vLLM path: cos/sin copies, then upcast -> rotary -> downcast, per tensor."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    cos = freqs_cis.real.contiguous()
    sin = freqs_cis.imag.contiguous()
    q = apply_rotary_interleaved(xq.float(), cos, sin).to(xq.dtype)
    k = apply_rotary_interleaved(xk.float(), cos, sin).to(xk.dtype)
    return q, k
