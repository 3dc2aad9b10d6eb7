"""The study's vocabulary, importable without torch: the names of the RoPE variants,
encoder RoPE modes, attention kernels, dtypes and timing modes, and Kimi's rule
from an image resolution to a patch grid (so the notebook specs can check a
parameter before anything runs, and ``--help`` stays fast).

The library reads these names from here (``variants.py``, ``model/vit.py``,
``kernels/freqs.py``); the variant names are derived from ``catalogue.py`` (the one
list of every variant); nothing here imports the rest of the package.
"""

from __future__ import annotations

import math

from rope_kernels.catalogue import names as _catalogued

# -- variants ----------------------------------------------------------------------
# Every name the registry (``variants.registry()``) can hold, whether it runs here
# or not: the catalogue's RoPE kernels, this project's own implementations, then other
# people's code (``Entry.peer``).
OWN_VARIANTS = _catalogued("rope", peer=False)
PEER_VARIANTS = _catalogued("rope", peer=True)
KNOWN_VARIANTS = OWN_VARIANTS + PEER_VARIANTS
# Those that rotate q and k where they are (the registry's ``Variant.inplace``; the
# registry refuses to build when the two disagree), known without loading any peer.
IN_PLACE_VARIANTS = _catalogued("rope", inplace=True)
# RoPE modes only the encoder knows: "none" (RoPE skipped: the floor), "gemm_epilogue"
# (q and k rotated inside the QKV projection's epilogue by our Triton kernel, no RoPE
# step at all), "gemm_epilogue_cute" (the same by our CuTe DSL kernel; sm_90 GPUs with
# nvidia-cutlass-dsl only) and "gemm_epilogue_quack" (the same in QuACK's GEMM; only
# where QuACK runs); "gemm_epilogue_cute_norot" is our CuTe DSL kernel with its rotation
# compiled out, a floor on our own GEMM (RoPE's cost in gemm_epilogue_cute is gemm_epilogue_cute
# minus it): the catalogue's encoder names that are no registry variant.
ENCODER_ONLY_ROPE = tuple(n for n in _catalogued("encoder") if n not in KNOWN_VARIANTS)
# Kimi-K2.5's vision tower per rank, as the study times it: head_dim, heads per rank at
# TP 1, 4 and 8, and the token counts of 1, 4, 8 and 16 images of 1024x1024 (computed
# below from Kimi's resize rule: 5476, 21904, 43808, 87616).
KIMI_HEAD_DIM = 72
KIMI_HEADS = (16, 4, 2)
KIMI_IMAGES = (1, 4, 8, 16)
# The encoder modes that skip RoPE (floors): their output must miss native's.
ROPE_FREE_FLOORS = ("none", "gemm_epilogue_cute_norot")
# How the encoder's attention runs (model/vit.py); "auto" picks one per device.
ATTENTION_KERNELS = ("auto", "sdpa_cudnn_batched", "sdpa_batched", "varlen_attn", "sdpa_per_image")
ENCODERS = ("small", "kimi_k25", "qwen3_vl", "qwen25_vl")  # model/config.py; the qwen towers rotate halves
# How a head's elements are paired for the rotation: "pairs" (Kimi-K2.5's interleaved / GPT-J
# complex pairs: x[2j] with x[2j+1]) and "half" (Qwen's rotate-half / NeoX: x[j] with
# x[j + D/2]); both turn pair j by the angle of cos/sin column j, (T, D/2) for both.
ROTATIONS = ("pairs", "half")

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
    if len(parts) != 2 or not all(p.strip().isascii() and p.strip().isdigit() for p in parts):
        raise ValueError(f"resolution must look like '1024x1024' (ASCII digits), got {text!r}")
    w, h = (int(p) for p in parts)
    if w <= 0 or h <= 0:
        raise ValueError(f"resolution sides must be positive, got {text!r}")
    return w, h


def resolution_text(text: str) -> str:
    """A resolution's one spelling, as rows hold it: '1024X1024', ' 56 x 56' and
    '056x56' -> '1024x1024', '56x56' (so two spellings never make two buckets)."""
    w, h = parse_resolution(text)
    return f"{w}x{h}"


def resolution_tokens(resolution: str) -> int:
    """Vision tokens (before the 2x2 merge) of one image of ``resolution``."""
    t, h, w = image_patch_grid(*parse_resolution(resolution))
    return t * h * w


# Every Kimi shape: one 448x448 image (1024 tokens: launch-bound, ~2 us calls), then KIMI_IMAGES
# images of 1024x1024 (5476, 21904, 43808, 87616)
KIMI_SMALL_IMAGE = "448x448"
KIMI_TOKENS = (resolution_tokens(KIMI_SMALL_IMAGE),) + tuple(n * resolution_tokens("1024x1024") for n in KIMI_IMAGES)
