"""When Triton kernels run in its CPU interpreter, and making it round fp32 -> bf16
the way GPUs do. The one place that says where a Triton version changes behaviour.

Triton versions this project runs on (pyproject.toml: from 3.6.0, the H200's, to 3.9.0,
the newest on the index when last checked; .ci/run runs the CPU tier under both ends):

- 3.6 - 3.9: the interpreter is chosen when a kernel is *defined*; it casts fp32 to bf16
  by truncation and hands ``tl.range`` run-time bounds to Python as arrays (patched below).
- 3.9: the interpreter's load and store refuse a mask that is not boolean ("mask has
  unsupported dtype"); 3.6 and 3.7 take any integer mask as nonzero = true. The
  interpreter makes a comparison of a scalar (``pid == 0``) an int32 value, and a block
  mask combined with one (``ok & (pid == 0)``) turns int32: kernels say such gates as
  block comparisons instead (``bench/same_bytes_copy._copy_row_kernel``).
  ``patch_boolean_masks`` applies 3.9's rule under every version, so the CPU tier at
  the pinned Triton fails where 3.9 would.
- Compiled for a GPU, every version types these masks as i1: none of this changes
  what runs on a GPU.
- 3.7 - 3.9: two QKV GEMM sweep configs that 3.6 builds for sm_90 within 255 registers
  spill there (3.7.1: ``128x128x64x1/3/4/8/subtile2/flat``, 3.9.0:
  ``128x128x64x1/2/4/8/persistent/x2/flat``; ``qkv_sm90_spilling_configs()``). The study's
  defaults and timed configs were chosen on the H200's Triton, 3.6.

Triton 3.6 chooses between its compiler and its interpreter when a ``@triton.jit``
function is *defined* (``triton/runtime/jit.py`` reads ``TRITON_INTERPRET``
in the decorator), not when it is launched. ``use_interpreter_without_gpu()`` is
therefore called before the first definition: at the top of
``rope_kernels.kernels.switches``, imported first by ``rope_kernels.kernels.checks``,
which every module that defines or loads a Triton kernel (ours and the peers' files)
imports first. ``import rope_kernels`` alone
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
        patch_runtime_loop_bounds()
        patch_boolean_masks()
    return on


def triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton."""
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def qkv_sm90_spilling_configs() -> frozenset[str]:
    """Labels of the QKV GEMM sweep configs whose sm_90 build spills under this Triton
    (none under 3.6; seen under 3.7.1 and 3.9.0, see the module docstring)."""
    if triton_version() < (3, 7):
        return frozenset()
    return frozenset({"128x128x64x1/3/4/8/subtile2/flat", "128x128x64x1/2/4/8/persistent/x2/flat"})


_MASKS_PATCHED = False


def patch_boolean_masks() -> bool:
    """Make the interpreter refuse a load/store mask that is not boolean, as Triton
    3.9's does (see the module docstring); returns True once patched."""
    global _MASKS_PATCHED
    if _MASKS_PATCHED:
        return True
    import numpy as np

    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError:  # a Triton without this interpreter layout: leave it alone
        return False

    def boolean(mask, op):
        dtype = np.asarray(mask.data).dtype
        if dtype != np.bool_:
            raise ValueError(f"{op} mask has dtype {dtype}, not bool (Triton 3.9's interpreter "
                             "refuses it: build the mask from block comparisons)")

    masked_load, masked_store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store

    def create_masked_load(self, ptrs, mask, *args, **kwargs):
        boolean(mask, "load")
        return masked_load(self, ptrs, mask, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        boolean(mask, "store")
        return masked_store(self, ptrs, value, mask, *args, **kwargs)

    InterpreterBuilder.create_masked_load = create_masked_load
    InterpreterBuilder.create_masked_store = create_masked_store
    _MASKS_PATCHED = True
    return True


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


_RANGE_PATCHED = False


def patch_runtime_loop_bounds() -> bool:
    """Let the interpreter run loops whose bounds are known only at run time.

    Triton 3.6's interpreter turns ``tl.range(start, end, step)`` into Python's
    ``range`` of its arguments as they are; a bound computed in the kernel (e.g.
    ``tl.program_id(0)``, the persistent QKV kernel's tile loop) is a
    one-element array there, which numpy >= 2.4 no longer converts to an int.
    This converts such bounds first; returns True once patched."""
    global _RANGE_PATCHED
    if _RANGE_PATCHED:
        return True
    import numpy as np

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang_core = getattr(interpreter, "_patch_lang_core", None)
    if patch_lang_core is None:  # another interpreter layout: leave it alone
        return False

    def as_int(v):
        if isinstance(v, tl.tensor):
            v = v.handle.data
        if isinstance(v, tl.constexpr):
            v = v.value
        return int(np.asarray(v).reshape(-1)[0]) if isinstance(v, np.ndarray) else v

    def scalar_range(arg1, arg2=None, step=None, **kwargs):
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        return range(as_int(start), as_int(end), 1 if step is None else as_int(step))

    def patched(lang, scope):
        patch_lang_core(lang, scope)
        scope.set_attr(lang, "range", scalar_range)

    interpreter._patch_lang_core = patched
    _RANGE_PATCHED = True
    return True
