"""Launch settings and tile constants of our CuTe DSL QKV kernel (``qkv_cute.py`` launches
it, ``qkv_cute_kernel.py`` is the kernel): imports neither torch nor CuTe DSL, so both
modules import it and neither imports the other for it."""

from dataclasses import dataclass

TILE_M = 128          # one consumer warp group's tile: two m64 WGMMA rows
TILE_K = 64           # 128 bytes of bf16: the 128-byte swizzle
EPI_STAGES = 2       # shared-memory store buffers per consumer warp group
SMEM_BYTES = 232448  # sm_90's shared memory a block may use (227 KB)


@dataclass(frozen=True)
class CuteQKVConfig:
    """Launch settings of ``qkv_rope_linear_cute``.

    The default, 192x2 (192-column tiles, W multicast over 2 CTAs along M, 64-column
    stores), is the fastest of the three configs notebook 05 swept in the committed run
    (``data/exploration/nvidia-h200/qkv_gemm_sweep.csv``, H200, Kimi 1152 -> 3 x 16 x 72) at
    every token count, although ptxas reports a small spill for its 64-column stores and
    none for 32-column ones; the times: docs/DECISIONS.md ("Our CuTe DSL QKV kernel")."""
    tile_n: int = 192       # columns a tile (Kimi's 3456 = 18 tiles; q|k = the first 12)
    cluster_m: int = 2      # CTAs along M sharing (multicasting) one W tile: 1 or 2
    epi_n: int = 0          # columns of one epilogue store subtile; 0: the widest of 64, 32
                            # and 16 that divides tile_n (64 measured fastest at 192)
    stages: int = 0         # shared-memory stages of (x, W) k-tiles; 0: as many as fit
    rotate: bool = True     # False: rotation compiled out (benchmarks only)
    consumers: int = 2      # consumer warp groups taking turns (2: ping-pong; 1: one)
    raster_m: bool = False  # tile order: False walks N first (a row block of x stays in L2
                            # while every W tile passes), True walks M first

    @classmethod
    def parse(cls, spec: str) -> "CuteQKVConfig":
        """``tile_n x cluster_m`` with optional ``/e<epi_n>``, ``/s<stages>``, ``/c1`` (one
        consumer group), ``/m`` (raster along M): e.g. ``192x2``, ``160x1/e32/m``."""
        head, *opts = spec.strip().split("/")
        try:
            n, m = (int(v) for v in head.split("x"))
        except ValueError:
            raise ValueError(f"CuTe config {spec!r}: expected tile_n x cluster_m, e.g. 192x2")
        kw = {"tile_n": n, "cluster_m": m}
        for o in opts:
            if o == "m":
                kw["raster_m"] = True
            elif o[:1] in ("e", "s", "c") and o[1:].isdigit():
                kw[{"e": "epi_n", "s": "stages", "c": "consumers"}[o[0]]] = int(o[1:])
            else:
                raise ValueError(f"CuTe config {spec!r}: unknown option {o!r}")
        return cls(**kw)

    @property
    def label(self) -> str:
        d = CuteQKVConfig()
        opts = "".join(f"/{k}{getattr(self, n)}" for k, n in (("e", "epi_n"), ("s", "stages"),
                                                                ("c", "consumers"))
                       if getattr(self, n) != getattr(d, n))
        return f"{self.tile_n}x{self.cluster_m}{opts}{'/m' if self.raster_m else ''}"

    def __post_init__(self):
        for name in ("tile_n", "cluster_m", "epi_n", "stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"CuteQKVConfig.{name} must be an int, got {type(v).__name__}")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"CuteQKVConfig.tile_n must be a multiple of 16 in 16..256, "
                             f"got {self.tile_n}")
        if self.cluster_m not in (1, 2):
            raise ValueError(f"CuteQKVConfig.cluster_m must be 1 or 2, got {self.cluster_m}")
        if self.epi_n not in (0, 16, 32, 64) or (self.epi_n and self.tile_n % self.epi_n):
            raise ValueError(f"CuteQKVConfig.epi_n must be 0 (auto), or 16, 32 or 64 dividing "
                             f"tile_n ({self.tile_n}), got {self.epi_n}")
        if self.stages < 0 or self.stages == 1:
            raise ValueError(f"CuteQKVConfig.stages must be 0 (as many as fit) or >= 2, "
                             f"got {self.stages}")
        if self.consumers not in (1, 2) or isinstance(self.consumers, bool):
            raise ValueError(f"CuteQKVConfig.consumers must be 1 or 2, got {self.consumers!r}")
        for name in ("rotate", "raster_m"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"CuteQKVConfig.{name} must be a bool")

    @property
    def store_cols(self) -> int:
        """Columns of one epilogue store subtile (``epi_n``, or its automatic choice)."""
        return self.epi_n or next(c for c in (64, 32, 16) if self.tile_n % c == 0)

    def ab_stages(self, elem_bytes: int = 2) -> int:
        """The (x, W) stages that fit beside the epilogue buffers (or ``stages``)."""
        per_stage = (TILE_M + self.tile_n) * TILE_K * elem_bytes
        epi = 2 * EPI_STAGES * 64 * self.store_cols * elem_bytes
        fit = (SMEM_BYTES - epi - 1024) // per_stage
        if self.stages:
            if self.stages > fit:
                raise ValueError(f"CuteQKVConfig.stages={self.stages} does not fit: at most "
                                 f"{fit} stages of {per_stage} bytes at tile_n={self.tile_n}")
            return self.stages
        return fit
