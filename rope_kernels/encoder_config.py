"""The MoonViT-shaped encoder's geometry (Kimi-K2.5's vision tower and a CPU-sized
twin): a plain dataclass, importable without torch, so the study's verdicts can
compute an encoder's RoPE minimum from it."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EncoderConfig:
    hidden: int = 1152
    heads: int = 16
    layers: int = 27
    mlp: int = 4304
    patch: int = 14
    merge: int = 2
    text_hidden: int = 7168
    pos_grid: int = 64  # learnable position table, interpolated to each image
    theta: float = 10000.0
    rotation: str = "pairs"  # vocabulary.ROTATIONS: Kimi's interleaved pairs or Qwen's rotate-half
    tower: str = ""  # towers.py entry whose image rule makes this encoder's patch grids ("": Kimi's)
    # attention: every layer full unless ``window`` > 0 (patches a side of a window), then only
    # ``full_attention_layers`` are full and the others attend within windows (Qwen2.5-VL)
    window: int = 0
    full_attention_layers: tuple[int, ...] = ()
    gated_mlp: bool = False  # the MLP: tanh-GELU fc0 -> fc1 (MoonViT, Qwen3-VL) or SiLU-gated (Qwen2.5-VL)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if (self.hidden // self.heads) % 4:
            raise ValueError("head_dim must be a multiple of 4 for 2D RoPE")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be an int >= 0 (patches a side; 0: no windows), got {self.window!r}")
        if self.window and self.window % self.merge:
            raise ValueError(f"window ({self.window} patches) must be a multiple of the merge ({self.merge})")

    def windowed(self, layer: int) -> bool:
        """Whether layer ``layer`` attends within windows (else to its whole image)."""
        return bool(self.window) and layer not in self.full_attention_layers

    @classmethod
    def kimi_k25(cls) -> "EncoderConfig":
        """Kimi-K2.5's MoonViT: 27 layers, 1152 wide, 16 heads x 72."""
        return cls()

    @classmethod
    def qwen3_vl(cls) -> "EncoderConfig":
        """Qwen3-VL's tower (``towers.TOWERS["qwen3_vl"]``: 27 layers, 1152 wide, 16 heads x
        72, MLP 4304, 16-pixel patches, rotate-half) in the same encoder body: a 48 x 48
        position table (num_position_embeddings 2304) and Qwen3-VL-8B's 4096-wide output.
        Not modelled: its three deepstack mergers (layers 8, 16, 24; small beside 27 layers)."""
        from rope_kernels.towers import get_tower

        t = get_tower("qwen3_vl")
        return cls(hidden=t.hidden, heads=t.heads, layers=t.layers, mlp=t.mlp, patch=t.patch_size,
                   merge=t.merge_size, text_hidden=4096, pos_grid=48, theta=t.theta,
                   rotation=t.rotation, tower=t.name)

    @classmethod
    def qwen25_vl(cls) -> "EncoderConfig":
        """Qwen2.5-VL's tower (``towers.TOWERS["qwen25_vl"]``: 32 layers, 1280 wide, 16 heads x
        80, SiLU-gated MLP 3420, 14-pixel patches, rotate-half) in the same encoder body, with its
        window attention: windows of ``window_px`` 112 pixels = 8 patches a side (vLLM's
        ``Qwen2_5_VisionTransformer.get_window_index``: ``window_size // spatial_merge_size //
        patch_size`` = 4 merged tokens a side), full attention only in layers 7, 15, 23, 31
        (``fullatt_block_indexes``), and Qwen2.5-VL-7B's 3584-wide output. It has no learnable
        position table (``pos_grid`` 0: RoPE is its only position signal).
        Not modelled: RMSNorm (LayerNorm here: the same bytes, one more reduction)."""
        from rope_kernels.towers import get_tower

        t = get_tower("qwen25_vl")
        return cls(hidden=t.hidden, heads=t.heads, layers=t.layers, mlp=t.mlp, patch=t.patch_size,
                   merge=t.merge_size, text_hidden=3584, pos_grid=0, theta=t.theta,
                   rotation=t.rotation, tower=t.name, window=t.window_px // t.patch_size,
                   full_attention_layers=t.full_attention_layers, gated_mlp=True)

    @classmethod
    def for_encoder(cls, name: str) -> "EncoderConfig":
        """The config of a notebook-04 encoder name (``vocabulary.ENCODERS``)."""
        from rope_kernels.vocabulary import ENCODERS

        if name not in ENCODERS:
            raise ValueError(f"unknown encoder {name!r}; known: {', '.join(ENCODERS)}")
        return getattr(cls, name)()

    @classmethod
    def small(cls) -> "EncoderConfig":
        """A CPU-sized encoder with the same structure (2 layers, 4 heads x 16)."""
        return cls(hidden=64, heads=4, layers=2, mlp=96, text_hidden=48, pos_grid=8)

    def with_layers(self, layers: int) -> "EncoderConfig":
        return replace(self, layers=layers)
