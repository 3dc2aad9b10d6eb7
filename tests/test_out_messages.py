"""A bad ``out=`` pair is named as the outputs it is, never as the inputs xq/xk
(issue 36 item 20)."""

import pytest
import torch

from rope_kernels.kernels.fused import fused_qk_rope


def _inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g),
            torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g))


def _bad_outs(xq):
    one = torch.empty_like(xq)
    return {
        "q_out broadcast": ((torch.empty(1, 2, 8).expand(4, 2, 8), torch.empty_like(xq)),
                            r"^q_out is a broadcast \(stride-0\) view"),
        "k_out broadcast": ((torch.empty_like(xq), torch.empty(4, 1, 8).expand(4, 2, 8)),
                            r"^k_out is a broadcast"),
        "one tensor twice": ((one, one), r"^q_out and k_out are the same memory"),
        "overlapping halves": ((lambda b: (b[:4], b[1:5]))(torch.empty(5, 2, 8)),
                               r"^q_out and k_out share memory"),
        "self-overlapping": ((torch.empty(16).as_strided((4, 2, 8), (2, 1, 1)), torch.empty_like(xq)),
                             r"^q_out's strides"),
    }


@pytest.mark.parametrize("case", list(_bad_outs(torch.empty(4, 2, 8))))
def test_a_bad_out_is_named_as_the_output(case):
    xq, xk, cos, sin = _inputs()
    out, match = _bad_outs(xq)[case]
    with pytest.raises(ValueError, match=match) as info:
        fused_qk_rope(xq, xk, cos, sin, out=out)
    assert "xq" not in str(info.value).split(";")[0] and "xk" not in str(info.value).split(";")[0]


def test_in_place_inputs_are_still_named_xq_and_xk():
    xq, _, cos, sin = _inputs()
    with pytest.raises(ValueError, match="^xq and xk are the same memory"):
        fused_qk_rope(xq, xq, cos, sin, inplace=True)
