"""fused_qk_rope refuses a launch Triton could not build (a block over 2^20 elements)
with a ValueError saying what fits, before any kernel runs (issue 36 item 14)."""

import pytest
import torch

from rope_kernels.kernels import fused
from rope_kernels.kernels.fused import RowsConfig, fused_qk_rope

LIMIT = 1 << 20  # Triton 2-3 (fused.TRITON_MAX_TENSOR_NUMEL)


def _inputs(tokens, heads, head_dim, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    xq = torch.randn(tokens, heads, head_dim, generator=g).to(dtype)
    cos = torch.randn(tokens, head_dim // 2, generator=g)
    return xq, xq.clone(), cos, torch.randn(tokens, head_dim // 2, generator=g)


@pytest.mark.parametrize("config,fits", [(RowsConfig(2048, 8), 1024), (RowsConfig(4096, 1), 1024),
                                         (RowsConfig(1024, 4, padded=True), 512)])
@pytest.mark.parametrize("kw", [{}, {"inplace": True}, {"out": True}])
def test_a_config_over_the_block_limit_is_a_value_error(config, fits, kw):
    xq, xk, cos, sin = _inputs(16, 16, 72)  # row 1152 -> chunks 1024 + 128, padded 2048
    if kw.get("out"):
        kw = {"out": (torch.empty_like(xq), torch.empty_like(xk))}
    before = xq.clone()
    with pytest.raises(ValueError, match=f"limit of {LIMIT}; use block_t <= {fits}$"):
        fused_qk_rope(xq, xk, cos, sin, config=config, **kw)
    assert torch.equal(xq, before)


@pytest.mark.parametrize("heads,head_dim,padded", [(32768, 64, False), (16385, 128, True),
                                                  (16384, 256, False)])
def test_a_row_over_the_block_limit_is_a_value_error(heads, head_dim, padded):
    xq, xk, cos, sin = _inputs(1, heads, head_dim)
    config = RowsConfig(1, 1, padded=padded) if padded else None
    with pytest.raises(ValueError, match="a token's row .* over Triton's limit .* rotate the heads"):
        fused_qk_rope(xq, xk, cos, sin, config=config)


def test_the_backward_pass_is_checked_too():
    xq, xk, cos, sin = _inputs(4, 16, 72, torch.float32)
    xq.requires_grad_(True)
    with pytest.raises(ValueError, match="use block_t <= 1024"):
        fused_qk_rope(xq, xk, cos, sin, config=RowsConfig(2048, 8))


def test_the_largest_block_that_fits_is_accepted():
    """The check is not off by one: block_t x chunk == 2^20 exactly is allowed."""
    fused.check_block_fits(RowsConfig(1024, 8), 16, 72, 1024)
    fused.check_block_fits(RowsConfig(1, 1), 16384, 64, LIMIT)
    with pytest.raises(ValueError):
        fused.check_block_fits(RowsConfig(2, 1), 16384, 64, LIMIT)
