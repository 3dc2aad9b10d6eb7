"""The vision towers the study times, in one catalogue: each tower's geometry, its image ->
patch-grid rule and its rotary convention. Importable without torch (the notebook specs
check a ``tower`` parameter against it before anything runs).

A new tower is one ``register(Tower(...))``: the microbench's shapes (``tower_families``),
the token counts of its images (``Tower.tokens``) and its rotation follow from the entry.

Sources (each entry's ``source`` names its own):

- ``kimi_k25``: Kimi-K2.5's MoonViT, as the study has always timed it (``model/config.py``,
  ``vocabulary.image_patch_grid``: Kimi's resize rule, 16,384 patches at most, 512 a side);
  interleaved pairs (``kernels/freqs.py``, vLLM 0.34.0 ``kimi_k25_vit.py``).
- ``qwen3_vl``: Qwen/Qwen3-VL-8B-Instruct ``config.json`` ``vision_config`` (depth 27,
  hidden_size 1152, num_heads 16, intermediate_size 4304, patch_size 16,
  spatial_merge_size 2, deepstack_visual_indexes [8, 16, 24]; the Qwen3.5 VL models carry
  the same tower), its ``preprocessor_config.json`` (shortest_edge 65536, longest_edge
  16777216 pixels) and vLLM's ``model_executor/models/qwen3_vl.py``
  (``Qwen2_5_VisionRotaryEmbedding(head_dim // 2)``, ``rot_pos_emb``: (row, col) angles
  per token in 2x2 merge-window order, rotate-half).
- ``qwen25_vl``: Qwen/Qwen2.5-VL-7B-Instruct ``config.json`` ``vision_config`` (depth 32,
  hidden_size 1280, num_heads 16, intermediate_size 3420, patch_size 14,
  spatial_merge_size 2, window_size 112, fullatt_block_indexes [7, 15, 23, 31]), its
  ``preprocessor_config.json`` (min_pixels 3136, max_pixels 12845056) and vLLM's
  ``model_executor/models/qwen2_5_vl.py`` (window attention in the other layers,
  rotate-half 2D rotary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rope_kernels.vocabulary import ROTATIONS, image_patch_grid, parse_resolution

IMAGE_RULES = ("kimi", "qwen_smart_resize")


@dataclass(frozen=True)
class Tower:
    """One vision tower: geometry, image rule, rotary convention, attention pattern."""

    name: str
    label: str
    layers: int
    hidden: int
    heads: int
    mlp: int  # the MLP's inner width
    patch_size: int  # pixels a side of one patch
    merge_size: int  # patches a side merged into one LLM token after the tower
    image_rule: str  # IMAGE_RULES: "kimi" (vocabulary.image_patch_grid) or Qwen's smart_resize
    rotation: str  # vocabulary.ROTATIONS: how each head's elements pair for the 2D rotary
    theta: float = 10000.0
    min_pixels: int = 0  # qwen_smart_resize: the image is scaled up to at least this many pixels
    max_pixels: int = 0  # ... and down to at most this many
    # attention: every layer full unless ``window_px`` > 0, then only these layers are
    full_attention_layers: tuple[int, ...] = ()
    window_px: int = 0  # windowed layers attend within windows of this many pixels a side
    deepstack_layers: tuple[int, ...] = ()  # layers whose features also feed the LLM
    source: str = ""  # where the numbers come from (config and engine files)
    # the language model behind the tower, for time to first token (prefill.tower_prefills):
    # aiconfigurator-core's model name ("": none there, no TTFT rows), its tensor parallel,
    # and its parameters per token in billions (the hand model where aiconfigurator cannot run)
    llm_model: str = ""
    llm_tp: int = 0
    llm_active_params_b: float = 0.0
    llm_note: str = ""  # why that model and parallelism
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "mlp", "patch_size", "merge_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"tower {self.name!r}: {name} must be a positive int, got {v!r}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 4:
            raise ValueError(f"tower {self.name!r}: hidden / heads must be a multiple of 4 (2D "
                             f"rotary), got {self.hidden} / {self.heads}")
        if self.rotation not in ROTATIONS:
            raise ValueError(f"tower {self.name!r}: rotation must be one of {ROTATIONS}, "
                             f"got {self.rotation!r}")
        if self.image_rule not in IMAGE_RULES:
            raise ValueError(f"tower {self.name!r}: image_rule must be one of {IMAGE_RULES}, "
                             f"got {self.image_rule!r}")
        if self.image_rule == "qwen_smart_resize" and not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"tower {self.name!r}: smart_resize needs 0 < min_pixels <= max_pixels")
        if self.llm_model and not (isinstance(self.llm_tp, int) and self.llm_tp >= 1
                                   and self.llm_active_params_b > 0):
            raise ValueError(f"tower {self.name!r}: llm_model needs llm_tp >= 1 and llm_active_params_b > 0")
        bad = [i for i in self.full_attention_layers + self.deepstack_layers
               if not 0 <= i < self.layers]
        if bad:
            raise ValueError(f"tower {self.name!r}: layer indexes {bad} outside 0..{self.layers - 1}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def windowed_layers(self) -> int:
        """Layers that attend within windows (0: every layer attends to its whole image)."""
        return self.layers - len(self.full_attention_layers) if self.window_px else 0

    def patch_grid(self, width: int, height: int) -> tuple[int, int, int]:
        """(t=1, h, w) patches of one image of ``width`` x ``height`` pixels."""
        if self.image_rule == "kimi":
            return image_patch_grid(width, height, patch_size=self.patch_size,
                                    merge_size=self.merge_size)
        h, w = qwen_smart_resize(height, width, self.patch_size * self.merge_size,
                                 self.min_pixels, self.max_pixels)
        return (1, h // self.patch_size, w // self.patch_size)

    def tokens(self, resolution: str, images: int = 1) -> int:
        """Vision tokens (patches, before the merge: what RoPE rotates) of ``images``
        images of ``resolution`` ('1024x1024')."""
        if isinstance(images, bool) or not isinstance(images, int) or images < 1:
            raise ValueError(f"images must be a positive int, got {images!r}")
        t, h, w = self.patch_grid(*parse_resolution(resolution))
        return images * t * h * w


def qwen_smart_resize(height: int, width: int, factor: int, min_pixels: int,
                      max_pixels: int) -> tuple[int, int]:
    """Qwen's image rule (transformers' ``qwen2_vl`` image processor ``smart_resize``, as
    vLLM's Qwen2.5-VL and Qwen3-VL processors call it): both sides rounded to a multiple
    of ``factor``, then scaled (keeping the aspect) into [min_pixels, max_pixels]."""
    for name, v in (("height", height), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be at most 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


TOWERS: dict[str, Tower] = {}


def register(tower: Tower) -> Tower:
    """Add a tower (a new name only)."""
    if not isinstance(tower, Tower):
        raise TypeError(f"register takes a Tower, got {type(tower).__name__}")
    if tower.name in TOWERS:
        raise ValueError(f"tower {tower.name!r} is registered already")
    TOWERS[tower.name] = tower
    return tower


def unregister(name: str) -> None:
    """Remove a tower (tests that register a dummy one)."""
    TOWERS.pop(name, None)


def get_tower(name: str) -> Tower:
    if not isinstance(name, str):
        raise TypeError(f"tower must be a string, got {name!r}")
    if name not in TOWERS:
        raise ValueError(f"unknown tower {name!r}; known: {', '.join(TOWERS)}")
    return TOWERS[name]


register(Tower(
    "kimi_k25", "Kimi-K2.5 MoonViT", layers=27, hidden=1152, heads=16, mlp=4304, patch_size=14,
    merge_size=2, image_rule="kimi", rotation="pairs",
    llm_model="moonshotai/Kimi-K2.5", llm_tp=8, llm_active_params_b=32.0,
    llm_note="Kimi-K2.5's LLM (32B active of 1.04T, MoE) over 8 GPUs; notebook 04's llm_tp / llm_moe_ep set it",
    source="rope_kernels/model/config.py (Kimi-K2.5 MoonViT); vLLM 0.34.0 "
           "model_executor/models/kimi_k25_vit.py"))
register(Tower(
    "qwen3_vl", "Qwen3-VL", layers=27, hidden=1152, heads=16, mlp=4304, patch_size=16,
    merge_size=2, image_rule="qwen_smart_resize", rotation="half",
    min_pixels=65536, max_pixels=16777216, deepstack_layers=(8, 16, 24),
    llm_model="Qwen/Qwen3-VL-8B-Instruct", llm_tp=1, llm_active_params_b=8.2,
    llm_note="the tower's 8B model (its config.json is the tower's source; 8.2B LLM parameters, "
             "Qwen3-8B's), bf16 on one GPU as an 8B deployment runs; aiconfigurator-core ships its "
             "config and a vLLM PASS on h200_sxm in its support matrix",
    source="Qwen/Qwen3-VL-8B-Instruct config.json vision_config and preprocessor_config.json; "
           "vLLM model_executor/models/qwen3_vl.py (rot_pos_emb, Qwen2_5_VisionRotaryEmbedding)"))
register(Tower(
    "qwen25_vl", "Qwen2.5-VL", layers=32, hidden=1280, heads=16, mlp=3420, patch_size=14,
    merge_size=2, image_rule="qwen_smart_resize", rotation="half",
    min_pixels=3136, max_pixels=12845056, full_attention_layers=(7, 15, 23, 31), window_px=112,
    llm_note="aiconfigurator-core 0.12 has no Qwen2.5-VL model (its model_configs)",
    source="Qwen/Qwen2.5-VL-7B-Instruct config.json vision_config and preprocessor_config.json; "
           "vLLM model_executor/models/qwen2_5_vl.py (Qwen2_5_VisionTransformer.get_window_index: "
           "windows of window_size // spatial_merge_size // patch_size = 4 merged tokens a side, "
           "tokens gathered window by window before the blocks and back after the merger; "
           "fullatt_block_indexes: full attention, cu_window_seqlens elsewhere)"))

# The images the microbench times per tower: 1, 4 and 16 images of each resolution.
TOWER_RESOLUTIONS = ("448x448", "1024x1024")
TOWER_IMAGES = (1, 4, 16)


def tower_token_counts(name: str, resolutions=TOWER_RESOLUTIONS, images=TOWER_IMAGES) -> tuple[int, ...]:
    """Sorted distinct token counts of ``images`` images of each of ``resolutions``."""
    tower = get_tower(name)
    return tuple(sorted({tower.tokens(r, n) for r in resolutions for n in images}))


def tower_families(names) -> list[dict]:
    """Microbench shape families (``bench.microbench.expand_families``) for towers: each
    tower's heads and head_dim at its token counts, with its rotation and name."""
    return [{"tokens": list(tower_token_counts(n)), "heads": [get_tower(n).heads],
             "head_dim": get_tower(n).head_dim, "rotation": get_tower(n).rotation, "tower": n}
            for n in names]
