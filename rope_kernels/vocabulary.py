"""The study's vocabulary, importable without torch: the names of the RoPE variants,
encoder RoPE modes, attention kernels, dtypes and timing modes, and Kimi's rule
from an image resolution to a patch grid (so the notebook specs can check a
parameter before anything runs, and ``--help`` stays fast).

The library reads these names from here (``variants.py``, ``model/vit.py``,
``kernels/freqs.py``); nothing here imports the rest of the package.
"""

from __future__ import annotations

import math

# -- variants ----------------------------------------------------------------------
# Every name the registry (``variants.registry()``) can hold, whether it runs here
# or not: this project's own implementations, then other people's code.
OWN_VARIANTS = ("native", "fused", "fused_inplace", "vllm_merged_recreated")
PEER_VARIANTS = ("vllm_packed_qk", "vllm_merged", "sglang_vision", "compiled", "liger",
                 "sglang_kimi_k25", "flashinfer", "quack_qkv", "quack_rotary",
                 "vllm_rotary_qkv", "tokenspeed_qkv", "transformer_engine")
KNOWN_VARIANTS = OWN_VARIANTS + PEER_VARIANTS
# Those that rotate q and k where they are (the registry's ``Variant.inplace``; the
# registry refuses to build when the two disagree), known without loading any peer.
IN_PLACE_VARIANTS = ("fused_inplace", "vllm_packed_qk", "flashinfer", "quack_qkv",
                     "vllm_rotary_qkv")
# The encoder also knows "none" (RoPE skipped: the floor), "gemm_epilogue" (q
# and k rotated inside the QKV projection's epilogue by our Triton kernel, no RoPE
# step at all), "gemm_epilogue_cute" (the same by our CuTe DSL kernel; sm_90 GPUs
# with nvidia-cutlass-dsl only) and "gemm_epilogue_quack" (the same in QuACK's GEMM;
# only where QuACK runs).
ENCODER_ONLY_ROPE = ("none", "gemm_epilogue", "gemm_epilogue_cute", "gemm_epilogue_quack")
# How the encoder's attention runs (model/vit.py); "auto" picks one per device.
ATTENTION_KERNELS = ("auto", "sdpa_cudnn_batched", "sdpa_batched", "varlen_attn", "sdpa_per_image")
ENCODERS = ("small", "kimi_k25")

# -- data and timing ---------------------------------------------------------------
DTYPE_NAMES = ("float32", "bfloat16", "float16")
MICROBENCH_MODES = ("eager", "cudagraph", "cudagraph_warm")
ENCODER_MODES = ("eager", "cudagraph")
GPU_ONLY_MODES = ("cudagraph", "cudagraph_warm")

# -- images -> vision tokens (Kimi-K2.5's resize rule) -------------------------------
MAX_PATCHES_PER_SIDE = 512
PATCH_SIZE = 14
MERGE_SIZE = 2  # 2x2 patch merge: image sides are padded to PATCH_SIZE * MERGE_SIZE
IN_PATCH_LIMIT = 16384  # Kimi scales an image down past this many patches


def image_patch_grid(
    width: int,
    height: int,
    *,
    patch_size: int = PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
    in_patch_limit: int = IN_PATCH_LIMIT,
    max_side: int = MAX_PATCHES_PER_SIDE,
) -> tuple[int, int, int]:
    """Kimi's resize rule: image pixels -> (t=1, h, w) patch grid.

    The image is scaled down (never up) so that it holds at most
    ``in_patch_limit`` patches and ``max_side`` patches a side, then each side is
    padded up to a multiple of ``patch_size * merge_size`` (28 px).
    """
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int number of pixels, got {v!r}")
        if v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    scale = min(
        1.0,
        math.sqrt(in_patch_limit / ((width / patch_size) * (height / patch_size))),
        max_side * patch_size / width,
        max_side * patch_size / height,
    )
    factor = patch_size * merge_size
    new_w = max(1, int(width * scale))
    new_h = max(1, int(height * scale))
    grid_w = min(math.ceil(new_w / factor) * merge_size, max_side)
    grid_h = min(math.ceil(new_h / factor) * merge_size, max_side)
    return (1, grid_h, grid_w)


def parse_resolution(text: str) -> tuple[int, int]:
    """'1920x1080' -> (1920, 1080)."""
    if not isinstance(text, str):
        raise TypeError(f"resolution must be a string like '1024x1024', got {text!r}")
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"resolution must look like '1024x1024', got {text!r}")
    w, h = (int(p) for p in parts)
    if w <= 0 or h <= 0:
        raise ValueError(f"resolution sides must be positive, got {text!r}")
    return w, h


def resolution_tokens(resolution: str) -> int:
    """Vision tokens (before the 2x2 merge) of one image of ``resolution``."""
    t, h, w = image_patch_grid(*parse_resolution(resolution))
    return t * h * w
