"""Count the kernels a call launches, on any device.

``count_launches(fn, *args)`` counts PyTorch operators that compute something
(every aten op that is not a view, an allocation or a metadata query launches
one kernel on a GPU for the simple ops RoPE uses) plus Triton kernel launches.
It runs on the CPU with the Triton interpreter too, so tests can pin the launch
counts recorded in ``VARIANTS``; on a GPU the profiler (``profiling.py``) is the
ground truth and the two are compared in tests/test_gpu.py.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operators that allocate or reinterpret memory without running a kernel.
_NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "lift_fresh", "detach", "alias", "_to_copy_noop", "resolve_conj", "resolve_neg",
    "is_same_size", "_has_compatible_shallow_copy_type", "set_", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "_local_scalar_dense",
}


class _AtenCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = 0  # >0 while a Triton kernel runs: the interpreter's own tensor ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        name = func.overloadpacket.__name__
        is_view = bool(getattr(func, "is_view", False)) or func._schema.name.endswith(
            ("view", "view_as_real", "view_as_complex")
        )
        if not is_view and name not in _NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **kwargs)


@contextlib.contextmanager
def _count_triton(counter: Counter, aten: _AtenCounter):
    """Count launches of @triton.jit kernels (compiled or interpreted)."""
    patched = []
    try:
        from triton.runtime.jit import JITFunction

        patched.append(JITFunction)
    except ImportError:
        pass
    try:
        from triton.runtime.interpreter import InterpretedFunction

        patched.append(InterpretedFunction)
    except ImportError:
        pass
    originals = {cls: cls.run for cls in patched}

    def make(cls):
        original = originals[cls]

        def run(self, *args, **kwargs):
            if not kwargs.get("warmup", False):
                name = getattr(self, "__name__", None) or getattr(self.fn, "__name__", "triton")
                counter[f"triton:{name}"] += 1
            aten.paused += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                aten.paused -= 1

        return run

    for cls in patched:
        cls.run = make(cls)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.run = original


def count_launches(fn, *args, **kwargs) -> tuple[int, Counter]:
    """(total kernel launches, per-kernel counts) of one call ``fn(*args, **kwargs)``."""
    triton_counts: Counter = Counter()
    mode = _AtenCounter()
    with _count_triton(triton_counts, mode), mode:
        fn(*args, **kwargs)
    counts = mode.ops + triton_counts
    return sum(counts.values()), counts
