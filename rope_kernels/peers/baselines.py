"""What a user would pick instead of writing a kernel: torch.compile and Liger."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_rotation
from rope_kernels.kernels.reference import cos_sin_views, rope_cos_sin
from rope_kernels.peers.cache import sha256_file

# Static shapes mean one graph per (shape, strides, dtype). Dynamo's default
# recompile limit (8) would then silently fall back to eager after 8 shapes and
# the "compiled" numbers would be eager ones; we raise the limit and make
# hitting it an error instead.
RECOMPILE_LIMIT = 1024
_compiled_fn = None


def _compiled():
    global _compiled_fn
    if _compiled_fn is None:
        import torch._dynamo

        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
        cfg.fail_on_recompile_limit_hit = True
        _compiled_fn = torch.compile(rope_cos_sin, dynamic=False, fullgraph=True)
    return _compiled_fn


def compiled_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor, rotation: str = "pairs"
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.compile (Inductor, static shapes) of the real-arithmetic cos/sin form."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    check_rotation(rotation)
    cos, sin = cos_sin_views(freqs_cis)
    return _compiled()(xq, xk, cos, sin, rotation)


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def _liger_half_cos_sin(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger's rope takes (1, T, D) cos/sin (both halves; it reads the first): built once
    per freqs_cis, as Qwen's towers build cat(angles, angles) once per forward."""
    return (torch.cat((freqs_cis.real, freqs_cis.real), -1).unsqueeze(0).contiguous(),
            torch.cat((freqs_cis.imag, freqs_cis.imag), -1).unsqueeze(0).contiguous())


def liger_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor, rotation: str = "pairs"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger-Kernel's RoPE on copies: ``llama4_rope`` (in place, fused q/k, interleaved
    pairs) or, for rotation="half", ``rope.LigerRopeFunction`` (rotate-half, in place on
    its (batch, seq, heads, dim) storage, q and k in one launch).

    Liger rotates its inputs in place, so the caller's q/k are first copied into
    contiguous buffers (2 copy kernels + 1 Liger kernel).
    """
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    q = xq.clone(memory_format=torch.contiguous_format).unsqueeze(0)
    k = xk.clone(memory_format=torch.contiguous_format).unsqueeze(0)
    if check_rotation(rotation) == "half":
        from liger_kernel.ops.rope import LigerRopeFunction

        from rope_kernels.peers.prepared import prepared_per_freqs

        cos, sin = prepared_per_freqs(freqs_cis, "liger/half", _liger_half_cos_sin)
        # Liger's logical layout is (batch, heads, seq, dim) over (batch, seq, heads, dim) storage
        q, k = LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q.transpose(1, 2).squeeze(0), k.transpose(1, 2).squeeze(0)
    from liger_kernel.ops.llama4_rope import LigerLlama4RopeFunction

    q, k = LigerLlama4RopeFunction.apply(q, k, freqs_cis)
    return q.squeeze(0), k.squeeze(0)


def _liger_source() -> tuple[str, str, str]:
    import liger_kernel.ops.llama4_rope as llama4_rope
    import liger_kernel.ops.rope as rope

    return (importlib.metadata.version("liger-kernel"),
            f"{sha256_file(Path(llama4_rope.__file__))}+{sha256_file(Path(rope.__file__))}",
            "installed")


def rope_variant(name: str) -> dict:
    """The registry's spec of ``compiled`` or ``liger`` (the catalogue's ``module`` contract:
    ``variants``): torch.compile always runs (its rows carry torch's version); Liger where
    liger-kernel is installed (with the sha256 of its ``llama4_rope.py``)."""
    if name == "compiled":
        return {"package": "torch", "available": lambda: (True, ""),
                "source": lambda: (torch.__version__, "", "installed"),
                "fn": compiled_rope, "launches": 1, "launches_fp32": 1,
                "rotations": ("pairs", "half"),
                "description": "torch.compile (Inductor, static shapes) of the real cos/sin form"}
    if name == "liger":
        return {"package": "liger-kernel",
                "available": lambda: (liger_available(), "liger-kernel not installed"),
                "source": _liger_source, "fn": liger_rope, "launches": 3, "launches_fp32": 3,
                "rotations": ("pairs", "half"),
                "description": "Liger-Kernel llama4_rope (pairs) or rope (rotate-half), in place "
                               "on copies of q and k"}
    raise ValueError(f"rope_kernels.peers.baselines builds compiled and liger, not {name!r}")
