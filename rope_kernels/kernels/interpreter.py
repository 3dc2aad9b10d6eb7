"""Make Triton's CPU interpreter round fp32 -> bf16 the way GPUs do.

Triton 3.6's interpreter (TRITON_INTERPRET=1) converts fp32 to bf16 by cutting
the low mantissa bits, while GPUs round to nearest even (``cvt.rn.bf16.f32``).
A kernel that stores bf16 would then show twice the rounding error on CPU that
it has on a GPU. So that CPU runs compute what GPUs compute, this module swaps
in a correctly rounding cast; it is applied only when the interpreter is on.
"""

from __future__ import annotations

import numpy as np
import torch

_PATCHED = False


def patch_bf16_rounding() -> bool:
    """Patch the interpreter's fp32 -> bf16 cast; returns True once patched."""
    global _PATCHED
    if _PATCHED:
        return True
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    except ImportError:  # a Triton without this interpreter layout: leave it alone
        return False

    truncating_cast = InterpreterBuilder.cast_impl

    def rounding_cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            values = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = values.to(torch.bfloat16).view(torch.uint16).numpy()
            return TensorHandle(bits.reshape(np.shape(src.data)), dst_type.scalar)
        return truncating_cast(self, src, dst_type)

    InterpreterBuilder.cast_impl = rounding_cast
    _PATCHED = True
    return True
