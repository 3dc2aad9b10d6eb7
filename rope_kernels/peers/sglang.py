"""SGLang 0.5.23's fused vision q/k RoPE, run from SGLang's ``vision_rope.py``.

The entry point is ``apply_fused_qk_complex_rope(q, k, freqs_cis)``: one Triton
launch, one rotation pair per lane, strided q/k views of the packed qkv in,
contiguous q/k out. SGLang's Kimi-K3-VL vision tower calls it
(``sglang/srt/models/kimi_k3_vl.py``). Its Kimi-K2.5 tower instead calls
``apply_fused_qk_complex_rope_inplace``, which runs a CUDA kernel SGLang compiles
at run time (``sglang.kernels.ops.attention.rope``, needs the whole sglang package):
not run here, see ``peer_status``.

SGLang gates the kernel with ``can_use_fused_qk_complex_rope``: CUDA, compute
capability 9.0 or newer, bf16/fp16 q/k, complex64 freqs. Other dtypes are
unsupported (recorded as such). On the CPU under Triton's interpreter, where that
gate says no because the device is not CUDA, our private copy of the module gets a
gate with the same dtype rules so the CPU tier runs SGLang's kernel.
"""

from __future__ import annotations

import functools
import types

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_triton_device
from rope_kernels.kernels.switches import triton_interpreter_enabled
from rope_kernels.peers.cache import SourceFile, find_source, load_module, loaded_peer_spec

VISION_ROPE_FILE = "sglang/kernels/ops/attention/vision_rope.py"
DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def vision_rope_source() -> tuple[SourceFile, types.ModuleType]:
    src = find_source("sglang", VISION_ROPE_FILE)
    module = load_module(src)
    if src.origin == "cache" and triton_interpreter_enabled():
        sglang_gate = module.can_use_fused_qk_complex_rope

        def gate(*, dtype, device, freqs_cis):
            if device.type == "cpu":
                return dtype in DTYPES and freqs_cis.dtype == torch.complex64
            return sglang_gate(dtype=dtype, device=device, freqs_cis=freqs_cis)

        module.can_use_fused_qk_complex_rope = gate
    return src, module


def sglang_vision_rope(xq: torch.Tensor, xk: torch.Tensor,
                       freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's ``apply_fused_qk_complex_rope``: new contiguous q and k."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    if xq.dtype not in DTYPES:
        raise TypeError(f"sglang_vision supports bfloat16 and float16 only (SGLang's "
                        f"can_use_fused_qk_complex_rope), got {xq.dtype}")
    check_triton_device(xq, "sglang_vision")
    return vision_rope_source()[1].apply_fused_qk_complex_rope(xq, xk, freqs_cis)


def rope_variant(name: str) -> dict:
    """The registry's spec of ``sglang_vision`` (the catalogue's ``module`` contract:
    ``variants``); raises when SGLang's file does not load here (the peer is then absent)."""
    return loaded_peer_spec(name, {"sglang_vision": (vision_rope_source, dict(
        fn=sglang_vision_rope, launches=1, launches_fp32=1,
        description="SGLang 0.5.23 apply_fused_qk_complex_rope: one Triton launch, a rotation pair "
                    "per lane, contiguous q/k out", dtypes=DTYPES,
        triton_kernels=("_fused_qk_complex_rope_kernel",)))})
