"""QuACK's rotary (``quack.rotary.apply_rotary_emb_qkv_``, CuTe DSL), in place on packed qkv.

Used only where ``quack-kernels`` (and its ``nvidia-cutlass-dsl``) is installed and
runs on this device; otherwise absent, with the reason in ``peer_status``.
Interleaved pairs, q and k of a (batch, T, 3, H, D) qkv in one call. QuACK wants
cos/sin with a unit last stride, so the strided views of freqs_cis are copied
first (2 of the 3 launches).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.peers.cache import installed_cuda_peer, installed_version, sha256_file
from rope_kernels.peers.vllm import packed_qkv_of

PACKAGE = "quack-kernels"
PINNED_VERSION = "0.6.5"


def quack_packed(qkv, freqs_cis, cos, sin):
    """Rotate the packed (T, 3, H, D) qkv in place; returns its q, k, v."""
    from quack.rotary import apply_rotary_emb_qkv_

    apply_rotary_emb_qkv_(qkv.unsqueeze(0), cos.contiguous(), sin.contiguous(), interleaved=True)
    return qkv.unbind(1)


def quack_rope(xq: torch.Tensor, xk: torch.Tensor,
               freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """QuACK on the packed qkv that xq/xk slice; returns xq, xk rotated in place."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    quack_packed(packed_qkv_of(xq, xk, "quack"), freqs_cis, *cos_sin_views(freqs_cis))
    return xq, xk


@functools.cache
def availability() -> tuple[bool, str]:
    """(runs here, why not): installed, a CUDA device, and a tiny call that matches float64."""
    return installed_cuda_peer("quack", PACKAGE, PINNED_VERSION, quack_rope, why="CUDA only, CuTe DSL")


def source() -> tuple[str, str]:
    """(version, sha256 of quack/rotary.py) of the installed package."""
    import quack.rotary

    return installed_version(PACKAGE) or "", sha256_file(Path(quack.rotary.__file__))
