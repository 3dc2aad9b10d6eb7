"""Vision RoPE kernels for the Kimi-K2.5 vision tower, and the tools to study them.

Public API:
    native_rope(xq, xk, freqs_cis)                  Kimi's pre-PR complex path
    fused_qk_rope(xq, xk, cos, sin, *, inplace)     one Triton launch for q and k
    vllm_merged_rope(xq, xk, freqs_cis)             what vLLM PR #50400 merged
    vision_freqs_cis(grid_thw, head_dim, ...)       Kimi's 2D RoPE table
    VARIANTS                                        name -> Variant (callable + launches)
"""

from rope_kernels._checks import triton_interpreter_enabled
from rope_kernels.freqs import grid_tokens, image_patch_grid, vision_freqs_cis
from rope_kernels.fused import FusedConfig, fused_launch_config, fused_qk_rope
from rope_kernels.reference import cos_sin_views, native_rope, rope_cos_sin, rope_reference
from rope_kernels.variants import VARIANTS, Variant, get_variant
from rope_kernels.vllm_merged import vllm_merged_rope

if triton_interpreter_enabled():
    from rope_kernels._interpreter import patch_bf16_rounding

    patch_bf16_rounding()

__version__ = "0.1.0"

__all__ = [
    "VARIANTS",
    "FusedConfig",
    "Variant",
    "cos_sin_views",
    "fused_launch_config",
    "fused_qk_rope",
    "get_variant",
    "grid_tokens",
    "image_patch_grid",
    "native_rope",
    "rope_cos_sin",
    "rope_reference",
    "vision_freqs_cis",
    "vllm_merged_rope",
]
