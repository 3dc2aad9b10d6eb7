"""Every RoPE implementation the study compares, behind one registry.

``VARIANTS[name](xq, xk, freqs_cis, rotation="pairs") -> (q, k)``: all compute the same
function (Kimi's interleaved rotation by default, outputs in the input dtype), and
``VARIANTS[name].packed(qkv, freqs_cis, cos, sin, rotation="pairs") -> (q, k, v)`` is how
the encoder calls it on a layer's packed (T, 3, H, D) qkv (in-place peers rotate the packed
buffer and return its views). ``rotation`` (``vocabulary.ROTATIONS``): "pairs" (Kimi) or
"half" (Qwen's rotate-half); ``Variant.rotations`` lists what a variant implements, and a
variant implementing more than "pairs" takes ``rotation=`` in its ``fn``/``packed_fn``
(and its ``head_dim_rule``). Beside each: the kernel launches one call makes
(derived from its code, checked by ``count_launches`` on the CPU and the profiler on
a GPU), the dtypes and layouts it supports, and for other people's code the package,
version and sha256 of the file it runs (empty for this project's own variants).

Peers run from their own packages: vLLM 0.34.0, SGLang 0.5.23 and tokenspeed-kernel
0.1.4 files from the installed engine or the pinned cache (``python -m rope_kernels
peers fetch``);
SGLang's Kimi-K2.5 CUDA path and FlashInfer 0.7.4 from pinned trees of their wheels
in the same cache, JIT-compiled through tvm-ffi on a CUDA device; QuACK where it is
installed (an air-gapped GPU node: ``tools/device_setup.sh``); Liger and
torch.compile from their packages. Each peer is built by the module its catalogue entry
names (its ``rope_variant(name)``, see ``_catalogued_peers``). ``version``/``sha256`` of a
pinned tree is its digest over every file (``peers.cache.tree_digest``). A peer that cannot
run here is absent, never a stub; ``peer_status()`` says which ran and why the others did
not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_rotation
from rope_kernels.kernels.fused import DEFAULT_TRITON_KERNEL, fused_qk_rope
from rope_kernels.kernels.reference import (cos_sin_views, native_rope, native_rotate_half,
                                            qwen_cos_sin)
from rope_kernels.kernels.vllm_merged_recreated import vllm_merged_recreated_rope
from rope_kernels.vocabulary import (  # noqa: F401
    IN_PLACE_VARIANTS,
    KNOWN_VARIANTS,
    OWN_VARIANTS,
    PEER_VARIANTS,
    ROTATIONS,
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
    rotations: tuple[str, ...] = ("pairs",)  # the rotations it implements (vocabulary.ROTATIONS)
    # (bf16/fp16, fp32) launches of a rotate-half call where they differ from pairs' (None: same)
    launches_half: tuple[int, int] | None = None
    # its kernel takes cos/sin in the data's dtype (bf16 tables on bf16 data): the correctness
    # yardstick is then native's error with the same rounded table (``correctness.check_variant``)
    table_in_data_dtype: bool = False

    def rotation_kwargs(self, rotation: str = "pairs") -> dict:
        """What ``fn``/``packed_fn``/``head_dim_rule`` get for ``rotation``: nothing for a
        pairs-only variant, ``rotation=`` for one that implements several; a rotation it
        does not implement is refused (ValueError, with the ones it does)."""
        check_rotation(rotation)
        if rotation not in self.rotations:
            raise ValueError(f"{self.name} implements rotation {', '.join(self.rotations)} only, "
                             f"not {rotation!r}")
        return {} if self.rotations == ("pairs",) else {"rotation": rotation}

    def __call__(self, xq, xk, freqs_cis, rotation: str = "pairs"):
        return self.fn(xq, xk, freqs_cis, **self.rotation_kwargs(rotation))

    def packed(self, qkv: torch.Tensor, freqs_cis: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, rotation: str = "pairs"
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RoPE on a layer's packed qkv, as an engine calls it; cos/sin are freqs_cis's views."""
        kw = self.rotation_kwargs(rotation)
        if self.packed_fn is not None:
            return self.packed_fn(qkv, freqs_cis, cos, sin, **kw)
        q, k, v = qkv.unbind(1)
        q, k = self.fn(q, k, freqs_cis, **kw)
        return q, k, v

    def launch_count(self, dtype: torch.dtype, rotation: str = "pairs") -> int:
        if rotation == "half" and self.launches_half is not None:
            return self.launches_half[dtype == torch.float32]
        return self.launches_fp32 if dtype == torch.float32 else self.launches

    def unsupported(self, dtype: torch.dtype, *, packed: bool = True,
                    head_dim: int | None = None, rotation: str = "pairs") -> str:
        """Why this variant cannot take these inputs ("" when it can); ``head_dim``
        (None: not asked) is checked against ``head_dim_rule``."""
        check_rotation(rotation)
        if rotation not in self.rotations:
            return (f"{self.name} implements rotation {', '.join(self.rotations)} only "
                    f"(not {rotation})")
        if dtype not in self.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"{self.name} supports {names} only"
        if self.packed_only and not packed:
            return f"{self.name} needs q/k as slices of a contiguous packed (T, 3, H, D) qkv"
        if head_dim is not None and self.head_dim_rule is not None:
            ok, why = self.head_dim_rule(head_dim, dtype, **self.rotation_kwargs(rotation))
            if not ok:
                return why or f"{self.name} does not support head_dim {head_dim}"
        return ""

    @property
    def peer_columns(self) -> dict[str, str]:
        """The provenance columns every result row carries."""
        return {"peer_package": self.peer_package, "peer_version": self.peer_version,
                "peer_sha256": self.peer_sha256}


def _native(xq, xk, freqs_cis, rotation: str = "pairs"):
    """``native_rope``; for rotate-half with Qwen's (T, D) cos/sin built once per freqs_cis
    (as the model builds them once per forward), so a call is the 14 launches Qwen's path makes."""
    if check_rotation(rotation) == "half":
        from rope_kernels.peers.prepared import prepared_per_freqs

        check_qk(xq, xk)
        check_freqs_cis(freqs_cis, xq)
        return native_rotate_half(xq, xk, *prepared_per_freqs(freqs_cis, "native/half", qwen_cos_sin))
    return native_rope(xq, xk, freqs_cis)


def fused_rope(xq, xk, freqs_cis, *, inplace: bool = False, rotation: str = "pairs"):
    """The fused kernel reading cos/sin straight out of freqs_cis (no copy): ``fused_qk_rope``
    on its real and imaginary views, whose checks (and planned path) cover freqs_cis's; a
    refused call is re-checked here so that the error names freqs_cis where it is the cause.
    The views are made per call: a table of them would hold every freqs_cis alive."""
    if type(freqs_cis) is not torch.Tensor or freqs_cis.dtype is not torch.complex64:
        check_qk(xq, xk)
        check_freqs_cis(freqs_cis, xq)
    cos, sin = cos_sin_views(freqs_cis)
    try:
        return fused_qk_rope(xq, xk, cos, sin, inplace=inplace, rotation=rotation)
    except ValueError:
        check_qk(xq, xk)
        check_freqs_cis(freqs_cis, xq)
        raise


def fused_rope_inplace(xq, xk, freqs_cis, rotation: str = "pairs"):
    """The fused kernel writing into xq/xk (e.g. into the packed qkv buffer)."""
    return fused_rope(xq, xk, freqs_cis, inplace=True, rotation=rotation)


def _fused_packed(qkv, freqs_cis, cos, sin, *, inplace: bool = False, rotation: str = "pairs"):
    q, k, v = qkv.unbind(1)
    q, k = fused_qk_rope(q, k, cos, sin, inplace=inplace, rotation=rotation)
    return q, k, v


def _fused_inplace_packed(qkv, freqs_cis, cos, sin, rotation: str = "pairs"):
    return _fused_packed(qkv, freqs_cis, cos, sin, inplace=True, rotation=rotation)


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


def _catalogued_peers(status: list[PeerStatus]) -> list[Variant]:
    """Every peer, in catalogue order: the entries naming a ``module``, whose
    ``rope_variant(name)`` returns a dict of ``package`` (str), ``available`` (() -> (runs
    here, why not)), ``source`` (() -> (version, sha256, origin)), optionally
    ``absent_version`` (the version an absent row names: a peer recorded, never run) and the
    ``Variant`` fields (``fn``, ``launches``, ``launches_fp32``, ...; ``inplace`` and
    ``description`` default to the catalogue's). A ``rope_variant`` that raises (its pinned
    file does not load) leaves the peer absent with the error as why. Adding a peer touches
    its module and the catalogue only."""
    import importlib

    from rope_kernels.catalogue import CATALOGUE

    out = []
    for entry in CATALOGUE.values():
        if not entry.module:
            continue
        try:
            spec = dict(importlib.import_module(entry.module).rope_variant(entry.name))
            package, available, where = spec.pop("package"), spec.pop("available"), spec.pop("source", None)
            absent_version = spec.pop("absent_version", "")
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load is absent, with why
            status.append(PeerStatus(entry.name, False, f"{type(exc).__name__}: {exc}", "", "", "", ""))
            continue
        ok, reason = available()
        if not ok:
            status.append(PeerStatus(entry.name, False, reason, package, absent_version, "", ""))
            continue
        if where is None:
            raise TypeError(f"{entry.module}.rope_variant({entry.name!r}) says it runs here but "
                            "gives no 'source' (() -> (version, sha256, origin))")
        version, sha, origin = where()
        status.append(PeerStatus(entry.name, True, "", package, version, sha, origin))
        spec.setdefault("inplace", entry.inplace)
        spec.setdefault("description", entry.description)
        out.append(Variant(entry.name, peer_package=package, peer_version=version,
                           peer_sha256=sha, **spec))
    return out


def _build() -> tuple[dict[str, Variant], list[PeerStatus]]:
    status: list[PeerStatus] = []
    variants = [
        Variant("native", _native, 6, 2,
                "Kimi's pre-PR path: fp32 upcast, complex multiply, cast back (per tensor); "
                "rotate-half: Qwen's apply_rotary_pos_emb_vision (upcast, x cos + rotate_half(x) "
                "sin, cast back)", rotations=ROTATIONS, launches_half=(14, 10)),
        Variant("fused", fused_rope, 1, 1,
                "one Triton launch for q and k, cos/sin read from freqs_cis, out of place",
                packed_fn=_fused_packed, triton_kernels=(DEFAULT_TRITON_KERNEL,),
                rotations=ROTATIONS),
        Variant("fused_inplace", fused_rope_inplace, 1, 1,
                "the fused kernel writing into xq/xk", inplace=True,
                packed_fn=_fused_inplace_packed, triton_kernels=(DEFAULT_TRITON_KERNEL,),
                rotations=ROTATIONS),
        Variant("vllm_merged_recreated", vllm_merged_recreated_rope, 8, 4,
                "this project's re-creation of the merged PR path (its own rotary kernel "
                "in flash-attention's style; a CPU-test stand-in, not vLLM's code)",
                triton_kernels=("_rotary_interleaved_kernel",)),
        *_catalogued_peers(status),
    ]
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
