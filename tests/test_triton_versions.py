"""Triton's interpreter as Triton 3.9 has it, under whichever Triton is installed: a
load or store mask that is not boolean is refused (kernels/interpreter.py says why),
so the CPU tier at the pinned Triton fails where the newest would."""

import pytest
import torch
import triton
import triton.language as tl

from rope_kernels.kernels.switches import triton_interpreter_enabled

pytestmark = pytest.mark.skipif(not triton_interpreter_enabled(),
                                reason="the interpreter's masks (compiled kernels type them as i1)")


@triton.jit
def _gated_copy_kernel(src, dst, n, SCALAR_GATE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if SCALAR_GATE:  # the pattern Triton 3.9's interpreter refuses: an int32 mask
        mask = (offs < n) & (pid == 0)
    else:  # the same gate as a block comparison: boolean
        mask = (offs + pid * n) < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask, other=0.0), mask=offs < n)


def test_a_mask_gated_by_a_scalar_comparison_is_refused_under_every_triton():
    src, dst = torch.arange(8, dtype=torch.float32), torch.full((8,), -1.0)
    with pytest.raises(Exception, match="not bool"):
        _gated_copy_kernel[(2,)](src, dst, 8, SCALAR_GATE=True, BLOCK=4)
    _gated_copy_kernel[(2,)](src, dst, 8, SCALAR_GATE=False, BLOCK=4)
    assert torch.equal(dst, torch.tensor([0, 1, 2, 3, 0, 0, 0, 0], dtype=torch.float32))


def test_every_same_bytes_copy_runs_with_boolean_masks():
    """The copy family notebook 02 times beside every variant (its row tiling gated
    cos/sin by ``col_block == 0``: "mask has unsupported dtype" under Triton 3.9)."""
    from rope_kernels import vision_freqs_cis
    from rope_kernels.bench.same_bytes_copy import same_bytes_copy, same_bytes_copy_tilings

    for heads, head_dim in ((2, 72), (3, 8)):
        qkv = torch.randn(16, 3, heads, head_dim, dtype=torch.bfloat16)
        xq, xk, _ = qkv.unbind(1)
        freqs = vision_freqs_cis([(1, 4, 4)], head_dim=head_dim)
        for tiling in same_bytes_copy_tilings(heads, head_dim, xq.element_size()):
            q, k = same_bytes_copy(xq, xk, freqs, tiling=tiling)
            assert torch.equal(q, xq) and torch.equal(k, xk), tiling.label
