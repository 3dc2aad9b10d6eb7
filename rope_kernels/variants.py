"""Every RoPE implementation the study compares, behind one registry.

``VARIANTS[name](xq, xk, freqs_cis) -> (q, k)``: all compute the same function
(Kimi's interleaved rotation, outputs in the input dtype), and
``VARIANTS[name].packed(qkv, freqs_cis, cos, sin) -> (q, k, v)`` is how the encoder
calls it on a layer's packed (T, 3, H, D) qkv (in-place peers rotate the packed
buffer and return its views). Beside each: the kernel launches one call makes
(derived from its code, checked by ``count_launches`` on the CPU and the profiler on
a GPU), the dtypes and layouts it supports, and for other people's code the package,
version and sha256 of the file it runs (empty for this project's own variants).

Peers run from their own packages: vLLM 0.34.0, SGLang 0.5.23 and tokenspeed-kernel
0.1.4 files from the installed engine or the pinned cache (``python -m rope_kernels
peers fetch``);
SGLang's Kimi-K2.5 CUDA path and FlashInfer 0.7.4 from pinned trees of their wheels
in the same cache, JIT-compiled through tvm-ffi on a CUDA device; QuACK where it is
installed (an air-gapped GPU node: ``tools/device_setup.sh``); Liger and
torch.compile from their packages. ``version``/``sha256`` of a pinned tree is its
digest over every file (``peers.cache.tree_digest``). A peer that cannot run here is absent, never a
stub; ``peer_status()`` says which ran and why the others did not.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk
from rope_kernels.kernels.fused import DEFAULT_TRITON_KERNEL, fused_qk_rope
from rope_kernels.kernels.fused import planned_call
from rope_kernels.kernels.reference import cos_sin_views, native_rope
from rope_kernels.kernels.vllm_merged_recreated import vllm_merged_recreated_rope
from rope_kernels.peers.baselines import compiled_rope, liger_available, liger_rope
from rope_kernels.peers.cache import sha256_file
from rope_kernels.vocabulary import (  # noqa: F401
    IN_PLACE_VARIANTS,
    KNOWN_VARIANTS,
    OWN_VARIANTS,
    PEER_VARIANTS,
)

RopeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
PackedFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Variant:
    """A named RoPE implementation, how to call it, and what one call launches."""

    name: str
    fn: RopeFn
    launches: int  # kernel launches per call on bf16/fp16 data
    launches_fp32: int  # ... on fp32 data (no casts needed)
    description: str
    inplace: bool = False  # True: rotates and returns the caller's xq/xk
    packed_fn: PackedFn | None = None  # (qkv, freqs_cis, cos, sin) -> (q, k, v); None: unbind + fn
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    packed_only: bool = False  # needs q/k as the slices of one contiguous (T, 3, H, D) qkv
    # (head_dim, dtype) -> (rotates it correctly, why not); None: every even head_dim
    head_dim_rule: Callable[[int, torch.dtype], tuple[bool, str]] | None = None
    triton_kernels: tuple[str, ...] = ()  # names of the Triton kernels it launches
    peer_package: str = ""
    peer_version: str = ""
    peer_sha256: str = ""  # of the source file it runs ("+"-joined for several)

    def __call__(self, xq, xk, freqs_cis):
        return self.fn(xq, xk, freqs_cis)

    def packed(self, qkv: torch.Tensor, freqs_cis: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RoPE on a layer's packed qkv, as an engine calls it; cos/sin are freqs_cis's views."""
        if self.packed_fn is not None:
            return self.packed_fn(qkv, freqs_cis, cos, sin)
        q, k, v = qkv.unbind(1)
        q, k = self.fn(q, k, freqs_cis)
        return q, k, v

    def launch_count(self, dtype: torch.dtype) -> int:
        return self.launches_fp32 if dtype == torch.float32 else self.launches

    def unsupported(self, dtype: torch.dtype, *, packed: bool = True,
                    head_dim: int | None = None) -> str:
        """Why this variant cannot take these inputs ("" when it can); ``head_dim``
        (None: not asked) is checked against ``head_dim_rule``."""
        if dtype not in self.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"{self.name} supports {names} only"
        if self.packed_only and not packed:
            return f"{self.name} needs q/k as slices of a contiguous packed (T, 3, H, D) qkv"
        if head_dim is not None and self.head_dim_rule is not None:
            ok, why = self.head_dim_rule(head_dim, dtype)
            if not ok:
                return why or f"{self.name} does not support head_dim {head_dim}"
        return ""

    @property
    def peer_columns(self) -> dict[str, str]:
        """The provenance columns every result row carries."""
        return {"peer_package": self.peer_package, "peer_version": self.peer_version,
                "peer_sha256": self.peer_sha256}


def fused_rope(xq, xk, freqs_cis, *, inplace: bool = False):
    """The fused kernel reading cos/sin straight out of freqs_cis (no copy).

    On a layout ``fused_qk_rope`` has checked before, the call goes its planned way, whose
    key covers every check made here (cos's shape is freqs_cis's, its dtype fp32 only from
    a complex64, its device). The views are made per call: a table of them would hold every
    freqs_cis alive (a view keeps its base)."""
    if type(freqs_cis) is torch.Tensor and freqs_cis.dtype is torch.complex64:
        cos, sin = cos_sin_views(freqs_cis)
        done = planned_call(xq, xk, cos, sin, inplace)
        if done is not None:
            return done
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    cos, sin = cos_sin_views(freqs_cis)
    return fused_qk_rope(xq, xk, cos, sin, inplace=inplace)


def fused_rope_inplace(xq, xk, freqs_cis):
    """The fused kernel writing into xq/xk (e.g. into the packed qkv buffer)."""
    return fused_rope(xq, xk, freqs_cis, inplace=True)


def _fused_packed(qkv, freqs_cis, cos, sin, *, inplace: bool = False):
    q, k, v = qkv.unbind(1)
    q, k = fused_qk_rope(q, k, cos, sin, inplace=inplace)
    return q, k, v


def _fused_inplace_packed(qkv, freqs_cis, cos, sin):
    return _fused_packed(qkv, freqs_cis, cos, sin, inplace=True)


# -- peers -------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerStatus:
    name: str
    available: bool
    reason: str  # why it is absent ("" when it ran)
    package: str
    version: str
    sha256: str
    origin: str  # installed, cache, or ""


def _engine_peers(status: list[PeerStatus]) -> list[Variant]:
    """vLLM and SGLang from their files (installed or cached), when those check out."""
    from rope_kernels.peers import sglang, tokenspeed, vllm

    specs = [
        (vllm.packed_qk_source, Variant(
            "vllm_packed_qk", vllm.vllm_packed_qk_rope, 1, 1,
            "vLLM 0.34.0 packed_qk_rope_: one in-place Triton launch on the packed qkv",
            inplace=True, packed_fn=vllm.vllm_packed_qk_packed, packed_only=True,
            triton_kernels=("_packed_qk_rope_kernel",))),
        (vllm.rotary_qkv_source, Variant(
            "vllm_rotary_qkv", vllm.vllm_rotary_qkv_rope, 1, 1,
            "vLLM 0.34.0's bundled flash-attention apply_rotary_emb_qkv_(interleaved=True): "
            "one Triton launch in place on the packed qkv's q|k heads; cos/sin in the data's "
            "dtype (its kernel requires it: bf16 on bf16 data), built once per freqs_cis",
            inplace=True, packed_fn=vllm.vllm_rotary_qkv_packed, packed_only=True,
            triton_kernels=("rotary_kernel",))),
        (tokenspeed.qkv_rotary_source, Variant(
            "tokenspeed_qkv", tokenspeed.tokenspeed_qkv_rope, 1, 1,
            "tokenspeed-kernel 0.1.4 packed_qkv_complex_rotary: one Triton launch (16 tokens "
            "x one head a program) from the packed qkv and complex freqs_cis, contiguous q/k "
            "out; run on stock Triton (its _triton indirection pointed at triton)",
            packed_fn=tokenspeed.tokenspeed_qkv_packed, packed_only=True,
            triton_kernels=("_packed_qkv_complex_rotary_kernel",))),
        (vllm.rotary_source, Variant(
            "vllm_merged", vllm.vllm_merged_rope, 8, 4,
            "the path PR #50400 merged, with vLLM's bundled flash-attention rotary kernel: "
            "cos/sin copies, then upcast, rotary, cast back, per tensor",
            triton_kernels=("rotary_kernel",))),
        (sglang.vision_rope_source, Variant(
            "sglang_vision", sglang.sglang_vision_rope, 1, 1,
            "SGLang 0.5.23 apply_fused_qk_complex_rope: one Triton launch, a rotation pair "
            "per lane, contiguous q/k out", dtypes=sglang.DTYPES,
            triton_kernels=("_fused_qk_complex_rope_kernel",))),
    ]
    out = []
    for load, variant in specs:
        try:
            src, _module = load()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load is absent, with why
            status.append(PeerStatus(variant.name, False, f"{type(exc).__name__}: {exc}",
                                     "", "", "", ""))
            continue
        status.append(PeerStatus(variant.name, True, "", src.package, src.version, src.sha256,
                                 src.origin))
        out.append(replace(variant, peer_package=src.package, peer_version=src.version,
                           peer_sha256=src.sha256))
    return out


def _optional_peers(status: list[PeerStatus]) -> list[Variant]:
    """The CUDA-only peers: SGLang's Kimi-K2.5 path and FlashInfer (JIT-compiled from
    their pinned files through tvm-ffi), QuACK (CuTe DSL, installed). Each is here
    only where it loads, finds a CUDA device and passes a tiny float64 check."""
    from rope_kernels.peers import flashinfer, quack, sglang_kimi_k25

    def tree_source(mod):
        version, sha, origin, _module = mod.source()
        return version, sha, origin

    def quack_source():
        return (*quack.source(), "installed")

    specs = [
        ("sglang_kimi_k25", sglang_kimi_k25.PACKAGE, sglang_kimi_k25.availability,
         lambda: tree_source(sglang_kimi_k25), dict(
            fn=sglang_kimi_k25.sglang_kimi_k25_rope, launches=4, launches_fp32=4,
            packed_fn=sglang_kimi_k25.sglang_kimi_k25_packed, packed_only=True,
            dtypes=sglang_kimi_k25.DTYPES,
            description="SGLang 0.5.23's Kimi-K2.5 tower: VisionAttention's contiguous copies "
                        "of q, k and v (timed: the path makes them), then "
                        "apply_fused_qk_complex_rope_inplace, SGLang's JIT CUDA kernel "
                        "(rope.cuh through tvm-ffi) rotating the copies in place; cos|sin "
                        "cache prepared once per freqs_cis")),
        ("flashinfer", flashinfer.PACKAGE, flashinfer.availability,
         lambda: tree_source(flashinfer), dict(
            fn=flashinfer.flashinfer_rope, launches=1, launches_fp32=1, inplace=True,
            dtypes=flashinfer.DTYPES, head_dim_rule=flashinfer.supported_head_dim,
            description="FlashInfer apply_rope_with_cos_sin_cache_inplace (interleaved, JIT "
                        "CUDA through tvm-ffi): one launch for q and k in place; cos|sin cache "
                        "and positions built once per freqs_cis")),
        ("quack_qkv", quack.PACKAGE, functools.partial(quack.availability, "quack_qkv"),
         quack_source, dict(
            fn=quack.quack_qkv_rope, launches=1, launches_fp32=1, inplace=True, packed_only=True,
            packed_fn=quack.quack_qkv_packed,
            description="QuACK apply_rotary_emb_qkv_ (CuTe DSL, interleaved) in place on the "
                        "packed qkv under no_grad: one launch; contiguous fp32 cos/sin built "
                        "once per freqs_cis")),
        ("quack_rotary", quack.PACKAGE, functools.partial(quack.availability, "quack_rotary"),
         quack_source, dict(
            fn=quack.quack_rotary_rope, launches=1, launches_fp32=1, packed_only=True,
            description="QuACK apply_rotary (CuTe DSL, interleaved) out of place on the q|k "
                        "view of the packed qkv: one launch, new q and k; contiguous fp32 "
                        "cos/sin built once per freqs_cis")),
    ]
    out = []
    for name, package, available, where, variant_kwargs in specs:
        ok, reason = available()
        if not ok:
            status.append(PeerStatus(name, False, reason, package, "", "", ""))
            continue
        version, sha, origin = where()
        status.append(PeerStatus(name, True, "", package, version, sha, origin))
        out.append(Variant(name, peer_package=package, peer_version=version,
                           peer_sha256=sha, **variant_kwargs))
    return out


# TransformerEngine 2.20.2's interleaved fused RoPE (apply_rotary_pos_emb(...,
# interleaved=True, fused=True)) has no route onto the study's devices: recorded, not run.
TRANSFORMER_ENGINE_ABSENT = (
    "not run: transformer-engine 2.20.2's PyTorch binding (transformer-engine-torch) is "
    "source-only on the index (a CUDA build against the node's torch), and the prebuilt "
    "transformer-engine-cu12 wheel that exports its C API (nvte_fused_rope_forward) is about "
    "729 MB, more than eleven times one device call's 64 MiB carry; no GPU node here has it "
    "installed")


def _catalogued_peers(status: list[PeerStatus], built: set[str]) -> list[Variant]:
    """Peers the catalogue names with a ``module`` (and this file does not build itself):
    that module's ``rope_variant(name)`` returns a dict of ``package`` (str),
    ``available`` (() -> (runs here, why not)), ``source`` (() -> (version, sha256,
    origin)) and the ``Variant`` fields (``fn``, ``launches``, ``launches_fp32``, ...;
    ``inplace`` and ``description`` default to the catalogue's). Adding such a peer
    touches its module and the catalogue only."""
    import importlib

    from rope_kernels.catalogue import CATALOGUE

    out = []
    for entry in CATALOGUE.values():
        if not entry.module or entry.name in built or "rope" not in entry.kinds:
            continue
        try:
            spec = dict(importlib.import_module(entry.module).rope_variant(entry.name))
            package, available, where = spec.pop("package"), spec.pop("available"), spec.pop("source")
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load is absent, with why
            status.append(PeerStatus(entry.name, False, f"{type(exc).__name__}: {exc}", "", "", "", ""))
            continue
        ok, reason = available()
        if not ok:
            status.append(PeerStatus(entry.name, False, reason, package, "", "", ""))
            continue
        version, sha, origin = where()
        status.append(PeerStatus(entry.name, True, "", package, version, sha, origin))
        spec.setdefault("inplace", entry.inplace)
        spec.setdefault("description", entry.description)
        out.append(Variant(entry.name, peer_package=package, peer_version=version,
                           peer_sha256=sha, **spec))
    return out


def _liger_columns() -> dict[str, str]:
    import liger_kernel.ops.llama4_rope as llama4_rope

    return {"peer_package": "liger-kernel",
            "peer_version": importlib.metadata.version("liger-kernel"),
            "peer_sha256": sha256_file(Path(llama4_rope.__file__))}


def _build() -> tuple[dict[str, Variant], list[PeerStatus]]:
    status: list[PeerStatus] = []
    variants = [
        Variant("native", native_rope, 6, 2,
                "Kimi's pre-PR path: fp32 upcast, complex multiply, cast back (per tensor)"),
        Variant("fused", fused_rope, 1, 1,
                "one Triton launch for q and k, cos/sin read from freqs_cis, out of place",
                packed_fn=_fused_packed, triton_kernels=(DEFAULT_TRITON_KERNEL,)),
        Variant("fused_inplace", fused_rope_inplace, 1, 1,
                "the fused kernel writing into xq/xk", inplace=True,
                packed_fn=_fused_inplace_packed, triton_kernels=(DEFAULT_TRITON_KERNEL,)),
        *_engine_peers(status),
        Variant("vllm_merged_recreated", vllm_merged_recreated_rope, 8, 4,
                "this project's re-creation of the merged PR path (its own rotary kernel "
                "in flash-attention's style; a CPU-test stand-in, not vLLM's code)",
                triton_kernels=("_rotary_interleaved_kernel",)),
        Variant("compiled", compiled_rope, 1, 1,
                "torch.compile (Inductor, static shapes) of the real cos/sin form",
                peer_package="torch", peer_version=torch.__version__),
    ]
    if liger_available():
        variants.append(Variant("liger", liger_rope, 3, 3,
                                "Liger-Kernel llama4_rope, in place on copies of q and k",
                                **_liger_columns()))
        status.append(PeerStatus("liger", True, "", "liger-kernel",
                                 variants[-1].peer_version, variants[-1].peer_sha256, "installed"))
    else:
        status.append(PeerStatus("liger", False, "liger-kernel not installed",
                                 "liger-kernel", "", "", ""))
    status.append(PeerStatus("compiled", True, "", "torch", torch.__version__, "", "installed"))
    variants += _optional_peers(status)
    status.append(PeerStatus("transformer_engine", False, TRANSFORMER_ENGINE_ABSENT,
                             "transformer-engine", "2.20.2", "", ""))
    variants += _catalogued_peers(status, {v.name for v in variants} | {s.name for s in status})
    return {v.name: v for v in variants}, status


# Every name the registry can hold, present here or not, is ``KNOWN_VARIANTS``
# (vocabulary.py from catalogue.py, importable without torch): parameters are checked against it
# before anything runs, and tests parametrize over it (an absent peer skips, with why).
_REGISTRY: tuple[dict[str, Variant], list[PeerStatus]] | None = None


def registry() -> dict[str, Variant]:
    """name -> Variant of every implementation that runs here, built on first use
    (it loads the peers: the engines' pinned files, Liger, installed CUDA peers)
    and cached for the process."""
    return _built()[0]


def _built() -> tuple[dict[str, Variant], list[PeerStatus]]:
    global _REGISTRY
    if _REGISTRY is None:
        variants, status = _build()
        unknown = sorted(set(variants) - set(KNOWN_VARIANTS))
        if unknown:  # a new variant must have a catalogue entry of kind "rope" too
            raise RuntimeError(f"variants {unknown} are missing from KNOWN_VARIANTS "
                               "(rope_kernels/catalogue.py)")
        wrong = sorted(n for n, v in variants.items() if v.inplace != (n in IN_PLACE_VARIANTS))
        if wrong:  # vocabulary.IN_PLACE_VARIANTS answers "in place?" without the registry
            raise RuntimeError(f"variants {wrong}: Variant.inplace disagrees with the catalogue's "
                               "inplace (IN_PLACE_VARIANTS)")
        _REGISTRY = variants, status
    return _REGISTRY


class _LazyVariants(Mapping):
    """``VARIANTS``: the registry as a read-only mapping, built on first access."""

    def __getitem__(self, name: str) -> Variant:
        return registry()[name]

    def __iter__(self):
        return iter(registry())

    def __len__(self) -> int:
        return len(registry())

    def __repr__(self) -> str:
        return f"VARIANTS({', '.join(registry())})" if _REGISTRY else "VARIANTS(<not built yet>)"


VARIANTS: Mapping[str, Variant] = _LazyVariants()


def rope_triton_kernels() -> tuple[str, ...]:
    """Every Triton kernel a registered variant launches (the profiler's RoPE attribution)."""
    return tuple(sorted({k for v in registry().values() for k in v.triton_kernels}))


def encoder_only_absent() -> dict[str, str]:
    """The encoder-only RoPE modes (``vocabulary.ENCODER_ONLY_ROPE``) that cannot run
    here -> why: ``gemm_epilogue_quack`` needs QuACK's GEMM (peers/quack_gemm.py),
    ``gemm_epilogue_cute`` and its floor ``gemm_epilogue_cute_norot`` an sm_90 GPU with
    CuTe DSL (kernels/qkv_cute.py)."""
    from rope_kernels.kernels import qkv_cute
    from rope_kernels.peers import quack_gemm

    absent = {}
    ok, why = quack_gemm.availability()
    if not ok:
        absent["gemm_epilogue_quack"] = why
    ok, why = qkv_cute.availability()
    if not ok:
        absent["gemm_epilogue_cute"] = absent["gemm_epilogue_cute_norot"] = why
    return absent


def absent_reason(name: str) -> str:
    """Why a known variant does not run here ("" when it does; ValueError when unknown)."""
    if name not in KNOWN_VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(KNOWN_VARIANTS)}")
    if name in registry():
        return ""
    for s in _built()[1]:
        if s.name == name:
            return s.reason or "not available here"
    return "not available here"


def peer_columns(name: str) -> dict[str, str]:
    """A result row's peer_package/peer_version/peer_sha256 for variant ``name``
    (empty strings for this project's own variants and for "none")."""
    if name in VARIANTS:
        return VARIANTS[name].peer_columns
    return {"peer_package": "", "peer_version": "", "peer_sha256": ""}


def peer_status() -> list[dict]:
    """One row per peer: name, available, reason, package, version, sha256, origin."""
    return [s.__dict__.copy() for s in _built()[1]]


def get_variant(name: str) -> Variant:
    if not isinstance(name, str):
        raise TypeError(f"variant name must be a string, got {name!r}")
    if name not in VARIANTS:
        absent = {s.name: s.reason for s in _built()[1] if not s.available}
        if name in absent:
            raise ValueError(f"variant {name!r} is not available here: {absent[name]}")
        raise ValueError(f"unknown variant {name!r}; available: {', '.join(VARIANTS)}")
    return VARIANTS[name]
