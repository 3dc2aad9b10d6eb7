"""Every RoPE implementation the study compares, behind one signature.

``VARIANTS[name](xq, xk, freqs_cis) -> (q, k)``: all compute the same function
(Kimi's interleaved rotation, fp32 math, outputs in the input dtype). Beside
each, the kernel launches it makes per call, derived from its code and checked
against the profiler on a GPU (tests/test_gpu.py, notebooks/03_profile).
A peer whose package is not installed is absent, never a stub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk
from rope_kernels.kernels.fused import fused_qk_rope
from rope_kernels.peers.baselines import compiled_rope, liger_available, liger_rope
from rope_kernels.kernels.reference import cos_sin_views, native_rope
from rope_kernels.kernels.vllm_merged_recreated import vllm_merged_rope

RopeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Variant:
    """A named RoPE implementation and what one call of it launches."""

    name: str
    fn: RopeFn
    launches: int  # kernel launches per call on bf16/fp16 data
    launches_fp32: int  # ... on fp32 data (no casts needed)
    description: str
    inplace: bool = False  # True: rotates and returns the caller's xq/xk

    def __call__(self, xq, xk, freqs_cis):
        return self.fn(xq, xk, freqs_cis)

    def launch_count(self, dtype: torch.dtype) -> int:
        return self.launches_fp32 if dtype == torch.float32 else self.launches


def fused_rope(xq, xk, freqs_cis, *, inplace: bool = False):
    """The fused kernel reading cos/sin straight out of freqs_cis (no copy)."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    cos, sin = cos_sin_views(freqs_cis)
    return fused_qk_rope(xq, xk, cos, sin, inplace=inplace)


def fused_rope_inplace(xq, xk, freqs_cis):
    """The fused kernel writing into xq/xk (e.g. into the packed qkv buffer)."""
    return fused_rope(xq, xk, freqs_cis, inplace=True)


def _build() -> dict[str, Variant]:
    variants = [
        Variant("native", native_rope, 6, 2,
                "Kimi's pre-PR path: fp32 upcast, complex multiply, cast back (per tensor)"),
        Variant("fused", fused_rope, 1, 1,
                "one Triton launch for q and k, cos/sin read from freqs_cis, out of place"),
        Variant("fused_inplace", fused_rope_inplace, 1, 1,
                "the fused kernel writing into xq/xk", inplace=True),
        Variant("vllm_merged", vllm_merged_rope, 8, 4,
                "re-creation of the merged PR: cos/sin copies, then upcast, "
                "flash-attention-style rotary, cast back, per tensor"),
        Variant("compiled", compiled_rope, 1, 1,
                "torch.compile (Inductor, static shapes) of the real cos/sin form"),
    ]
    if liger_available():
        variants.append(Variant("liger", liger_rope, 3, 3,
                                "Liger-Kernel llama4_rope, in place on copies of q and k"))
    return {v.name: v for v in variants}


VARIANTS: dict[str, Variant] = _build()


def get_variant(name: str) -> Variant:
    if not isinstance(name, str):
        raise TypeError(f"variant name must be a string, got {name!r}")
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; available: {', '.join(VARIANTS)}")
    return VARIANTS[name]
