"""SGLang 0.5.23's Kimi-K2.5 vision RoPE, exactly as its tower runs it.

``sglang/srt/models/kimi_k25.py``: the encoder's forward calls
``prepare_fused_qk_complex_rope_inplace(freqs_cis)`` once (a (T, D) fp32 cos|sin
cache and int64 positions), and every layer's ``VisionAttention`` hands q and k to
``apply_rope`` -> ``apply_fused_qk_complex_rope_inplace`` ->
``sglang.kernels.ops.attention.rope.apply_rope_inplace(..., is_neox=False)``: a CUDA
kernel (``kernels/jit/csrc/elementwise/rope.cuh``) that SGLang's ``load_jit`` builds
through apache-tvm-ffi at first use. ``VisionAttention`` sets
``pass_strided_qkv = False`` when the model supplies its own position applier (Kimi's
does), so q, k and v are made contiguous before the rotation: those three copies are
part of the path and of every timed call here (v's too, though RoPE does not read it:
the path makes it because of the RoPE applier). The prepared cache is built once per freqs_cis
(``prepared_per_freqs``), as the engine builds it once per forward.

The files are SGLang's own, from the installed package or from the pinned tree
(``cache.TREES["sglang_jit"]``: the jit tree's Python, headers and rope.cuh, and
ops/attention/{rope,vision_rope}.py). What the full package would add on import is
replaced by three small shims (``sglang.srt.environ.envs`` with SGLang's defaults,
``sglang.srt.utils.common``, ``sglang.srt.utils.custom_op.register_custom_op`` as a
plain decorator); package ``__init__`` files that would import the whole of SGLang
are skipped. Needs CUDA, the CUDA compiler and ninja (the build) and apache-tvm-ffi.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from pathlib import Path

import torch

from rope_kernels.kernels.checks import check_freqs_cis, check_qk, check_rotation
from rope_kernels.peers.cache import (TREES, CachedTree, import_tree, installed_version,
                                      load_tree, package_module)
from rope_kernels.peers.prepared import prepared_per_freqs
from rope_kernels.peers.vllm import packed_qkv_of

PACKAGE = "sglang"
TREE = TREES["sglang_jit"]
PINNED_VERSION = TREE.version
DTYPES = (torch.bfloat16, torch.float16)  # what the tower sends to the in-place kernel


def _env_field(default, kind):
    """An ``EnvField``-like setting: ``.get()`` reads the variable, else SGLang's default."""

    class Field:
        def __init__(self, name):
            self.name = name

        def get(self):
            raw = os.environ.get(self.name)
            if raw is None or raw == "":
                return default
            if kind is bool:
                return raw.strip().lower() in ("1", "true", "yes", "on")
            return kind(raw)

    return Field


# sglang/srt/environ.py 0.5.23: the settings the jit tree reads, with their defaults.
_ENV_DEFAULTS = {
    "SGLANG_JIT_KERNEL_RUN_FULL_TESTS": (False, bool),
    "SGLANG_JIT_CACHE_DIR": (None, str),
    "SGLANG_JIT_CACHE_DEBUG": (False, bool),
    "SGLANG_JIT_CACHE_KEEP": (None, int),
    "SGLANG_JIT_FORCE_RECOMPILE": (False, bool),
    "SGLANG_CRASH_ON_JIT_COMPILE": (False, bool),
    "SGLANG_JIT_LOG_RESOURCE_USAGE": (False, bool),
    "SGLANG_SAIL_GPU_ARCH": ("native", str),
}


def import_shims(root: Path) -> dict[str, types.ModuleType]:
    """sys.modules entries that let SGLang's files at ``root`` import without SGLang."""
    mods = {name: package_module(name, root.joinpath(*name.split(".")))
            for name in ("sglang", "sglang.kernels", "sglang.kernels.ops",
                         "sglang.kernels.ops.attention")}
    mods["sglang.srt"] = package_module("sglang.srt")
    mods["sglang.srt.utils"] = package_module("sglang.srt.utils")

    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = types.SimpleNamespace(**{
        name: _env_field(default, kind)(name) for name, (default, kind) in _ENV_DEFAULTS.items()})
    mods["sglang.srt.environ"] = environ

    common = types.ModuleType("sglang.srt.utils.common")
    common.is_cuda = lambda: torch.cuda.is_available() and torch.version.cuda is not None

    def get_cuda_version():
        return tuple(map(int, torch.version.cuda.split("."))) if torch.version.cuda else (0, 0)

    common.get_cuda_version = get_cuda_version
    mods["sglang.srt.utils.common"] = common

    custom_op = types.ModuleType("sglang.srt.utils.custom_op")

    def register_custom_op(fn=None, **_kwargs):
        """SGLang registers a torch custom op (for torch.compile); called eagerly it is fn."""
        return fn if fn is not None else (lambda f: f)

    custom_op.register_custom_op = register_custom_op
    mods["sglang.srt.utils.custom_op"] = custom_op

    utils = types.ModuleType("sglang.utils")
    utils.is_in_ci = lambda: False
    mods["sglang.utils"] = utils
    for parent, child in (("sglang", "srt"), ("sglang", "utils"), ("sglang.srt", "environ"),
                          ("sglang.srt", "utils"), ("sglang.srt.utils", "common"),
                          ("sglang.srt.utils", "custom_op"), ("sglang", "kernels"),
                          ("sglang.kernels", "ops"), ("sglang.kernels.ops", "attention")):
        setattr(mods[parent], child, mods[f"{parent}.{child}"])
    return mods


@functools.cache
def source() -> tuple[str, str, str, types.ModuleType]:
    """(version, sha256, origin, vision_rope module) of SGLang's Kimi-K2.5 path.

    The installed SGLang when it is the pinned release; else the pinned tree from
    the cache, imported under SGLang's module names (they stay in sys.modules: the
    kernel's module imports its JIT helpers at call time). Refuses when another
    sglang is already imported, rather than mixing two.
    """
    if installed_version(PACKAGE) == PINNED_VERSION:
        from sglang.kernels.ops.attention import rope, vision_rope  # noqa: F401

        from rope_kernels.peers.cache import sha256_file

        return (PINNED_VERSION, sha256_file(Path(rope.__file__)), "installed", vision_rope)
    if "sglang" in sys.modules:
        raise RuntimeError("another sglang is imported in this process; cannot load the "
                           f"pinned sglang {PINNED_VERSION} tree beside it")
    cached: CachedTree = load_tree(TREE)
    import_tree(cached)  # its Python runs from the checked bytes, never the disk again
    sys.modules.update(import_shims(cached.root))
    try:
        vision_rope = importlib.import_module("sglang.kernels.ops.attention.vision_rope")
        importlib.import_module("sglang.kernels.ops.attention.rope")  # needs tvm_ffi, msgspec
    except BaseException:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
        raise
    return PINNED_VERSION, cached.sha256, "cache", vision_rope


def _prepare(freqs_cis: torch.Tensor):
    return source()[3].prepare_fused_qk_complex_rope_inplace(freqs_cis)


def sglang_kimi_k25_packed(qkv, freqs_cis, cos=None, sin=None, rotation: str = "pairs"):
    """As VisionAttention runs it on a layer's packed qkv: q, k and v made contiguous
    (it opts out of strided q/k/v because the model supplies its own RoPE applier),
    then q and k rotated in place by SGLang's JIT kernel; returns the copies.
    ``rotation="half"``: the same JIT kernel's rotate-half form, SGLang's
    ``rope.apply_rope_inplace(..., is_neox=True)`` on the same cos|sin cache (what
    ``apply_fused_qk_complex_rope_inplace`` calls with ``is_neox=False``)."""
    half = check_rotation(rotation) == "half"
    q, k, v = (t.contiguous() for t in qkv.unbind(1))
    prepared = prepared_per_freqs(freqs_cis, "sglang_kimi_k25", _prepare)
    if half:
        cache, positions = prepared
        sys.modules["sglang.kernels.ops.attention.rope"].apply_rope_inplace(
            q, k, cache, positions, is_neox=True, rope_dim=cache.size(-1))
        return q, k, v
    q, k = source()[3].apply_fused_qk_complex_rope_inplace(q, k, prepared)
    return q, k, v


def sglang_kimi_k25_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor,
                         rotation: str = "pairs") -> tuple[torch.Tensor, torch.Tensor]:
    """The packed call on the qkv that xq/xk slice (v's copy included: the path makes
    it); returns the rotated copies of q and k (the caller's q/k stay as they were)."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    qkv = packed_qkv_of(xq, xk, "sglang_kimi_k25")  # the layout VisionAttention copies from
    if xq.dtype not in DTYPES:
        raise TypeError(f"sglang_kimi_k25 supports bfloat16 and float16 only (Kimi-K2.5's "
                        f"tower keeps other dtypes on its portable path), got {xq.dtype}")
    q, k, _v = sglang_kimi_k25_packed(qkv, freqs_cis, rotation=rotation)
    return q, k


@functools.cache
def availability() -> tuple[bool, str]:
    """(runs here, why not): pinned files, tvm-ffi, a CUDA device, and a tiny call
    that builds the kernel and matches float64."""
    from rope_kernels.peers.cache import installed_cuda_peer

    try:
        source()
    except Exception as exc:  # noqa: BLE001 - absent, with the reason
        return False, f"sglang {PINNED_VERSION} Kimi-K2.5 path cannot load: {type(exc).__name__}: {exc}"
    return installed_cuda_peer("sglang", PACKAGE, PINNED_VERSION, sglang_kimi_k25_rope,
                               why="CUDA only, JIT through tvm-ffi", inplace=False)


def rope_variant(name: str) -> dict:
    """The registry's spec of ``sglang_kimi_k25`` (the catalogue's ``module`` contract:
    ``variants``): here only where ``availability`` says it runs."""
    if name != "sglang_kimi_k25":
        raise ValueError(f"rope_kernels.peers.sglang_kimi_k25 builds sglang_kimi_k25, not {name!r}")
    return {"package": PACKAGE, "available": availability, "source": lambda: source()[:3],
            "fn": sglang_kimi_k25_rope, "launches": 4, "launches_fp32": 4,
            "packed_fn": sglang_kimi_k25_packed, "packed_only": True, "dtypes": DTYPES,
            "rotations": ("pairs", "half"),
            "description": "SGLang 0.5.23's Kimi-K2.5 tower: VisionAttention's contiguous copies "
                           "of q, k and v (timed: the path makes them), then "
                           "apply_fused_qk_complex_rope_inplace, SGLang's JIT CUDA kernel "
                           "(rope.cuh through tvm-ffi) rotating the copies in place; cos|sin "
                           "cache prepared once per freqs_cis; rotate-half: the same JIT kernel "
                           "through rope.apply_rope_inplace(is_neox=True)"}
