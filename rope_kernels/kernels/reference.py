"""The RoPE math in plain PyTorch: Kimi's native path and a float64 reference.

Kimi-K2.5's vision tower rotates adjacent pairs ``(x[2j], x[2j+1])`` of every
head by the angle stored in ``freqs_cis[t, j]`` (a unit complex number):

    out[2j]   = x[2j] * cos - x[2j+1] * sin
    out[2j+1] = x[2j] * sin + x[2j+1] * cos

which is the complex product ``(x[2j] + i x[2j+1]) * freqs_cis[t, j]``.

Qwen's towers (Qwen2.5-VL, Qwen3-VL) rotate the halves instead ("rotate-half", NeoX):
pair j is ``(x[j], x[j + D/2])``, turned by the same kind of angle. A rotation is one
function here, ``split_pairs`` (and its inverse ``join_pairs``): the math after it is
the same complex product for both (``vocabulary.ROTATIONS``).
"""

from __future__ import annotations

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_rotation


def split_pairs(x: torch.Tensor, rotation: str = "pairs") -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second) elements of each head's D/2 rotated pairs, (..., D/2) each:
    "pairs": x[2j], x[2j+1]; "half": x[j], x[j + D/2]."""
    if check_rotation(rotation) == "half":
        return x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    pairs = x.unflatten(-1, (-1, 2))
    return pairs[..., 0], pairs[..., 1]


def join_pairs(first: torch.Tensor, second: torch.Tensor, rotation: str = "pairs") -> torch.Tensor:
    """``split_pairs``'s inverse: the (..., D) head from its pairs' two elements."""
    if check_rotation(rotation) == "half":
        return torch.cat((first, second), dim=-1)
    return torch.stack((first, second), dim=-1).flatten(-2)


def native_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor, rotation: str = "pairs"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi's pre-PR path: fp32 upcast, complex multiply, cast back.

    Per tensor this launches an upcast copy, the complex multiply and the
    downcast: 3 kernels, 6 for q and k (2 when the data is already fp32).

    ``rotation="half"``: Qwen's own PyTorch path instead (transformers'
    ``apply_rotary_pos_emb_vision`` for Qwen2.5-VL/Qwen3-VL: fp32 upcast,
    ``x * cos + rotate_half(x) * sin`` with cos/sin repeated over both halves, cast
    back): per tensor upcast, multiply, negate, cat, multiply, add, downcast, 7
    kernels, 14 for q and k (10 on fp32 data) once its (T, D) cos/sin exist
    (``qwen_cos_sin``: the model builds them once per forward; the registry's ``native``
    builds them once per freqs_cis, here they are built per call).
    """
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    if check_rotation(rotation) == "half":
        return native_rotate_half(xq, xk, *qwen_cos_sin(freqs_cis))
    freqs = freqs_cis.unsqueeze(-2)  # (T, 1, D/2): broadcast over heads
    q_out = torch.view_as_real(_as_complex_pairs(xq) * freqs).flatten(-2)
    k_out = torch.view_as_real(_as_complex_pairs(xk) * freqs).flatten(-2)
    return q_out.type_as(xq), k_out.type_as(xk)


def qwen_cos_sin(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen's (T, 1, D) cos and sin: each half-width angle table repeated over both halves."""
    angles_cos, angles_sin = freqs_cis.real, freqs_cis.imag
    return (torch.cat((angles_cos, angles_cos), -1).unsqueeze(-2),
            torch.cat((angles_sin, angles_sin), -1).unsqueeze(-2))


def native_rotate_half(xq, xk, cos, sin):
    """Qwen's PyTorch rotate-half on (T, 1, D) cos/sin (``qwen_cos_sin``)."""

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def rotate(x):
        xf = x.float()
        return (xf * cos + rotate_half(xf) * sin).to(x.dtype)

    return rotate(xq), rotate(xk)


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
    xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    rotation: str = "pairs",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rotation in real arithmetic (what torch.compile can fuse)."""
    c = cos.unsqueeze(-2)
    s = sin.unsqueeze(-2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x0, x1 = split_pairs(x.float(), rotation)
        return join_pairs(x0 * c - x1 * s, x0 * s + x1 * c, rotation).to(x.dtype)

    return rotate(xq), rotate(xk)


def rope_reference(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor, rotation: str = "pairs"
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ground truth for correctness checks, on the inputs' device: pair j
    (``split_pairs``) times ``freqs_cis[t, j]``."""
    freqs = freqs_cis.detach().to(xq.device, torch.complex128).unsqueeze(-2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x0, x1 = split_pairs(x.detach().double(), rotation)
        out = torch.complex(x0.contiguous(), x1.contiguous()) * freqs
        return join_pairs(out.real, out.imag, rotation)

    return rotate(xq), rotate(xk)
