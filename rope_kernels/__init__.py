"""Vision RoPE kernels for the Kimi-K2.5 vision tower, and the tools to study them.

Public API:
    native_rope(xq, xk, freqs_cis)                  Kimi's pre-PR complex path
    fused_qk_rope(xq, xk, cos, sin, *, inplace)     one Triton launch for q and k
    vllm_merged_recreated_rope(xq, xk, freqs_cis)   our re-creation of what PR #50400 merged
    vision_freqs_cis(grid_thw, head_dim, ...)       Kimi's 2D RoPE table
    qkv_rope(x, w, b, operands, heads=, head_dim=, backend=)
                                                    QKV projection with q/k rotated in its
                                                    epilogue (our CuTe or Triton kernel, QuACK's)
    qkv_rope_operands(coords, heads=, head_dim=)    its per-forward operands
    VARIANTS, peer_status()                         name -> Variant (callable, packed call,
                                                    launches, peer provenance); which peers ran

Importing the package does nothing else: no torch, no Triton, no peer, no
environment variable. Each name above is imported from its module on first use
(PEP 562). Triton decides between compiling and its CPU interpreter when a
``@triton.jit`` function is *defined* (triton 3.6, ``triton/runtime/jit.py``),
so that decision is made where this package's kernels are defined:
``rope_kernels.kernels.switches`` (imported first by ``kernels.checks``, which every module
that defines or loads a Triton kernel imports) calls
``kernels.interpreter.use_interpreter_without_gpu()`` first.
The variant registry is built on its first use (``variants.registry()``).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "triton_interpreter_enabled": "rope_kernels.kernels.switches",
    "grid_tokens": "rope_kernels.kernels.freqs",
    "image_patch_grid": "rope_kernels.kernels.freqs",
    "vision_freqs_cis": "rope_kernels.kernels.freqs",
    "RowsConfig": "rope_kernels.kernels.fused",
    "fused_launch_config": "rope_kernels.kernels.fused",
    "fused_qk_rope": "rope_kernels.kernels.fused",
    "qkv_rope": "rope_kernels.qkv",
    "qkv_rope_operands": "rope_kernels.qkv",
    "cos_sin_views": "rope_kernels.kernels.reference",
    "native_rope": "rope_kernels.kernels.reference",
    "rope_cos_sin": "rope_kernels.kernels.reference",
    "rope_reference": "rope_kernels.kernels.reference",
    "VARIANTS": "rope_kernels.variants",
    "Variant": "rope_kernels.variants",
    "get_variant": "rope_kernels.variants",
    "peer_status": "rope_kernels.variants",
    "vllm_merged_recreated_rope": "rope_kernels.kernels.vllm_merged_recreated",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rope_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
