"""Two launch strategies of the fused q/k rotation, measured beside the default.

``fused_qk_rope`` (``fused.py``) launches one program per tile of ``BLOCK_T`` tokens x
``BLOCK_H`` heads and reads cos/sin from a table. At Kimi's shapes it reaches 80-88% of
the H200's copy ceiling while an SM copy of the same bytes reaches 91-97%
(STUDY_FACTS, "Copy references"); no tile size or warp count in the committed sweep
(``data/nvidia-h200/fused_configs.csv``) closes that gap. Two ideas worth a
measurement, kept as separate kernels side by side (as Triton's persistent-matmul
tutorial keeps its variants) so each shows what it buys:

- **persistent** (``fused_qk_rope_persistent``): ``programs_per_sm`` x SMs programs
  loop over the same tiles (``tl.range`` with ``num_stages``, so the compiler may
  prefetch the next tile's q/k while this one is rotated and stored). At 87,616 x 16
  x 72 the default launches 175,232 programs of 128 threads; a persistent grid pays
  no per-program start-up and keeps loads in flight across tiles.
- **angles** (``fused_qk_rope_angles``): cos/sin computed in-kernel from each token's
  (row, column) and Kimi's ``head_dim/4`` frequencies instead of read from a table:
  8 bytes a token instead of 288 (fp32 cos and sin at head_dim 72; 3% of the call's
  9504 bytes a token at 16 heads), and no table to build. The angle is the table's
  own fp32 product ``position * f_i`` (``vision_rope_frequencies``), so cos/sin
  differ from the table's only by the sine/cosine implementation.

Both take the default's tile (``FusedConfig``) and rotate in fp32; neither records
autograd. Neither is the default: ``bench.microbench.sweep_fused_configs`` times them
beside it (columns ``strategy``, ``programs_per_sm``), and the default changes only
if committed measurements say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rope_kernels.kernels.checks import (check_cos_sin, check_qk, check_triton_device,
                                         check_writable_in_place)
from rope_kernels.kernels.fused import (FusedConfig, _rotate_pairs, fused_launch_config,
                                        head_dim_chunks, vector_width)

STRATEGIES = ("grid", "persistent", "angles")  # "grid": the default fused_qk_rope
CPU_PROGRAMS_PER_SM_UNIT = 2  # the interpreter has no SMs: a persistent grid of 2 x pps


@triton.jit
def _cos_sin_of(tokens, token_ok, pairs, pair_ok, cos_ptr, sin_ptr, cos_stride_t, cos_stride_d,
                sin_stride_t, sin_stride_d, coords_ptr, freqs_ptr, ANGLES: tl.constexpr):
    """cos/sin (BLOCK_T, n pairs) of the tile's tokens, fp32: read from the table, or
    computed from the token's (row, col): pair 2i turns by col * f_i, 2i+1 by row * f_i."""
    mask = token_ok[:, None] & pair_ok
    if ANGLES:
        row = tl.load(coords_ptr + tokens * 2, mask=token_ok, other=0).to(tl.float32)
        col = tl.load(coords_ptr + tokens * 2 + 1, mask=token_ok, other=0).to(tl.float32)
        f = tl.load(freqs_ptr + pairs // 2, mask=pair_ok, other=0.0)
        angle = tl.where(pairs % 2 == 0, col[:, None], row[:, None]) * f
        c = tl.where(mask, tl.cos(angle), 0.0)
        s = tl.where(mask, tl.sin(angle), 0.0)
    else:
        c = tl.load(cos_ptr + tokens[:, None] * cos_stride_t + pairs * cos_stride_d, mask=mask,
                    other=0.0)
        s = tl.load(sin_ptr + tokens[:, None] * sin_stride_t + pairs * sin_stride_d, mask=mask,
                    other=0.0)
    return c, s


@triton.jit
def _rope_tile(
    tile, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, coords_ptr, freqs_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, MAIN: tl.constexpr, REST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr, ANGLES: tl.constexpr,
):
    """One tile of ``fused.py``'s kernel (same layout, loads before stores)."""
    N_HEAD_BLOCKS: tl.constexpr = (HEADS + BLOCK_H - 1) // BLOCK_H
    head_block = tile % N_HEAD_BLOCKS
    # int64 token indices, so row offsets are int64 (the tile id itself fits int32)
    tokens = (tile // N_HEAD_BLOCKS) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    token_ok = tokens < n_tokens
    mask = token_ok[:, None, None] & (heads < HEADS)[None, :, None]
    t3 = tokens[:, None, None]
    h3 = heads[None, :, None]
    q_row = q_ptr + t3 * (q_stride_t * VEC) + h3 * (q_stride_h * VEC)
    k_row = k_ptr + t3 * (k_stride_t * VEC) + h3 * (k_stride_h * VEC)
    qo_row = q_out_ptr + t3 * (qo_stride_t * VEC) + h3 * (qo_stride_h * VEC)
    ko_row = k_out_ptr + t3 * (ko_stride_t * VEC) + h3 * (ko_stride_h * VEC)

    d = tl.arange(0, MAIN)[None, None, :]
    j = tl.arange(0, MAIN // 2)[None, :]
    q = tl.load(q_row + d, mask=mask, other=0.0)
    k = tl.load(k_row + d, mask=mask, other=0.0)
    cos, sin = _cos_sin_of(tokens, token_ok, j, j < MAIN // 2, cos_ptr, sin_ptr, cos_stride_t,
                           cos_stride_d, sin_stride_t, sin_stride_d, coords_ptr, freqs_ptr, ANGLES)
    if REST > 0:
        d2 = MAIN + tl.arange(0, REST)[None, None, :]
        j2 = MAIN // 2 + tl.arange(0, REST // 2)[None, :]
        mask2 = mask & (d2 < HEAD_DIM)
        q2 = tl.load(q_row + d2, mask=mask2, other=0.0)
        k2 = tl.load(k_row + d2, mask=mask2, other=0.0)
        cos2, sin2 = _cos_sin_of(tokens, token_ok, j2, j2 < HEAD_DIM // 2, cos_ptr, sin_ptr,
                                 cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                                 coords_ptr, freqs_ptr, ANGLES)

    out_ty = q_out_ptr.dtype.element_ty
    tl.store(qo_row + d, _rotate_pairs(q, cos, sin, BLOCK_T, BLOCK_H, MAIN).to(out_ty), mask=mask)
    tl.store(ko_row + d, _rotate_pairs(k, cos, sin, BLOCK_T, BLOCK_H, MAIN).to(out_ty), mask=mask)
    if REST > 0:
        tl.store(qo_row + d2, _rotate_pairs(q2, cos2, sin2, BLOCK_T, BLOCK_H, REST).to(out_ty),
                 mask=mask2)
        tl.store(ko_row + d2, _rotate_pairs(k2, cos2, sin2, BLOCK_T, BLOCK_H, REST).to(out_ty),
                 mask=mask2)


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_persistent_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
    cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, MAIN: tl.constexpr, REST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """A fixed grid of programs, each looping over tiles pid, pid + grid, ..."""
    N_HEAD_BLOCKS: tl.constexpr = (HEADS + BLOCK_H - 1) // BLOCK_H
    n_tiles = tl.cdiv(n_tokens, BLOCK_T) * N_HEAD_BLOCKS
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        _rope_tile(tile, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, cos_ptr, cos_ptr,
                   n_tokens, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
                   qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
                   cos_stride_t, cos_stride_d, sin_stride_t, sin_stride_d,
                   HEADS, HEAD_DIM, MAIN, REST, BLOCK_T, BLOCK_H, VEC, False)


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qk_rope_angles_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, coords_ptr, freqs_ptr,
    n_tokens,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, MAIN: tl.constexpr, REST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, VEC: tl.constexpr,
):
    """One program per tile; cos/sin from (row, col) and the frequencies."""
    _rope_tile(tl.program_id(0), q_ptr, k_ptr, q_out_ptr, k_out_ptr, freqs_ptr, freqs_ptr,
               coords_ptr, freqs_ptr, n_tokens, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
               qo_stride_t, qo_stride_h, ko_stride_t, ko_stride_h, 0, 0, 0, 0,
               HEADS, HEAD_DIM, MAIN, REST, BLOCK_T, BLOCK_H, VEC, True)


# -- launchers -----------------------------------------------------------------------
def _outputs(xq, xk, inplace: bool, who: str):
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if torch.is_grad_enabled() and (xq.requires_grad or xk.requires_grad):
        raise ValueError(f"{who} records no autograd (a launch candidate); use fused_qk_rope "
                         "or torch.no_grad()")
    if inplace:
        check_writable_in_place(xq, xk)
        return xq, xk
    q_out = torch.empty(xq.shape, dtype=xq.dtype, device=xq.device)
    k_out = torch.empty(xk.shape, dtype=xk.dtype, device=xk.device)
    return q_out, k_out


def _config(xq, config):
    if config is None:
        return fused_launch_config(xq.shape[1], xq.shape[2], xq.element_size())
    if not isinstance(config, FusedConfig):
        raise TypeError(f"config must be a FusedConfig, got {type(config).__name__}")
    return config


def _strides(xq, xk, q_out, k_out, vec):
    return (xq.stride(0) // vec, xq.stride(1) // vec, xk.stride(0) // vec, xk.stride(1) // vec,
            q_out.stride(0) // vec, q_out.stride(1) // vec,
            k_out.stride(0) // vec, k_out.stride(1) // vec)


def sm_count(device) -> int:
    """Streaming multiprocessors (compute units on ROCm) of ``device``; under the CPU
    interpreter a stand-in that still makes a persistent grid loop."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_PROGRAMS_PER_SM_UNIT


def persistent_grid(n_tokens: int, heads: int, config: FusedConfig, programs_per_sm: int,
                    device) -> tuple[int]:
    tiles = triton.cdiv(n_tokens, config.block_t) * triton.cdiv(heads, config.block_h)
    return (max(1, min(tiles, programs_per_sm * sm_count(device))),)


def fused_qk_rope_persistent(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, *, inplace: bool = False,
                             config: FusedConfig | None = None, programs_per_sm: int = 4,
                             num_stages: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_qk_rope`` on a persistent grid: ``programs_per_sm`` x SMs programs, each
    looping over the default's tiles. Same arguments and result as ``fused_qk_rope``
    (no autograd); ``num_stages`` is the loop's software-pipelining depth."""
    check_qk(xq, xk)
    check_cos_sin(cos, sin, xq)
    for name, v in (("programs_per_sm", programs_per_sm), ("num_stages", num_stages)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    config = _config(xq, config)
    q_out, k_out = _outputs(xq, xk, inplace, "fused_qk_rope_persistent")
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return q_out, k_out
    check_triton_device(xq, "fused_qk_rope_persistent")
    main, rest = head_dim_chunks(head_dim)
    vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    _fused_qk_rope_persistent_kernel[persistent_grid(tokens, heads, config, programs_per_sm,
                                                     xq.device)](
        xq, xk, q_out, k_out, cos, sin, tokens, *_strides(xq, xk, q_out, k_out, vec),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t,
        BLOCK_H=config.block_h, VEC=vec, NUM_STAGES=num_stages, num_warps=config.num_warps,
    )
    return q_out, k_out


def _check_coords_freqs(coords, freqs, xq) -> None:
    for name, t in (("coords", coords), ("freqs", freqs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != xq.device:
            raise ValueError(f"{name} is on {t.device} but xq is on {xq.device}")
    if coords.dtype != torch.int32:
        raise TypeError(f"coords must be int32 (row, column) pairs, got {coords.dtype}")
    if tuple(coords.shape) != (xq.shape[0], 2) or not coords.is_contiguous():
        raise ValueError(f"coords must be contiguous with shape (tokens, 2) = ({xq.shape[0]}, 2), "
                         f"got {tuple(coords.shape)}")
    if freqs.dtype != torch.float32 or tuple(freqs.shape) != (xq.shape[2] // 4,) \
            or not freqs.is_contiguous():
        raise ValueError(f"freqs must be a contiguous float32 vector of head_dim/4 = "
                         f"{xq.shape[2] // 4} frequencies, got {freqs.dtype} {tuple(freqs.shape)}")
    if xq.shape[2] % 4:
        raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {xq.shape[2]}")


def fused_qk_rope_angles(xq: torch.Tensor, xk: torch.Tensor, coords: torch.Tensor,
                         freqs: torch.Tensor, *, inplace: bool = False,
                         config: FusedConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi's 2D rotation with the angles computed in the kernel.

    Args:
        xq, xk: (T, H, D) as for ``fused_qk_rope``.
        coords: int32 (T, 2) contiguous, each token's (row, column) in its image's
            patch grid (``vision_patch_coords``).
        freqs: fp32 (D/4,) contiguous, Kimi's frequencies (``vision_rope_frequencies``).
    """
    check_qk(xq, xk)
    _check_coords_freqs(coords, freqs, xq)
    config = _config(xq, config)
    q_out, k_out = _outputs(xq, xk, inplace, "fused_qk_rope_angles")
    tokens, heads, head_dim = xq.shape
    if tokens == 0 or heads == 0:
        return q_out, k_out
    check_triton_device(xq, "fused_qk_rope_angles")
    main, rest = head_dim_chunks(head_dim)
    vec = vector_width((xq, xk, q_out, k_out), xq.element_size())
    grid = (triton.cdiv(tokens, config.block_t) * triton.cdiv(heads, config.block_h),)
    _fused_qk_rope_angles_kernel[grid](
        xq, xk, q_out, k_out, coords, freqs, tokens, *_strides(xq, xk, q_out, k_out, vec),
        HEADS=heads, HEAD_DIM=head_dim, MAIN=main, REST=rest, BLOCK_T=config.block_t,
        BLOCK_H=config.block_h, VEC=vec, num_warps=config.num_warps,
    )
    return q_out, k_out


# -- what the launch-config sweep times beside the default ---------------------------
@dataclass(frozen=True)
class FusedCandidate:
    """One candidate launch of the fused rotation: a strategy and its settings."""

    strategy: str  # "persistent" or "angles" (STRATEGIES[1:])
    config: FusedConfig
    programs_per_sm: int = 0  # persistent only
    num_stages: int = 2  # persistent only: the tile loop's pipelining depth

    def __post_init__(self):
        if self.strategy not in STRATEGIES[1:]:
            raise ValueError(f"strategy must be one of {STRATEGIES[1:]}, got {self.strategy!r}")
        if not isinstance(self.config, FusedConfig):
            raise TypeError(f"config must be a FusedConfig, got {type(self.config).__name__}")
        if (self.strategy == "persistent") != (self.programs_per_sm > 0):
            raise ValueError("programs_per_sm > 0 goes with the persistent strategy only")


def fused_candidates(heads: int, head_dim: int, element_size: int) -> list[FusedCandidate]:
    """The candidates the sweep times for one (heads, head_dim): on the default's tile
    (``fused_launch_config``), a persistent grid of 2, 4 or 8 programs per SM (and 4
    with 8 warps), and in-kernel angles with 4 and 8 warps."""
    d = fused_launch_config(heads, head_dim, element_size)
    wide = FusedConfig(d.block_t, d.block_h, 8)
    return ([FusedCandidate("persistent", d, p) for p in (2, 4, 8)]
            + [FusedCandidate("persistent", wide, 4),
               FusedCandidate("angles", d), FusedCandidate("angles", wide)])


def sweep_grid(tokens: int) -> list[tuple[int, int, int]]:
    """Patch grids that hold ``tokens`` for timing the angles candidate: 74 x 74
    images (1024x1024) when ``tokens`` is a multiple of 5476, else one image whose
    width is the largest divisor of ``tokens`` up to 512."""
    if tokens % 5476 == 0:
        return [(1, 74, 74)] * (tokens // 5476)
    width = max(w for w in range(1, min(tokens, 512) + 1) if tokens % w == 0)
    return [(1, tokens // width, width)]
