"""Runtime switches of the kernels, apart from the input checks (``checks.py``): whether
Triton kernels run in its CPU interpreter, and whether launches are being recorded (the
compile matrix) instead of run.

Importing this module makes the interpreter decision (``interpreter.
use_interpreter_without_gpu``) before Triton is first imported here, and so before the
first ``@triton.jit`` (here, in every module that imports ``checks``, which imports this
first, and in triton.language's own standard library, whose jitted helpers such as
``tl.interleave`` a peer's kernel calls): Triton picks compiler or interpreter at
definition time.
"""

from __future__ import annotations

import contextlib
import contextvars

from rope_kernels.kernels.interpreter import use_interpreter_without_gpu

use_interpreter_without_gpu()

import triton  # noqa: E402  (after the interpreter decision above)

_RECORDING_LAUNCHES = contextvars.ContextVar("rope_kernels_recording_launches", default=False)


@contextlib.contextmanager
def recording_launches():
    """Launchers may be called on ``meta`` tensors inside this block: the compile
    matrix swaps each kernel for a recorder of its arguments, so nothing runs."""
    token = _RECORDING_LAUNCHES.set(True)
    try:
        yield
    finally:
        _RECORDING_LAUNCHES.reset(token)


def launches_recorded() -> bool:
    """Whether launches are being recorded (inside ``recording_launches``)."""
    return _RECORDING_LAUNCHES.get()


@triton.jit
def _probe_kernel():
    pass


def triton_interpreter_enabled() -> bool:
    """True when Triton kernels are built for its CPU interpreter (TRITON_INTERPRET=1).

    Asks Triton itself, through a kernel defined here, so this module needs no
    import of the kernels it guards (no import circle)."""
    return type(_probe_kernel).__name__ == "InterpretedFunction"
