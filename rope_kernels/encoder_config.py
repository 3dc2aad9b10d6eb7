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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if (self.hidden // self.heads) % 4:
            raise ValueError("head_dim must be a multiple of 4 for 2D RoPE")

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
    def small(cls) -> "EncoderConfig":
        """A CPU-sized encoder with the same structure (2 layers, 4 heads x 16)."""
        return cls(hidden=64, heads=4, layers=2, mlp=96, text_hidden=48, pos_grid=8)

    def with_layers(self, layers: int) -> "EncoderConfig":
        return replace(self, layers=layers)
