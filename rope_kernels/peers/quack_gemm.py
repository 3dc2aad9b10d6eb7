"""QuACK's GEMM with Kimi's 2D RoPE in its epilogue (CuTe DSL, Hopper and newer).

Run from the installed ``quack-kernels`` package (pinned 0.6.5; nothing of it is
committed here) where it is installed and runs; elsewhere absent, with the reason
in ``availability()``. Two peers of ``qkv_rope_linear``:

- ``quack_gemm``: QuACK's plain GEMM with the bias as its epilogue (``x @ W^T + b``,
  q/k not rotated): how fast a CuTe DSL mainloop is on this shape.
- ``quack_gemm_rope``: the same GEMM through ``quack.epilogue.rotary.mrope_posfreq_epi``
  (Qwen2-VL's 3-axis mRoPE epilogue: in-kernel angles in turns with a float-float
  split, ``theta = pos_t*f_t + pos_h*f_h + pos_w*f_w`` per column pair). Kimi's 2D
  RoPE is data for it (``kimi_mrope_operands``): ``pos_t`` = 0, ``pos_h`` = each
  token's patch row, ``pos_w`` = its column; pair ``j`` of a head turns by
  ``col * f[j//2]`` (j even) or ``row * f[j//2]`` (j odd), so the column table holds
  ``f[j//2] / 2pi`` (as hi, lo) on even pairs and zero on odd, the row table the
  reverse, and both are zero on the v columns (angle 0: v passes through exactly).

Both write the packed (T, 3*H*D) qkv in W's natural column order (QuACK rotates
adjacent column pairs, Kimi's interleaved layout, so W needs no permutation).
Configs (``QUACK_CONFIGS``): 128x160 tiles, cluster (2, 1), pingpong (the best of
QuACK's SM90 configs measured on the H200 for this shape, 2026-12-03) and QuACK's
own per-architecture default; rows record which.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

PACKAGE = "quack-kernels"
PINNED_VERSION = "0.6.5"

# name -> GemmConfig fields (None: QuACK's per-architecture default, quack.gemm_config).
QUACK_CONFIGS = {
    "128x160_c2x1_pingpong": dict(tile_m=128, tile_n=160, cluster_m=2, cluster_n=1,
                                  pingpong=True, is_dynamic_persistent=False),
    "quack_default": None,
}
# The configs ``qkv.qkv_rope`` runs (and notebook 05 times): the faster of the two above in
# the committed sweep (data/exploration/nvidia-h200/qkv_gemm_sweep.csv, H200, Kimi 1152 -> 3 x 16 x 72)
# at every token count: the RoPE epilogue at 128x160, the plain GEMM at QuACK's default
# (128x192). The times: docs/DECISIONS.md ("QuACK's GEMM configs").
DEFAULT_ROPE_CONFIG = "128x160_c2x1_pingpong"
DEFAULT_PLAIN_CONFIG = "quack_default"


def kimi_mrope_tables(heads: int, head_dim: int, freqs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(freq_t, freq_h, freq_w), each fp32 (1, 3*H*D): the per-column float-float
    tables ``mrope_posfreq_epi`` reads for Kimi's 2D RoPE on a packed qkv projection.

    ``freqs``: Kimi's frequencies (D/4,) (``vision_rope_frequencies``). Column pair
    ``(2j, 2j+1)`` of each q/k head holds ``(hi, lo)`` of ``freqs[j//2] / 2pi``
    (hi + lo: its two-float32 split, computed in float64) in the column table
    when j is even and in the row table when j is odd; the time table and the v
    columns are zero."""
    if not isinstance(freqs, torch.Tensor) or freqs.dim() != 1:
        raise ValueError("freqs must be a 1-D tensor of Kimi's frequencies (head_dim/4,)")
    if head_dim % 4 or freqs.shape[0] != head_dim // 4:
        raise ValueError(f"freqs has {freqs.shape[0]} entries; head_dim {head_dim} needs "
                         f"{head_dim // 4} (a multiple of 4 for Kimi's 2D RoPE)")
    # on freqs' device, torch ops only: safe inside CUDA-graph capture
    turns = freqs.double() / (2 * math.pi)
    hi = turns.float()
    lo = (turns - hi.double()).float()
    pair = torch.arange(head_dim // 2, device=freqs.device)
    f_hi, f_lo = hi[pair // 2], lo[pair // 2]
    zero = torch.zeros_like(f_hi)

    def head_table(on: torch.Tensor) -> torch.Tensor:  # (D,): (hi, lo) per pair where on
        return torch.stack([torch.where(on, f_hi, zero), torch.where(on, f_lo, zero)],
                           dim=-1).reshape(-1)

    def packed(head: torch.Tensor) -> torch.Tensor:  # q and k heads rotate, v does not
        v = torch.zeros(heads * head_dim, device=freqs.device)
        return torch.cat([head.repeat(2 * heads), v])[None, :].contiguous()

    even = pair % 2 == 0
    freq_w = packed(head_table(even))
    return torch.zeros_like(freq_w), packed(head_table(~even)), freq_w


def kimi_mrope_positions(coords: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(pos_t, pos_h, pos_w), each fp32 (1, T), from int32 (T, 2) patch (row, column)
    coordinates (``vision_patch_coords``)."""
    if not isinstance(coords, torch.Tensor) or coords.dim() != 2 or coords.shape[1] != 2:
        raise ValueError("coords must be a (tokens, 2) tensor of patch (row, column)")
    rows = coords[:, 0].float()[None, :].contiguous()
    cols = coords[:, 1].float()[None, :].contiguous()
    return torch.zeros_like(rows), rows, cols


def kimi_mrope_operands(heads: int, head_dim: int, coords: torch.Tensor, freqs: torch.Tensor,
                        bias: torch.Tensor | None) -> dict:
    """Every operand ``mrope_posfreq_epi`` takes besides A, B and D, for Kimi's RoPE."""
    pos_t, pos_h, pos_w = kimi_mrope_positions(coords)
    freq_t, freq_h, freq_w = kimi_mrope_tables(heads, head_dim, freqs)
    n = 3 * heads * head_dim
    b = (torch.zeros(n, device=coords.device) if bias is None else bias.float())[None, :]
    return dict(pos_t=pos_t, pos_h=pos_h, pos_w=pos_w, freq_t=freq_t, freq_h=freq_h,
                freq_w=freq_w, bias=b.contiguous())


def gemm_config(name: str, device):
    """The ``quack.gemm_config.GemmConfig`` of a ``QUACK_CONFIGS`` name, and its label.

    One object per (name, device) for the whole process: QuACK's eager call caches
    its launch plan by ``id(config)``, so a config rebuilt per call would let a
    freed config's id, reused by another name's, replay that other config's plan."""
    if name not in QUACK_CONFIGS:
        raise ValueError(f"unknown QuACK config {name!r}; choose from {sorted(QUACK_CONFIGS)}")
    return _gemm_config(name, str(torch.device(device)))


@functools.cache
def _gemm_config(name: str, device: str):
    from quack.gemm_config import GemmConfig, default_config

    fields = QUACK_CONFIGS[name]
    config = default_config(torch.device(device)) if fields is None else GemmConfig(**fields)
    return config, config_label(config)


def config_label(config) -> str:
    """``128x160 c(2,1) pingpong`` style, as result rows record a QuACK config."""
    kind = "pingpong" if config.pingpong else "cooperative"
    return (f"{config.tile_m}x{config.tile_n} c({config.cluster_m},{config.cluster_n}) {kind}"
            f"{' dynamic' if config.is_dynamic_persistent else ''}")


@functools.cache
def _bias_epilogue():
    """QuACK's plain GEMM with a row-vector bias: ``D = acc + bias``."""
    from quack.epilogue.frontend import gemm_epilogue

    @gemm_epilogue()
    def bias_epi(acc, bias):
        return {"D": acc + bias}

    return bias_epi


def _check(x, w, b):
    if not all(isinstance(t, torch.Tensor) for t in (x, w)):
        raise TypeError("x and w must be torch.Tensors")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x (T, hidden) and w (N, hidden) must agree, got {tuple(x.shape)} "
                         f"and {tuple(w.shape)}")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ValueError(f"b must have shape ({w.shape[0]},), got {tuple(b.shape)}")


def quack_gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, *,
               config: str = "128x160_c2x1_pingpong", out: torch.Tensor | None = None):
    """``x @ w^T + b`` (T, N) through QuACK's GEMM (bias in its epilogue)."""
    _check(x, w, b)
    cfg, _ = gemm_config(config, x.device)
    n = w.shape[0]
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device) if out is None else out
    bias = (torch.zeros(n, device=x.device) if b is None else b.float())[None, :].contiguous()
    _bias_epilogue()(x, w.T, out={"D": out}, config=cfg, tuned=False, bias=bias)
    return out


def quack_gemm_rope(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, heads: int,
                    operands: dict, *, config: str = "128x160_c2x1_pingpong",
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Packed qkv (T, 3, H, D), q/k rotated in QuACK's epilogue. ``operands``:
    ``kimi_mrope_operands(heads, head_dim, coords, freqs, b)`` (built once per
    token layout; the bias is one of them)."""
    from quack.epilogue.rotary import mrope_posfreq_epi

    _check(x, w, b)
    cfg, _ = gemm_config(config, x.device)
    n = w.shape[0]
    head_dim = n // (3 * heads)
    if out is None:
        out = torch.empty(x.shape[0], 3, heads, head_dim, dtype=x.dtype, device=x.device)
    mrope_posfreq_epi(x, w.T, out={"D": out.view(x.shape[0], n)}, config=cfg, tuned=False,
                      **operands)
    return out


def _tiny_check() -> None:
    """A small problem against float64: raises if QuACK's epilogue disagrees."""
    from rope_kernels.kernels.freqs import (vision_freqs_cis, vision_patch_coords,
                                            vision_rope_frequencies)
    from rope_kernels.kernels.reference import rope_reference

    heads, head_dim, hidden, grids = 2, 72, 128, [(1, 8, 16)]
    tokens = 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(3 * heads * head_dim, hidden, device="cuda", generator=gen)
         / hidden**0.5).bfloat16()
    b = torch.randn(3 * heads * head_dim, device="cuda", generator=gen).bfloat16()
    ops = kimi_mrope_operands(heads, head_dim, vision_patch_coords(grids, device="cuda"),
                              vision_rope_frequencies(head_dim, device="cuda"), b)
    out = quack_gemm_rope(x, w, b, heads, ops)
    ref = (x.double() @ w.double().T + b.double()).view(tokens, 3, heads, head_dim)
    q, k = rope_reference(ref[:, 0], ref[:, 1], vision_freqs_cis(grids, head_dim, device="cuda"))
    err = max((o.double() - r).abs().max().item()
              for o, r in ((out[:, 0], q), (out[:, 1], k), (out[:, 2], ref[:, 2])))
    scale = ref.abs().max().item()
    if not err <= 2**-7 * scale:
        raise RuntimeError(f"max error {err:.3g} against float64 (scale {scale:.3g})")


@functools.cache
def availability() -> tuple[bool, str]:
    """(runs here, why not): installed, a CUDA GPU of compute capability 9.0 or
    newer, and a small call that matches float64."""
    import importlib.util

    from rope_kernels.peers.cache import installed_version

    version = installed_version(PACKAGE)
    if importlib.util.find_spec("quack") is None or version is None:
        return False, f"{PACKAGE} not installed (pinned {PINNED_VERSION}; CUDA sm_90+, CuTe DSL)"
    if version != PINNED_VERSION:
        return False, f"{PACKAGE} {version} installed, pinned {PINNED_VERSION}"
    if not torch.cuda.is_available() or torch.version.hip:
        return False, f"{PACKAGE} installed but needs a CUDA device"
    if torch.cuda.get_device_capability()[0] < 9:
        return False, f"{PACKAGE}'s GEMM epilogues need compute capability 9.0+"
    try:
        _tiny_check()
    except Exception as exc:  # noqa: BLE001 - any failure means "does not run here"
        return False, f"{PACKAGE} GEMM failed on this device: {type(exc).__name__}: {exc}"[:300]
    return True, ""


def source() -> tuple[str, str]:
    """(version, sha256 of quack/epilogue/rotary.py) of the installed package."""
    import quack.epilogue.rotary

    from rope_kernels.peers.cache import installed_version, sha256_file

    return installed_version(PACKAGE) or "", sha256_file(Path(quack.epilogue.rotary.__file__))
