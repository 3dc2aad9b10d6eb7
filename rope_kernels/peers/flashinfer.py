"""FlashInfer's in-place RoPE (``flashinfer.rope.apply_rope_with_cos_sin_cache_inplace``).

Interleaved pairs (``is_neox=False``; ``rotation="half"``: ``is_neox=True``, rotate-half),
q and k in one launch, in place on the strided
q/k slices of the packed qkv. FlashInfer takes a fp32 (max_pos, rotary_dim) cache
(cos half, then sin half: ``cat(freqs_cis.real, freqs_cis.imag)``) and int64
positions; an engine builds them once per forward (SGLang's Kimi-K2.5 tower builds
exactly this cache), so they are built once per freqs_cis (``prepared_per_freqs``)
and the timed call is the one kernel a layer runs.

The code is FlashInfer's own: the installed ``flashinfer-python`` where there is one,
else the files of the pinned 0.7.4 wheel that ``import flashinfer.rope`` and its JIT
build need (``cache.TREES["flashinfer_rope"]``, about 6 MB of the 101 MB wheel),
imported under FlashInfer's module names with the package ``__init__`` files (which
import every kernel family) skipped. The module "rope" is JIT-compiled from the
wheel's ``data/csrc/rope.cu`` with the CUDA compiler through apache-tvm-ffi at first
use; of the vendored headers only the part of CCCL's libcudacxx the build reads is carried (fastdiv.cuh needs its
``cuda::fast_mod_div``, which CUDA 13.0's own CCCL lacks), not CUTLASS or spdlog. Needs CUDA, the CUDA
compiler, ninja, apache-tvm-ffi and nvidia-ml-py (flashinfer/utils.py imports it).

FlashInfer 0.7.4 rotates only some head_dims correctly (``supported_head_dim``): the
wrapper refuses the others, Kimi's 72 among them, before anything is loaded or
launched. In ``data/include/flashinfer/pos_enc.cuh``,
``BatchQKApplyRotaryPosIdsCosSinCache`` takes its own kernel only for
``head_dim == 64 || 128 || 256 || 512``; every other head_dim goes to
``RopeQuantize`` -> ``RopeQuantizeKernel``, launched with ``vec_size = 32 /
sizeof(DType)`` elements per thread and ``bdx = ceil(rope_dim / vec_size)`` threads
per head. Each thread rotates and ``cast_store``s a whole vector at ``tx * vec_size``;
``vec_apply_llama_rope_cos_sin_interleave_reuse_half`` tests only where the vector
starts (``threadIdx.x * vec_size < rotary_dim``), and the partial-chunk guard
(``scale_store_partial_chunk``, the "HACK (raayandhar)" comment) covers the no-rope
part only. So where ``rope_dim % vec_size != 0`` the last thread of a head writes
``vec_size - rope_dim % vec_size`` elements past it, into the next head (or the next
tensor), racing that head's own block. Here rope_dim is head_dim (the cache spans
freqs_cis's head_dim / 2 angles, cos then sin): at head_dim 72 in bf16/fp16 (16
elements a vector) 8 elements past every head are overwritten.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from pathlib import Path

import torch

from rope_kernels.kernels.checks import (check_freqs_cis, check_qk, check_rotation,
                                         check_writable_in_place)
from rope_kernels.peers.cache import (TREES, import_tree, installed_cuda_peer, installed_version,
                                      load_tree, package_module, sha256_file)
from rope_kernels.peers.prepared import prepared_per_freqs

PACKAGE = "flashinfer-python"
TREE = TREES["flashinfer_rope"]
PINNED_VERSION = TREE.version
ENTRY_FILE = "flashinfer/rope.py"
DTYPES = (torch.bfloat16, torch.float16)  # rope.cu dispatches q/k on fp16 and bf16 only
# pos_enc.cuh, BatchQKApplyRotaryPosIdsCosSinCache: the head_dims with a kernel of their own
FAST_PATH_HEAD_DIMS = (64, 128, 256, 512)
# pos_enc.cuh, RopeQuantize: vec_size = 32 / sizeof(DType) elements per thread, no tail guard
ROPE_QUANTIZE_VECTOR_BYTES = 32
AVAILABILITY_HEAD_DIM = 128  # the availability check's head_dim: one FlashInfer rotates
_RULE_SOURCE = ("flashinfer/data/include/flashinfer/pos_enc.cuh: "
                "BatchQKApplyRotaryPosIdsCosSinCache -> RopeQuantizeKernel")


def supported_head_dim(head_dim: int, dtype: torch.dtype,
                       rotation: str = "pairs") -> tuple[bool, str]:
    """(FlashInfer 0.7.4 rotates q/k of this head_dim and dtype correctly, why not).

    Pure: loads nothing. With the cache this wrapper builds (rotary_dim = head_dim),
    a head_dim is rotated correctly on the fast path (``FAST_PATH_HEAD_DIMS``) or
    when ``RopeQuantizeKernel``'s whole vectors tile it (a multiple of
    ``32 / element_size`` elements); otherwise its last vector of every head is
    stored past the head (module docstring). Rotate-half (``rotation="half"``,
    ``vec_apply_llama_rope_cos_sin``) needs more: a thread picks its partner vector and
    sign by where its vector starts (``threadIdx.x * vec_size < rotary_dim / 2``) and
    loads cos/sin at ``(tx * vec_size) % (rotary_dim / 2)``, so a vector that straddles
    the head's middle rotates its second-half elements with the wrong partner (past
    the head), sign and angles: each half must be a multiple of the vector (head_dim
    80 in bf16: halves of 40, vectors of 16)."""
    check_rotation(rotation)
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(f"head_dim must be an int, got {head_dim!r}")
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    name = str(dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        return False, (f"flashinfer supports bfloat16 and float16 only (its rope kernel "
                       f"dispatches on those), got {name}")
    if head_dim in FAST_PATH_HEAD_DIMS:
        return True, ""
    vec = ROPE_QUANTIZE_VECTOR_BYTES // dtype.itemsize
    if rotation == "half" and head_dim % vec == 0 and (head_dim // 2) % vec:
        return False, (f"flashinfer {PINNED_VERSION} cannot rotate-half head_dim {head_dim} in "
                       f"{name}: {_RULE_SOURCE} (vec_apply_llama_rope_cos_sin) picks each "
                       f"{vec}-element vector's partner and sign by where it starts, so the vector "
                       f"across the middle of the head (halves of {head_dim // 2}) rotates "
                       f"{vec - (head_dim // 2) % vec} elements with a partner past the head, the "
                       f"wrong sign and wrong angles (needs head_dim in "
                       f"{{{', '.join(map(str, FAST_PATH_HEAD_DIMS))}}} or a multiple of {2 * vec})")
    if head_dim % vec == 0:
        return True, ""
    return False, (f"flashinfer {PINNED_VERSION} cannot rotate head_dim {head_dim} in {name}: "
                   f"{_RULE_SOURCE} stores whole {vec}-element vectors with no tail guard, so "
                   f"{vec - head_dim % vec} elements past every head are overwritten (needs "
                   f"head_dim in {{{', '.join(map(str, FAST_PATH_HEAD_DIMS))}}} or a multiple "
                   f"of {vec})")


@functools.cache
def source() -> tuple[str, str, str, types.ModuleType]:
    """(version, sha256, origin, flashinfer.rope module).

    An installed flashinfer-python is used as it is (its version and rope.py's
    sha256 go into the rows); otherwise the pinned tree from the cache, whose sha256
    is the tree's digest. Refuses when another flashinfer is already imported."""
    version = installed_version(PACKAGE)
    if version is not None:
        import flashinfer.rope

        return version, sha256_file(Path(flashinfer.rope.__file__)), "installed", flashinfer.rope
    if "flashinfer" in sys.modules:
        raise RuntimeError("another flashinfer is imported in this process; cannot load the "
                           f"pinned flashinfer {PINNED_VERSION} tree beside it")
    cached = load_tree(TREE)
    import_tree(cached)  # its Python runs from the checked bytes, never the disk again
    sys.modules.update({name: package_module(name, cached.root.joinpath(*name.split(".")))
                        for name in ("flashinfer", "flashinfer.jit")})
    sys.modules["flashinfer"].jit = sys.modules["flashinfer.jit"]
    try:
        rope = importlib.import_module("flashinfer.rope")
    except BaseException:
        for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
            del sys.modules[name]
        raise
    return PINNED_VERSION, cached.sha256, "cache", rope


def _cos_sin_cache(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cache = torch.cat((freqs_cis.real, freqs_cis.imag), dim=-1)
    positions = torch.arange(freqs_cis.shape[0], device=freqs_cis.device, dtype=torch.int64)
    return cache, positions


def flashinfer_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor,
                    rotation: str = "pairs") -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate xq and xk in place with FlashInfer; returns them. Refuses a head_dim
    FlashInfer rotates wrongly (``supported_head_dim``) before loading anything."""
    check_qk(xq, xk)
    check_freqs_cis(freqs_cis, xq)
    check_writable_in_place(xq, xk)
    if xq.dtype not in DTYPES:
        raise TypeError(f"flashinfer supports bfloat16 and float16 only (its rope kernel "
                        f"dispatches on those), got {xq.dtype}")
    ok, why = supported_head_dim(xq.shape[-1], xq.dtype, rotation)
    if not ok:
        raise ValueError(why)
    cache, positions = prepared_per_freqs(freqs_cis, "flashinfer", _cos_sin_cache)
    # the same cos|sin cache serves both: column j is pair j's angle in either layout
    source()[3].apply_rope_with_cos_sin_cache_inplace(positions, xq, xk, xq.shape[-1], cache,
                                                      is_neox=rotation == "half")
    return xq, xk


@functools.cache
def availability() -> tuple[bool, str]:
    """(runs here, why not): FlashInfer's files, a CUDA device, and a tiny call that
    builds the kernel and matches float64, at a head_dim it rotates
    (``AVAILABILITY_HEAD_DIM``; the others are refused per shape, with why)."""
    try:
        source()
    except Exception as exc:  # noqa: BLE001 - absent, with the reason
        return False, (f"flashinfer {PINNED_VERSION} rope cannot load: "
                       f"{type(exc).__name__}: {exc}")
    return installed_cuda_peer("flashinfer", PACKAGE, PINNED_VERSION, flashinfer_rope,
                               why="CUDA only, JIT through tvm-ffi",
                               head_dim=AVAILABILITY_HEAD_DIM)


def rope_variant(name: str) -> dict:
    """The registry's spec of ``flashinfer`` (the catalogue's ``module`` contract:
    ``variants``): here only where ``availability`` says it runs."""
    if name != "flashinfer":
        raise ValueError(f"rope_kernels.peers.flashinfer builds flashinfer, not {name!r}")
    return {"package": PACKAGE, "available": availability, "source": lambda: source()[:3],
            "fn": flashinfer_rope, "launches": 1, "launches_fp32": 1, "dtypes": DTYPES,
            "head_dim_rule": supported_head_dim, "rotations": ("pairs", "half"),
            "description": "FlashInfer apply_rope_with_cos_sin_cache_inplace (interleaved, JIT "
                           "CUDA through tvm-ffi): one launch for q and k in place; cos|sin cache "
                           "and positions built once per freqs_cis"}
