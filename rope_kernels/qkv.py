"""The QKV projection with Kimi's RoPE in its epilogue: one entry point, backends behind it.

``qkv_rope(x, w, b, operands, heads=..., head_dim=..., backend=..., epilogue=...)``
returns the packed qkv (T, 3, H, D) = ``rope(x @ w^T + b)`` (q and k rotated, v not), or
with ``epilogue="none"`` the plain projection (the GEMM's own floor, for benchmarks).
Backends:

- ``"cute"``: our CuTe DSL kernel (``kernels/qkv_cute.py``): sm_90 GPUs with
  nvidia-cutlass-dsl; angles in-kernel from each token's patch coordinates.
- ``"triton"``: our portable Triton kernel (``kernels/qkv_gemm.py``), angles in-kernel.
- ``"triton_table"``: the same kernel reading cos/sin from the table (``freqs_cis``).
- ``"quack"``: QuACK's GEMM with its mRoPE epilogue (``peers/quack_gemm.py``), where
  QuACK is installed and runs.
- ``"auto"``: ``"cute"`` where it runs, else ``"triton"``; for ``rotation="half"``,
  ``"triton_table"``.

``rotation``: ``"pairs"`` (Kimi's interleaved x[2j], x[2j+1]; every backend) or ``"half"``
(Qwen's rotate-half, x[j] with x[j + D/2]; ``"triton_table"`` only). Column j of the cos/sin
table is pair j's angle in both. An N tile is ``block_n`` consecutive columns across head
boundaries, so a rotate-half partner (D/2 = 36 or 40 columns away) is mostly in another part
of the tile or in another tile. Rotate-half is the pairs rotation up to a fixed permutation
of each q and k head's columns (column j + r*D/2 placed at 2j + r), so ``"half"`` is the
same pairs epilogue with one more composed function, the kernel's column map
(``qkv_gemm._rotate_half_columns``): tile column ``h*D + 2j + r`` loads W's row (and the
bias entry) ``h*D + j + r*D/2`` and is stored to that output column. Every pair then sits
in two adjacent columns of one store, whatever the tile's alignment to the heads, and the
packed qkv comes back in the model's own layout. Nothing is permuted or cached per weight:
W is gathered row by row as the kernel reads it (pointer loads and stores; TMA boxes
cannot gather), so the promise below holds for "half" too. The angles-in-kernel
backends (``"triton"``, ``"cute"``) compute Kimi's 2D frequencies and ``"quack"`` runs
Kimi's mRoPE: they are pairs-only and refuse ``"half"``.

``operands`` (``qkv_rope_operands``) holds what depends on the tokens' positions and
the frequencies only, built once per forward and shared by every layer: the patch
coordinates, Kimi's frequencies, the cos/sin table where a backend reads one, the
CuTe kernel's per-pair turns, QuACK's position and frequency tables. What depends on the
layer (W, b) is read at every call, so no update of a layer's parameters is missed: our
kernels (CuTe, Triton) read W and b as operands, from their own memory, with nothing
built per call; QuACK's fp32 bias row is cast from b per call (3*H*D values).

Layer: above the kernels and the peers (it dispatches to both), beside ``variants``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rope_kernels.kernels import qkv_cute, qkv_gemm
from rope_kernels.kernels.checks import (check_no_autograd, check_positive_int,
                                         check_qkv_operands, check_qkv_out, check_rotation)
from rope_kernels.kernels.freqs import vision_rope_frequencies
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.peers import quack_gemm

BACKENDS = ("auto", "cute", "triton", "triton_table", "quack")
EPILOGUES = ("rope", "none")
_CONFIG_TYPES = {"cute": qkv_cute.CuteQKVConfig, "triton": qkv_gemm.QKVGemmConfig,
                 "triton_table": qkv_gemm.QKVGemmConfig, "quack": str}


@dataclass(frozen=True, eq=False)
class QKVRopeOperands:
    """Per-forward operands of ``qkv_rope`` (``qkv_rope_operands`` builds them)."""

    heads: int
    head_dim: int
    coords: torch.Tensor        # int32 (T, 2): each token's (row, column) in its patch grid
    freqs: torch.Tensor         # fp32 (D/4,): Kimi's frequencies
    cos: torch.Tensor | None    # fp32 (T, D/2) views of freqs_cis ("triton_table")
    sin: torch.Tensor | None
    pair_turns: torch.Tensor | None  # fp32 (3HD/2, 2) ("cute")
    quack: dict | None          # QuACK's positions and frequency tables, bias left out

    @property
    def tokens(self) -> int:
        return self.coords.shape[0]


def resolve_backend(backend: str, device, rotation: str = "pairs") -> str:
    """The backend ``qkv_rope`` runs for ``backend`` on ``device`` ("auto" resolved;
    ``rotation="half"``: "triton_table", the one backend that rotates halves)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if check_rotation(rotation) == "half":
        if backend not in ("auto", "triton_table"):
            raise ValueError(f"backend {backend!r} rotates Kimi's interleaved pairs only "
                             "(rotation='pairs'); rotation='half' runs on 'triton_table' "
                             "(cos/sin from freqs_cis) or 'auto'")
        return "triton_table"
    if backend == "auto":
        return "cute" if qkv_cute.availability(device)[0] else "triton"
    return backend


def qkv_rope_operands(coords: torch.Tensor, *, heads: int, head_dim: int,
                      theta: float = 10000.0, freqs_cis: torch.Tensor | None = None,
                      backend: str = "auto", rotation: str = "pairs") -> QKVRopeOperands:
    """Build ``qkv_rope``'s operands once per forward (every layer shares them).

    ``coords``: int32 (T, 2) patch (row, column) of each token (``vision_patch_coords``);
    ``theta``: Kimi's RoPE base; ``freqs_cis``: complex (T, D/2), needed only by
    ``"triton_table"`` (its cos/sin views are the table); ``rotation``: resolves
    ``"auto"`` as ``qkv_rope`` will (``resolve_backend``)."""
    check_positive_int("heads", heads)
    check_positive_int("head_dim", head_dim)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 for Kimi's 2D RoPE, got {head_dim}")
    if not isinstance(coords, torch.Tensor) or coords.dtype != torch.int32 \
            or coords.dim() != 2 or coords.shape[1] != 2:
        raise ValueError("coords must be an int32 (tokens, 2) tensor of patch (row, column)")
    backend = resolve_backend(backend, coords.device, rotation)
    coords = coords.contiguous()
    freqs = vision_rope_frequencies(head_dim, theta=theta, device=coords.device)
    cos = sin = turns = quack_ops = None
    if backend == "triton_table":
        if not isinstance(freqs_cis, torch.Tensor) or tuple(freqs_cis.shape) != (
                coords.shape[0], head_dim // 2) or not freqs_cis.is_complex():
            raise ValueError(f"backend 'triton_table' reads cos/sin: give freqs_cis, complex "
                             f"({coords.shape[0]}, {head_dim // 2})")
        cos, sin = cos_sin_views(freqs_cis)
    elif backend == "cute":
        turns = qkv_cute.rope_pair_turns(heads, head_dim, freqs)
    elif backend == "quack":
        quack_ops = {name: t for name, t in quack_gemm.kimi_mrope_operands(
            heads, head_dim, coords, freqs, None).items() if name != "bias"}
    return QKVRopeOperands(heads, head_dim, coords, freqs, cos, sin, turns, quack_ops)


def qkv_rope(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
             operands: QKVRopeOperands | torch.Tensor, *, heads: int, head_dim: int,
             backend: str = "auto", epilogue: str = "rope", config=None,
             out: torch.Tensor | None = None, rotation: str = "pairs") -> torch.Tensor:
    """Packed qkv (T, 3, H, D) = ``rope(x @ w^T + b)`` (``epilogue="none"``: not rotated).

    Args:
        x: (T, hidden) bf16/fp16; w: (3*H*D, hidden) contiguous, x's dtype (as
            ``nn.Linear`` holds it); b: (3*H*D,) or None. Read at every call.
        operands: ``qkv_rope_operands(...)`` (built once per forward), or the int32 (T, 2)
            patch coordinates (the operands are then built for this call, theta 10000).
        heads, head_dim: H and D; checked against w and the operands.
        backend: see the module docstring; ``"auto"``: CuTe where it runs, else Triton.
        epilogue: ``"rope"`` or ``"none"`` (rotation compiled out).
        config: the backend's launch settings (``CuteQKVConfig``, ``QKVGemmConfig``, or a
            ``quack_gemm.QUACK_CONFIGS`` name); None: the backend's default.
        out: optional (T, 3, H, D) contiguous output sharing no memory with an input.
        rotation: ``"pairs"`` (Kimi) or ``"half"`` (Qwen's rotate-half: ``"triton_table"``
            or ``"auto"`` only; the others refuse it, see the module docstring).
    """
    check_positive_int("heads", heads)
    check_positive_int("head_dim", head_dim)
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {EPILOGUES}, got {epilogue!r}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    backend = resolve_backend(backend, x.device, rotation)
    if isinstance(operands, torch.Tensor):
        operands = qkv_rope_operands(operands, heads=heads, head_dim=head_dim, backend=backend)
    if not isinstance(operands, QKVRopeOperands):
        raise TypeError(f"operands must be qkv_rope_operands(...) or int32 (T, 2) coordinates, "
                        f"got {type(operands).__name__}")
    if (operands.heads, operands.head_dim) != (heads, head_dim):
        raise ValueError(f"operands were built for {operands.heads} heads x {operands.head_dim}, "
                         f"not heads={heads}, head_dim={head_dim}")
    if operands.tokens != x.shape[0]:
        raise ValueError(f"operands hold {operands.tokens} tokens' positions but x has "
                         f"{x.shape[0]} tokens")
    if config is not None and not isinstance(config, _CONFIG_TYPES[backend]):
        raise TypeError(f"config for backend {backend!r} must be a "
                        f"{_CONFIG_TYPES[backend].__name__}, got {type(config).__name__}")
    check_qkv_operands(x, w, b, head_dim, heads)
    rotate = epilogue == "rope"
    if backend in ("triton", "triton_table"):
        if not rotate:
            return qkv_gemm.qkv_linear_unrotated(x, w, b, heads=heads, head_dim=head_dim,
                                                 config=config, out=out)
        if backend == "triton":
            return qkv_gemm.qkv_rope_linear_angles(x, w, b, operands.coords, operands.freqs,
                                                   heads=heads, config=config, out=out)
        if operands.cos is None:
            raise ValueError("backend 'triton_table' needs operands built with "
                             "backend='triton_table' and freqs_cis")
        return qkv_gemm.qkv_rope_linear(x, w, b, operands.cos, operands.sin, heads=heads,
                                        config=config, out=out, rotation=rotation)
    if backend == "cute":
        if operands.pair_turns is None:
            raise ValueError("backend 'cute' needs operands built with backend='cute' (or 'auto' "
                             "where CuTe runs)")
        cfg = config if config is not None else qkv_cute.CuteQKVConfig()
        if not rotate:
            cfg = qkv_cute.CuteQKVConfig(**{**cfg.__dict__, "rotate": False})
        return qkv_cute.qkv_rope_linear_cute(x, w, b, operands.pair_turns, operands.coords,
                                             heads=heads, head_dim=head_dim, config=cfg,
                                             out=out)
    # quack
    check_no_autograd("qkv_rope(backend='quack')", x=x, w=w, b=b)
    if out is not None:
        check_qkv_out(out, (x.shape[0], 3, heads, head_dim), x, {"x": x, "w": w, "b": b})
    ok, why = quack_gemm.availability()
    if not ok:
        raise ValueError(f"backend 'quack' does not run here: {why}")
    name = config if config is not None else (quack_gemm.DEFAULT_PLAIN_CONFIG if not rotate
                                              else quack_gemm.DEFAULT_ROPE_CONFIG)
    if not rotate:
        flat = None if out is None else out.view(x.shape[0], 3 * heads * head_dim)
        return quack_gemm.quack_gemm(x, w, b, config=name, out=flat).view(
            x.shape[0], 3, heads, head_dim)
    if operands.quack is None:
        raise ValueError("backend 'quack' needs operands built with backend='quack'")
    n = 3 * heads * head_dim
    bias = (torch.zeros(n, device=x.device) if b is None else b.detach().float())[None, :]
    return quack_gemm.quack_gemm_rope(x, w, b, heads, {**operands.quack, "bias": bias.contiguous()},
                                      config=name, out=out)
