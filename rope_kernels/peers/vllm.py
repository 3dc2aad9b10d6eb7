"""vLLM 0.34.0's own RoPE code for the Kimi-K2.5 vision tower, run from vLLM's files.

- ``packed_qk_rope_`` (``rotary_embedding/packed_qk_rope.py``, byte-identical to
  0.33.0's): what vLLM 0.34.0's ``kimi_k25_vit.py`` runs: one in-place Triton launch
  on the contiguous packed (T, 3, H, D) qkv.
- flash-attention's ``apply_rotary_emb_qkv_`` as vLLM bundles it
  (``vllm_flash_attn/layers/rotary.py`` over ``ops/triton/rotary.py``), in place on
  the packed qkv with ``interleaved=True``: one launch for q and k (the contiguous
  qkv's q|k heads viewed as one tensor). Its kernel asserts cos/sin in x's dtype, so
  on bf16 data cos and sin are bf16 (built once per freqs_cis, as an engine builds
  them once per forward): that rounding is the peer's own, and the float64 rule
  judges it as it is.
- The path PR #50400 merged (and 0.33.0/0.34.0 keep as the no-Triton fallback):
  ``freqs_cis.real/.imag`` copied into contiguous fp32 cos/sin, then for q and for k
  ``ApplyRotaryEmb(is_neox_style=False, enable_fp32_compute=True)``, whose CUDA path
  upcasts x to fp32, calls the flash-attention Triton ``apply_rotary`` vLLM bundles
  (``vllm_flash_attn/ops/triton/rotary.py``, interleaved, out of place) and casts
  back. The kernel is vLLM's file; the few lines of glue around it follow vLLM's
  ``ApplyRotaryEmb._pre_process`` / ``forward_cuda`` / ``_post_process`` (we cannot
  import ``common.py`` without the whole of vLLM), calling ``apply_rotary`` directly
  instead of through the autograd wrapper in ``vllm_flash_attn/layers/rotary.py``,
  which passes the same arguments.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

from rope_kernels.kernels.checks import (check_freqs_cis, check_qk, check_rotation,
                                         check_triton_device,
                                         check_writes_do_not_overlap_reads, packed_qkv_of)
from rope_kernels.kernels.switches import triton_interpreter_enabled
from rope_kernels.peers.cache import (SourceFile, find_source, installed_version, load_module,
                                      loaded_peer_spec)
from rope_kernels.peers.prepared import prepared_per_freqs

PACKED_QK_FILE = "vllm/model_executor/layers/rotary_embedding/packed_qk_rope.py"
ROTARY_FILE = "vllm/vllm_flash_attn/ops/triton/rotary.py"
ROTARY_LAYERS_FILE = "vllm/vllm_flash_attn/layers/rotary.py"


def _triton_utils_shim() -> dict[str, types.ModuleType]:
    """``from vllm.triton_utils import tl, triton`` is all packed_qk_rope.py needs from vLLM."""
    if installed_version("vllm") is not None:
        return {}  # the real vllm.triton_utils is importable
    import triton
    import triton.language as tl

    vllm = types.ModuleType("vllm")
    utils = types.ModuleType("vllm.triton_utils")
    utils.triton, utils.tl = triton, tl
    vllm.triton_utils = utils
    vllm.__path__ = []  # a package, so the submodule import resolves
    return {"vllm": vllm, "vllm.triton_utils": utils}


@functools.cache
def packed_qk_source() -> tuple[SourceFile, types.ModuleType]:
    src = find_source("vllm", PACKED_QK_FILE)
    return src, load_module(src, shims=_triton_utils_shim())


class _TorchOnCpu(types.ModuleType):
    """``torch`` for rotary.py under the CPU interpreter: its launcher enters
    ``torch.cuda.device(x.device.index)``, which a CPU tensor's index (None) breaks."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(device=lambda index: contextlib.nullcontext())

    def __getattr__(self, name):
        return getattr(torch, name)


@functools.cache
def rotary_source() -> tuple[SourceFile, types.ModuleType]:
    src = find_source("vllm", ROTARY_FILE)
    module = load_module(src)
    if src.origin == "cache" and triton_interpreter_enabled():
        module.torch = _TorchOnCpu()  # only our private copy; the kernel is untouched
    return src, module


def _check_freqs_contiguous(freqs_cis: torch.Tensor) -> None:
    if not freqs_cis.is_contiguous():
        raise ValueError("vllm_packed_qk needs a contiguous freqs_cis (vLLM asserts it)")


def vllm_packed_qk_rope(xq: torch.Tensor, xk: torch.Tensor,
                        freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``packed_qk_rope_`` on the qkv that xq/xk slice; returns xq, xk rotated."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    _check_freqs_contiguous(freqs_cis)
    qkv = packed_qkv_of(xq, xk)
    check_writes_do_not_overlap_reads((("xq", xq), ("xk", xk)), (("freqs_cis", freqs_cis),))
    check_triton_device(xq, "vllm_packed_qk")
    packed_qk_source()[1].packed_qk_rope_(qkv, freqs_cis)
    return xq, xk


def vllm_packed_qk_packed(qkv, freqs_cis, cos, sin):
    """As ``kimi_k25_vit.py`` calls it: rotate the packed qkv in place, then unbind."""
    packed_qk_source()[1].packed_qk_rope_(qkv, freqs_cis)
    return qkv.unbind(1)


def _interleaved(rotation: str) -> bool:
    """flash-attention's ``interleaved`` flag for a rotation (vLLM's ``not is_neox_style``):
    True for "pairs" (Kimi), False for "half" (rotate-half, NeoX: Qwen's towers)."""
    return check_rotation(rotation) == "pairs"


def _apply_rotary_emb_fp32(apply_rotary, x: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, rotation: str = "pairs") -> torch.Tensor:
    """``ApplyRotaryEmb(is_neox_style=rotation == "half", enable_fp32_compute=True)
    .forward_cuda(x, cos, sin)``."""
    dtype = x.dtype
    out = apply_rotary(x.unsqueeze(0).float(), cos.float(), sin.float(),
                       interleaved=_interleaved(rotation))
    return out.squeeze(0).to(dtype)


def vllm_merged_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor,
                     rotation: str = "pairs") -> tuple[torch.Tensor, torch.Tensor]:
    """The merged PR #50400 path with vLLM's bundled flash-attention rotary kernel."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    check_rotation(rotation)
    check_triton_device(xq, "vllm_merged")
    apply_rotary = rotary_source()[1].apply_rotary
    cos = freqs_cis.real.contiguous()
    sin = freqs_cis.imag.contiguous()
    return (_apply_rotary_emb_fp32(apply_rotary, xq, cos, sin, rotation),
            _apply_rotary_emb_fp32(apply_rotary, xk, cos, sin, rotation))


def _einops_shim() -> dict[str, types.ModuleType]:
    """layers/rotary.py imports ``einops.rearrange``/``repeat``; only its backward and
    its non-qkv helpers use them. Where einops is absent (the CPU tier) a stand-in
    that refuses to be called takes its place while the file loads."""
    import importlib.util

    if importlib.util.find_spec("einops") is not None:
        return {}

    def unused(*args, **kwargs):
        raise NotImplementedError("einops is not installed: only apply_rotary_emb_qkv_'s "
                                  "forward runs here")

    einops = types.ModuleType("einops")
    einops.rearrange = einops.repeat = unused
    return {"einops": einops}


@functools.cache
def rotary_qkv_source() -> tuple[SourceFile, types.ModuleType]:
    """``vllm_flash_attn/layers/rotary.py``; its ``from ..ops.triton.rotary import
    apply_rotary`` resolves to the verified ops file loaded by ``rotary_source``
    (the same private package, already in sys.modules)."""
    _ops_src, ops = rotary_source()
    src = find_source("vllm", ROTARY_LAYERS_FILE)
    # ops.__name__: rope_kernels._peer.vllm_<ver>.vllm.vllm_flash_attn.ops.triton.rotary,
    # what the relative import resolves to from this file's private name
    return src, load_module(src, shims={**_einops_shim(), ops.__name__: ops})


def _cos_sin_in(dtype: torch.dtype):
    def build(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return freqs_cis.real.to(dtype).contiguous(), freqs_cis.imag.to(dtype).contiguous()
    return build


def vllm_rotary_qkv_packed(qkv, freqs_cis, cos=None, sin=None, rotation: str = "pairs"):
    """``apply_rotary_emb_qkv_(qkv[None], cos, sin, interleaved=rotation == "pairs")`` in
    place on the packed (T, 3, H, D) qkv, cos/sin in qkv's dtype; returns its q, k, v views."""
    module = rotary_qkv_source()[1]
    cos_x, sin_x = prepared_per_freqs(freqs_cis, f"vllm_rotary_qkv/{qkv.dtype}",
                                      _cos_sin_in(qkv.dtype))
    with torch.no_grad():  # inference: the autograd Function records nothing
        module.apply_rotary_emb_qkv_(qkv.unsqueeze(0), cos_x, sin_x,
                                     interleaved=_interleaved(rotation))
    return qkv.unbind(1)


def vllm_rotary_qkv_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor,
                         rotation: str = "pairs") -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attention's ``apply_rotary_emb_qkv_`` (vLLM's copy) on the contiguous
    packed qkv that xq/xk slice; returns xq, xk rotated in place."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    qkv = packed_qkv_of(xq, xk, "vllm_rotary_qkv")
    if qkv.shape[-1] > 256:
        raise ValueError(f"vllm_rotary_qkv supports head_dim <= 256 (flash-attention's "
                         f"rotary asserts it), got {qkv.shape[-1]}")
    check_rotation(rotation)
    check_triton_device(xq, "vllm_rotary_qkv")
    vllm_rotary_qkv_packed(qkv, freqs_cis, rotation=rotation)
    return xq, xk


def rope_variant(name: str) -> dict:
    """The registry's spec of vLLM variant ``name`` (the catalogue's ``module`` contract:
    ``variants``); raises when vLLM's file does not load here (the peer is then absent)."""
    return loaded_peer_spec(name, {
        "vllm_packed_qk": (packed_qk_source, dict(
            fn=vllm_packed_qk_rope, launches=1, launches_fp32=1,
            description="vLLM 0.34.0 packed_qk_rope_: one in-place Triton launch on the packed qkv",
            packed_fn=vllm_packed_qk_packed, packed_only=True,
            triton_kernels=("_packed_qk_rope_kernel",))),
        "vllm_rotary_qkv": (rotary_qkv_source, dict(
            fn=vllm_rotary_qkv_rope, launches=1, launches_fp32=1,
            description="vLLM 0.34.0's bundled flash-attention apply_rotary_emb_qkv_(interleaved=True): "
                        "one Triton launch in place on the packed qkv's q|k heads; cos/sin in the data's "
                        "dtype (its kernel requires it: bf16 on bf16 data), built once per freqs_cis",
            packed_fn=vllm_rotary_qkv_packed, packed_only=True, triton_kernels=("rotary_kernel",),
            rotations=("pairs", "half"), table_in_data_dtype=True)),
        "vllm_merged": (rotary_source, dict(
            fn=vllm_merged_rope, launches=8, launches_fp32=4,
            description="the path PR #50400 merged, with vLLM's bundled flash-attention rotary kernel: "
                        "cos/sin copies, then upcast, rotary, cast back, per tensor "
                        "(rotate-half: ApplyRotaryEmb(is_neox_style=True), interleaved=False)",
            triton_kernels=("rotary_kernel",), rotations=("pairs", "half"))),
    })
