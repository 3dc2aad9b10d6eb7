"""Vision RoPE kernels for the Kimi-K2.5 vision tower, and the tools to study them.

Public API:
    native_rope(xq, xk, freqs_cis)                  Kimi's pre-PR complex path
    fused_qk_rope(xq, xk, cos, sin, *, inplace)     one Triton launch for q and k
    vllm_merged_recreated_rope(xq, xk, freqs_cis)   our re-creation of what PR #50400 merged
    vision_freqs_cis(grid_thw, head_dim, ...)       Kimi's 2D RoPE table
    qkv_rope_linear(x, w_qkv, b_qkv, cos, sin)      QKV projection with q/k rotated in its epilogue
    VARIANTS, peer_status()                         name -> Variant (callable, packed call,
                                                    launches, peer provenance); which peers ran
"""

import os as _os

import torch as _torch

# Without a GPU, Triton kernels can only run in Triton's CPU interpreter; turn
# it on (before our kernels are defined) unless the user decided already.
if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"

from rope_kernels.kernels.checks import triton_interpreter_enabled  # noqa: E402
from rope_kernels.kernels.freqs import grid_tokens, image_patch_grid, vision_freqs_cis  # noqa: E402
from rope_kernels.kernels.fused import FusedConfig, fused_launch_config, fused_qk_rope  # noqa: E402
from rope_kernels.kernels.qkv_gemm import qkv_rope_linear, qkv_rope_linear_angles  # noqa: E402
from rope_kernels.kernels.reference import cos_sin_views, native_rope, rope_cos_sin, rope_reference  # noqa: E402
from rope_kernels.variants import VARIANTS, Variant, get_variant, peer_status  # noqa: E402
from rope_kernels.kernels.vllm_merged_recreated import vllm_merged_recreated_rope  # noqa: E402

if triton_interpreter_enabled():
    from rope_kernels.kernels.interpreter import patch_bf16_rounding

    patch_bf16_rounding()

__version__ = "0.1.0"

__all__ = [
    "VARIANTS",
    "FusedConfig",
    "Variant",
    "cos_sin_views",
    "fused_launch_config",
    "fused_qk_rope",
    "qkv_rope_linear",
    "qkv_rope_linear_angles",
    "get_variant",
    "peer_status",
    "grid_tokens",
    "image_patch_grid",
    "native_rope",
    "rope_cos_sin",
    "rope_reference",
    "vision_freqs_cis",
    "vllm_merged_recreated_rope",
]
