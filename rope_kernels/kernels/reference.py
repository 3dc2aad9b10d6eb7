"""The RoPE math in plain PyTorch: Kimi's native path and a float64 reference.

Kimi-K2.5's vision tower rotates adjacent pairs ``(x[2j], x[2j+1])`` of every
head by the angle stored in ``freqs_cis[t, j]`` (a unit complex number):

    out[2j]   = x[2j] * cos - x[2j+1] * sin
    out[2j+1] = x[2j] * sin + x[2j+1] * cos

which is the complex product ``(x[2j] + i x[2j+1]) * freqs_cis[t, j]``.
"""

from __future__ import annotations

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk


def native_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi's pre-PR path: fp32 upcast, complex multiply, cast back.

    Per tensor this launches an upcast copy, the complex multiply and the
    downcast: 3 kernels, 6 for q and k (2 when the data is already fp32).
    """
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    freqs = freqs_cis.unsqueeze(-2)  # (T, 1, D/2): broadcast over heads
    q_out = torch.view_as_real(_as_complex_pairs(xq) * freqs).flatten(-2)
    k_out = torch.view_as_real(_as_complex_pairs(xk) * freqs).flatten(-2)
    return q_out.type_as(xq), k_out.type_as(xk)


def _as_complex_pairs(x: torch.Tensor) -> torch.Tensor:
    """x upcast to fp32 and viewed as complex pairs. A complex view needs an even
    storage offset and even strides; an fp32 view that lacks them (e.g. at an odd
    offset into a larger buffer) is copied first (Kimi's own tensors never are)."""
    xf = x.float()
    if xf.storage_offset() % 2 or any(s % 2 for n, s in zip(xf.shape[:-1], xf.stride()[:-1])
                                      if n > 1):
        xf = xf.clone(memory_format=torch.contiguous_format)
    # the pair count spelled out: view(..., -1, 2) cannot infer it on zero tokens
    return torch.view_as_complex(xf.view(*xf.shape[:-1], xf.shape[-1] // 2, 2))


def cos_sin_views(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin as strided fp32 views into ``freqs_cis``: no copy, no kernel."""
    if freqs_cis.dtype != torch.complex64:
        raise TypeError(f"freqs_cis must be complex64, got {freqs_cis.dtype}")
    real = torch.view_as_real(freqs_cis)
    return real[..., 0], real[..., 1]


def rope_cos_sin(
    xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rotation in real arithmetic (what torch.compile can fuse)."""
    c = cos.unsqueeze(-2)
    s = sin.unsqueeze(-2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = x.float().unflatten(-1, (-1, 2))
        x0, x1 = pairs[..., 0], pairs[..., 1]
        out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
        return out.flatten(-2).to(x.dtype)

    return rotate(xq), rotate(xk)


def rope_reference(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ground truth for correctness checks, on the inputs' device."""
    freqs = freqs_cis.detach().to(xq.device, torch.complex128).unsqueeze(-2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xd = x.detach().double().contiguous()
        xc = torch.view_as_complex(xd.view(*xd.shape[:-1], xd.shape[-1] // 2, 2))
        return torch.view_as_real(xc * freqs).flatten(-2)

    return rotate(xq), rotate(xk)
