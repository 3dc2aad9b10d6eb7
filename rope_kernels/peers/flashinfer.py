"""FlashInfer's in-place RoPE (``flashinfer.rope.apply_rope_with_cos_sin_cache_inplace``).

Used only where the ``flashinfer-python`` package is installed and runs on this
device (it JIT-compiles CUDA kernels); otherwise absent, with the reason in
``peer_status``. Interleaved pairs (``is_neox=False``), q and k in one launch, in
place on the strided q/k slices of the packed qkv. FlashInfer takes a fp32
(max_pos, rotary_dim) cache (cos half, then sin half) and int positions; building
them from freqs_cis is part of each call here (an engine would build them once per
forward: 2 of the 3 launches).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_writable_in_place
from rope_kernels.peers.cache import installed_cuda_peer, installed_version, sha256_file

PACKAGE = "flashinfer-python"
PINNED_VERSION = "0.7.2.post1"
ENTRY_FILE = "flashinfer/rope.py"


def flashinfer_rope(xq: torch.Tensor, xk: torch.Tensor,
                    freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate xq and xk in place with FlashInfer; returns them."""
    from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    check_writable_in_place(xq, xk)
    cache = torch.cat((freqs_cis.real, freqs_cis.imag), dim=-1)
    positions = torch.arange(xq.shape[0], device=xq.device, dtype=torch.int64)
    apply_rope_with_cos_sin_cache_inplace(positions, xq, xk, xq.shape[-1], cache, is_neox=False)
    return xq, xk


@functools.cache
def availability() -> tuple[bool, str]:
    """(runs here, why not): installed, a CUDA device, and a tiny call that matches float64."""
    return installed_cuda_peer("flashinfer", PACKAGE, PINNED_VERSION, flashinfer_rope, why="CUDA only")


def source() -> tuple[str, str]:
    """(version, sha256 of flashinfer/rope.py) of the installed package."""
    import flashinfer.rope

    return installed_version(PACKAGE) or "", sha256_file(Path(flashinfer.rope.__file__))
