"""Test tiers: on a machine without a GPU every kernel runs in Triton's CPU
interpreter (TRITON_INTERPRET=1: set here explicitly, though defining the
kernels would set it too, see ``kernels/interpreter.py``);
with a GPU the same tests run compiled on it, and tests marked ``gpu`` add the
large shapes, CUDA graphs and profiler checks."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import rope_kernels  # noqa: E402
from rope_kernels.kernels.switches import triton_interpreter_enabled  # noqa: E402

ON_GPU = torch.cuda.is_available() and not triton_interpreter_enabled()


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if ON_GPU else "cpu"


@pytest.fixture
def registered():
    """``registered(name)``: the registry's Variant, or skip with why it does not run
    here. Tests parametrize over every known name (``vocabulary.KNOWN_VARIANTS``), so
    their IDs are the same whatever peers are installed; absent ones skip, with why."""
    from rope_kernels.variants import absent_reason, registry

    def get(name):
        if name not in registry():
            pytest.skip(f"{name} does not run here: {absent_reason(name)}")
        return registry()[name]
    return get


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a GPU (compiled Triton, not the interpreter)")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)


__all__ = ["rope_kernels"]
