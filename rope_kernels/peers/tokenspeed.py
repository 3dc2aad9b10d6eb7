"""tokenspeed-kernel 0.1.4's Kimi RoPE, run from its pinned ``qkv_rotary.py``.

``packed_qkv_complex_rotary(qkv, q_size, kv_size, num_heads, head_dim, freqs_cis)``
(``tokenspeed_kernel/ops/attention/mha/_triton/qkv_rotary.py``): written for Kimi's
contract: the packed qkv and the complex ``freqs_cis`` in, contiguous q and k out (for
FlashAttention 4), v a strided view of the packed qkv. One Triton launch, a program per
16 tokens x one head, fp32 math. Out of place.

The wheel is cp311 and pins torch 2.14 and a Triton fork (``tokenspeed_triton``); the
file reaches Triton only through ``tokenspeed_kernel._triton`` (``from
tokenspeed_kernel._triton import tl, triton``), whose module imports the fork. While
the pinned file loads, a stand-in for that one module hands it stock Triton's ``tl``
and ``triton`` instead (its kernel uses nothing else); the kernel itself is
tokenspeed's bytes, unchanged.
"""

from __future__ import annotations

import functools
import types

import torch

from rope_kernels.kernels.checks import (check_freqs_cis, check_qk, check_triton_device,
                                         packed_qkv_of)
from rope_kernels.peers.cache import SourceFile, find_source, load_module, loaded_peer_spec

PACKAGE = "tokenspeed-kernel"
QKV_ROTARY_FILE = "tokenspeed_kernel/ops/attention/mha/_triton/qkv_rotary.py"


def _triton_shim() -> dict[str, types.ModuleType]:
    """``tokenspeed_kernel._triton`` with stock Triton's ``tl`` and ``triton``."""
    import triton
    import triton.language as tl

    from rope_kernels.peers.cache import package_module

    shim = types.ModuleType("tokenspeed_kernel._triton")
    shim.triton, shim.tl = triton, tl
    package = package_module("tokenspeed_kernel")
    package._triton = shim
    return {"tokenspeed_kernel": package, "tokenspeed_kernel._triton": shim}


@functools.cache
def qkv_rotary_source() -> tuple[SourceFile, types.ModuleType]:
    src = find_source(PACKAGE, QKV_ROTARY_FILE)
    return src, load_module(src, shims=_triton_shim())


def tokenspeed_qkv_packed(qkv, freqs_cis, cos=None, sin=None):
    """As tokenspeed's vision attention calls it on a layer's packed (T, 3, H, D) qkv:
    new contiguous q and k, v a view of the packed qkv."""
    tokens, _, heads, head_dim = qkv.shape
    width = heads * head_dim
    return qkv_rotary_source()[1].packed_qkv_complex_rotary(
        qkv.view(tokens, 3 * width), width, width, heads, head_dim, freqs_cis)


def tokenspeed_qkv_rope(xq: torch.Tensor, xk: torch.Tensor,
                        freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``packed_qkv_complex_rotary`` on the contiguous packed qkv that xq/xk slice:
    new contiguous q and k."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    qkv = packed_qkv_of(xq, xk, "tokenspeed_qkv")
    check_triton_device(xq, "tokenspeed_qkv")
    q, k, _v = tokenspeed_qkv_packed(qkv, freqs_cis)
    return q, k


def rope_variant(name: str) -> dict:
    """The registry's spec of ``tokenspeed_qkv`` (the catalogue's ``module`` contract:
    ``variants``); raises when tokenspeed's file does not load here (the peer is then absent)."""
    return loaded_peer_spec(name, {"tokenspeed_qkv": (qkv_rotary_source, dict(
        fn=tokenspeed_qkv_rope, launches=1, launches_fp32=1,
        description="tokenspeed-kernel 0.1.4 packed_qkv_complex_rotary: one Triton launch (16 tokens "
                    "x one head a program) from the packed qkv and complex freqs_cis, contiguous q/k "
                    "out; run on stock Triton (its _triton indirection pointed at triton)",
        packed_fn=tokenspeed_qkv_packed, packed_only=True,
        triton_kernels=("_packed_qkv_complex_rotary_kernel",)))})
