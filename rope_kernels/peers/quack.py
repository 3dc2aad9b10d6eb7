"""QuACK 0.6.5's rotary (``quack/rotary.py``, CuTe DSL), run from the installed package.

- ``quack_qkv``: ``apply_rotary_emb_qkv_(qkv.view(1, T, 3, H, D), cos, sin,
  interleaved=True)``, in place on the packed qkv, q and k in one launch, under
  ``torch.no_grad()`` (QuACK's inference fast path: no autograd Function).
- ``quack_rotary``: QuACK's out-of-place ``apply_rotary(x, cos, sin,
  interleaved=True)`` on the (1, T, 2H, D) q|k view of the packed qkv: one launch
  reads q and k and writes both into one new buffer (q and k are returned as its
  halves), the like-for-like row beside our out-of-place ``fused``.

Both take fp32 cos and sin of shape (T, D/2) with a unit last stride: the real and
imaginary parts of freqs_cis, copied once per freqs_cis (``prepared_per_freqs``), as
an engine builds them once per forward. Used where ``quack-kernels`` (with
``nvidia-cutlass-dsl``) is installed and runs on this device (on an air-gapped GPU
node: ``tools/device_setup.sh``); otherwise absent, with the reason in ``peer_status``.
The first call per shape family compiles (seconds).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_rotation, packed_qkv_of
from rope_kernels.peers.cache import installed_cuda_peer, installed_version, sha256_file
from rope_kernels.peers.prepared import prepared_per_freqs

PACKAGE = "quack-kernels"
PINNED_VERSION = "0.6.5"


def _cos_sin(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return freqs_cis.real.contiguous(), freqs_cis.imag.contiguous()


def quack_qkv_packed(qkv, freqs_cis, cos=None, sin=None, rotation: str = "pairs"):
    """Rotate the packed (T, 3, H, D) qkv in place; returns its q, k, v. QuACK's
    ``interleaved`` is the rotation: True for "pairs", False for "half" (rotate-half)."""
    from quack.rotary import apply_rotary_emb_qkv_

    cos, sin = prepared_per_freqs(freqs_cis, "quack", _cos_sin)
    with torch.no_grad():
        apply_rotary_emb_qkv_(qkv.unsqueeze(0), cos, sin,
                              interleaved=check_rotation(rotation) == "pairs")
    return qkv.unbind(1)


def quack_qkv_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor,
                   rotation: str = "pairs") -> tuple[torch.Tensor, torch.Tensor]:
    """QuACK on the packed qkv that xq/xk slice; returns xq, xk rotated in place."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    quack_qkv_packed(packed_qkv_of(xq, xk, "quack_qkv"), freqs_cis, rotation=rotation)
    return xq, xk


def quack_rotary_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor,
                      rotation: str = "pairs") -> tuple[torch.Tensor, torch.Tensor]:
    """QuACK's out-of-place ``apply_rotary`` on the q|k view of the packed qkv that
    xq/xk slice: one launch; returns new q and k (halves of one (T, 2H, D) buffer)."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    qkv = packed_qkv_of(xq, xk, "quack_rotary")
    from quack.rotary import apply_rotary

    tokens, _, heads, head_dim = qkv.shape
    qk = qkv[:, :2].reshape(1, tokens, 2 * heads, head_dim)  # a view: (3HD, D, 1) strides
    cos, sin = prepared_per_freqs(freqs_cis, "quack", _cos_sin)
    out = apply_rotary(qk, cos, sin, interleaved=check_rotation(rotation) == "pairs")[0]
    return out[:, :heads], out[:, heads:]


def source() -> tuple[str, str]:
    """(version, sha256 of quack/rotary.py) of the installed package."""
    import quack.rotary

    return installed_version(PACKAGE) or "", sha256_file(Path(quack.rotary.__file__))


@functools.cache
def availability(name: str = "quack_qkv") -> tuple[bool, str]:
    """(runs here, why not) for ``quack_qkv`` or ``quack_rotary``: installed, a CUDA
    device, and a tiny call that matches float64."""
    fn, inplace = {"quack_qkv": (quack_qkv_rope, True),
                   "quack_rotary": (quack_rotary_rope, False)}[name]
    return installed_cuda_peer("quack", PACKAGE, PINNED_VERSION, fn,
                               why="CUDA only, CuTe DSL", inplace=inplace)


def rope_variant(name: str) -> dict:
    """The registry's spec of ``quack_qkv`` or ``quack_rotary`` (the catalogue's ``module``
    contract: ``variants``): here only where ``availability(name)`` says it runs."""
    if name == "quack_qkv":
        fields = dict(fn=quack_qkv_rope, packed_fn=quack_qkv_packed,
                      description="QuACK apply_rotary_emb_qkv_ (CuTe DSL, interleaved) in place on the "
                                  "packed qkv under no_grad: one launch; contiguous fp32 cos/sin built "
                                  "once per freqs_cis")
    elif name == "quack_rotary":
        fields = dict(fn=quack_rotary_rope,
                      description="QuACK apply_rotary (CuTe DSL, interleaved) out of place on the q|k "
                                  "view of the packed qkv: one launch, new q and k; contiguous fp32 "
                                  "cos/sin built once per freqs_cis")
    else:
        raise ValueError(f"rope_kernels.peers.quack builds quack_qkv and quack_rotary, not {name!r}")
    return {"package": PACKAGE, "available": functools.partial(availability, name),
            "source": lambda: (*source(), "installed"), "launches": 1, "launches_fp32": 1,
            "packed_only": True, "rotations": ("pairs", "half"), **fields}
