"""When Triton kernels run in its CPU interpreter, and making it round fp32 -> bf16
the way GPUs do.

Triton 3.6 chooses between its compiler and its interpreter when a ``@triton.jit``
function is *defined* (``triton/runtime/jit.py`` reads ``TRITON_INTERPRET``
in the decorator), not when it is launched. ``use_interpreter_without_gpu()`` is
therefore called before the first definition: at the top of
``rope_kernels.kernels.checks``, which every module that defines or loads a Triton
kernel (ours and the peers' files) imports first. ``import rope_kernels`` alone
does not reach it.

Triton 3.6's interpreter (TRITON_INTERPRET=1) converts fp32 to bf16 by cutting
the low mantissa bits, while GPUs round to nearest even (``cvt.rn.bf16.f32``).
A kernel that stores bf16 would then show twice the rounding error on CPU that
it has on a GPU. So that CPU runs compute what GPUs compute, this module swaps
in a correctly rounding cast; it is applied only when the interpreter is on.
"""

from __future__ import annotations

import os

_PATCHED = False


def use_interpreter_without_gpu() -> bool:
    """Without a GPU, run Triton kernels in Triton's CPU interpreter
    (``TRITON_INTERPRET=1``) unless the user decided already; when the interpreter
    is on, patch its bf16 rounding. Returns whether the interpreter is on.
    Idempotent; must run before the first ``@triton.jit`` definition to matter."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    from triton import knobs  # Triton's own reading of TRITON_INTERPRET

    on = bool(knobs.runtime.interpret)
    if on:
        patch_bf16_rounding()
    return on


def patch_bf16_rounding() -> bool:
    """Patch the interpreter's fp32 -> bf16 cast; returns True once patched."""
    global _PATCHED
    if _PATCHED:
        return True
    import numpy as np
    import torch

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
