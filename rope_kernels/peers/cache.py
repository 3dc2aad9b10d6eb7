"""The engines' source files at pinned versions: found installed, or fetched once.

A peer is the engine's own code. Where the engine is installed (a vLLM or SGLang
node) its file is read from the installed package. Elsewhere (CPU CI, a GPU node
that cannot take a 300 MB wheel) ``python -m rope_kernels peers fetch`` downloads
the pinned wheel once, checks its sha256, and keeps only the few files the peers
run, with a manifest, in a git-ignored cache (``.peers/`` in the repository, or
``$ROPE_PEERS_DIR``). Loading from the cache re-checks every file against the
manifest and against the sha256 pinned here, so a changed or missing file is an
error naming it. A file is read once: the bytes whose hash was checked are the
bytes compiled and executed (no second read, no ``__pycache__`` bytecode), and the
source Triton and ``inspect`` see is those bytes too, so a file swapped or a
``.pyc`` planted after the check never runs. Third-party files are executed under
a private module name and never committed.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import linecache
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import types
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rope_kernels.atomic_io import write_atomic
from rope_kernels.provenance import REPO_ROOT
from rope_kernels.vocabulary import KIMI_HEAD_DIM


@dataclass(frozen=True)
class PinnedWheel:
    """One engine release: the wheel pip fetches and the files the peers run from it."""

    package: str  # the distribution name pip knows
    version: str
    wheel: str  # exact wheel filename
    wheel_sha256: str
    python: str  # --python-version that selects this wheel (only .py files are used)
    platform: str
    files: dict[str, str]  # path inside the wheel -> sha256

    @property
    def key(self) -> str:
        return f"{self.package}-{self.version}"


PINS: dict[str, PinnedWheel] = {
    "vllm": PinnedWheel(
        # 0.34.0: packed_qk_rope.py and ops/triton/rotary.py byte-identical to 0.33.0's
        # (same sha256); its kimi_k25_vit.py only drops a torch.compile wrapper
        "vllm", "0.34.0", "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
        "3.12", "manylinux_2_28_x86_64",
        {
            "vllm/model_executor/layers/rotary_embedding/packed_qk_rope.py":
                "f712a22da06f28cc088d6f231b2107fe4a6dd9d8f93c2b1d3c48f7c85f5f38cc",
            "vllm/vllm_flash_attn/ops/triton/rotary.py":
                "f1f4bf9a0b28cc544fa882b60628d74b8923e8b47e1f8438a7af43fa7b5061e4",
            "vllm/vllm_flash_attn/layers/rotary.py":
                "b826cc3339488815b26f974135a8f53d44149d019b4c82e1ad4240a6ec0e28c4",
        },
    ),
    "sglang": PinnedWheel(
        "sglang", "0.5.23", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
        "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
        "3.11", "manylinux_2_34_x86_64",
        {
            "sglang/kernels/ops/attention/vision_rope.py":
                "2062f059bf47e4f9ef89e89fa46560b4bdf87fd87732be23858db9fffc63d484",
        },
    ),
    # cp311 only; its dependencies (torch 2.14, the tokenspeed-triton fork) are not
    # installed: the one file runs on stock Triton (peers/tokenspeed.py)
    "tokenspeed-kernel": PinnedWheel(
        "tokenspeed-kernel", "0.1.4", "tokenspeed_kernel-0.1.4-cp311-cp311-manylinux_2_28_x86_64.whl",
        "958ed94e8ec272ba198277bda56b0b4fa10b03626a80bb7d2a5a50440cd0b38b",
        "3.11", "manylinux_2_28_x86_64",
        {
            "tokenspeed_kernel/ops/attention/mha/_triton/qkv_rotary.py":
                "f4ac71c33a33c04944fd534149257d937c32f5191b3a90f2c866aee130762af3",
        },
    ),
}

MANIFEST = "manifest.json"


class PeerCacheError(RuntimeError):
    """A peer's cached source is missing, incomplete or not the pinned file."""


_RESOLVED_DIRS: dict[str, Path] = {}


def peers_dir() -> Path:
    """The cache folder: ``$ROPE_PEERS_DIR`` or ``.peers/`` in the repository.

    A value is resolved once, at its first use, to an absolute path (``~`` expanded):
    the same folder wherever the working directory moves later (notebooks run in
    notebooks/). :func:`export_peers_dir` hands that absolute path to child processes."""
    raw = os.environ.get("ROPE_PEERS_DIR") or ""
    if not raw:
        return REPO_ROOT / ".peers"
    if raw not in _RESOLVED_DIRS:
        _RESOLVED_DIRS[raw] = Path(os.path.abspath(os.path.expanduser(raw)))
    return _RESOLVED_DIRS[raw]


def export_peers_dir() -> None:
    """Write ``$ROPE_PEERS_DIR`` back as the absolute path :func:`peers_dir` resolved,
    so notebook kernels and Slurm tasks started from here (in another working
    directory) find the same cache. Unset stays unset."""
    if os.environ.get("ROPE_PEERS_DIR"):
        os.environ["ROPE_PEERS_DIR"] = str(peers_dir())


@contextmanager
def _open_regular(path: Path):
    """``path`` opened for reading if it is a regular file; anything else (a named
    pipe, whose read would wait forever for a writer, a device, a socket) is a
    ``PeerCacheError`` naming it. O_NONBLOCK makes opening a pipe return at once."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise PeerCacheError(f"{path} is not a regular file (a "
                                 f"{_KINDS.get(stat.S_IFMT(mode), 'special file')}); a peer's "
                                 "files are read from regular files only: re-run `python -m "
                                 "rope_kernels peers fetch --force`")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


_KINDS = {stat.S_IFIFO: "named pipe", stat.S_IFCHR: "character device",
          stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket", stat.S_IFDIR: "folder"}


def read_regular(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (``_open_regular``)."""
    with _open_regular(path) as f:
        return f.read()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with _open_regular(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- where a file comes from ---------------------------------------------------
@dataclass(frozen=True)
class SourceFile:
    """One third-party file a peer runs, with where it was found and its hash."""

    package: str
    version: str
    path: str  # path inside the package's wheel
    location: Path
    sha256: str
    origin: str  # "installed" or "cache"
    data: bytes = field(default=b"", repr=False, compare=False)  # the bytes that were hashed


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed_file(pin: PinnedWheel, path: str) -> SourceFile | None:
    version = installed_version(pin.package)
    if version is None or importlib.util.find_spec(pin.package.replace("-", "_")) is None:
        return None
    location = Path(importlib.metadata.distribution(pin.package).locate_file(path))
    if not location.is_file():
        return None
    data = read_regular(location)
    return SourceFile(pin.package, version, path, location, hashlib.sha256(data).hexdigest(),
                      "installed", data)


def _read_manifest(manifest_path: Path, package: str, version: str, what: str) -> dict[str, str]:
    """{path: sha256} of a cache folder's manifest, which must be for ``package==version``;
    a missing, unreadable or foreign manifest is a ``PeerCacheError`` naming it."""
    if not manifest_path.is_file():
        raise PeerCacheError(f"no manifest at {manifest_path}: run `python -m rope_kernels peers "
                             f"fetch` to cache {package}=={version}'s {what}")
    try:
        manifest = json.loads(read_regular(manifest_path).decode("utf-8"))
        entries = {e["path"]: e["sha256"] for e in manifest["files"]}
        got = (manifest["package"], manifest["version"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PeerCacheError(f"unreadable manifest {manifest_path}: {exc}") from exc
    if got != (package, version):
        raise PeerCacheError(f"{manifest_path} is for {got[0]}=={got[1]}, pinned {package}=={version}")
    return entries


def _cached_file(pin: PinnedWheel, path: str, root: Path | None = None) -> SourceFile:
    root = Path(root) if root is not None else peers_dir()
    folder = root / pin.key
    manifest_path = folder / MANIFEST
    entries = _read_manifest(manifest_path, pin.package, pin.version, "peer files")
    if path not in entries:
        raise PeerCacheError(f"{path} is not listed in {manifest_path}")
    location = folder / path
    try:
        data = read_regular(location)  # read once: these bytes are hashed and later executed
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise PeerCacheError(f"cached peer file missing: {location}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entries[path] or digest != pin.files[path]:
        raise PeerCacheError(f"cached peer file {location} has sha256 {digest}; the manifest "
                             f"says {entries[path]}, pinned {pin.files[path]}: re-run "
                             "`python -m rope_kernels peers fetch`")
    return SourceFile(pin.package, pin.version, path, location, digest, "cache", data)


def find_source(package: str, path: str, *, root: Path | None = None) -> SourceFile:
    """The installed package's file when the package is importable, else the cached one."""
    pin = PINS[package]
    if path not in pin.files:
        raise ValueError(f"{path} is not a pinned file of {package}")
    found = _installed_file(pin, path) if root is None else None
    return found if found is not None else _cached_file(pin, path, root)


def loaded_peer_spec(name: str, variants: dict) -> dict:
    """A module's ``rope_variant(name)`` answer (``variants``' catalogued peers) for peers that
    run one pinned file: ``variants`` maps each name the module builds to (the loader of its
    file, () -> (SourceFile, module); its Variant fields). The loader runs here: a file that
    does not load raises (the peer is then absent, with the error as why); one that loads
    runs here, at its version, hash and origin."""
    if name not in variants:
        raise ValueError(f"this module builds {', '.join(variants)}, not {name!r}")
    load, fields = variants[name]
    src, _module = load()
    return {"package": src.package, "available": lambda: (True, ""),
            "source": lambda: (src.version, src.sha256, src.origin), **fields}


# -- running a file under a private name ---------------------------------------------
@contextmanager
def _temporary_modules(modules: dict[str, types.ModuleType]):
    """Put ``modules`` into sys.modules while a file imports them, then restore."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


class _VerifiedSource:
    """A module's loader that answers ``get_source`` with the verified bytes
    (linecache falls back to it), never with the file on disk."""

    def __init__(self, text: str):
        self._text = text

    def get_source(self, fullname: str) -> str:
        return self._text


def load_module(source: SourceFile, *,
                shims: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    """Execute ``source`` as a private module (``rope_kernels._peer.<pkg>_<ver>.<file>``).

    What runs is ``source.data``, the bytes whose sha256 was checked: compiled here
    (no bytecode cache read or written), under a code filename that names the file
    and its hash and is registered in ``linecache``, so ``inspect.getsource`` (Triton
    parses kernels from it) returns the same text whatever is on disk now. ``shims`` stand in for the engine's own modules the
    file imports; they exist in sys.modules only while the file runs, so they
    never shadow a real install.
    """
    if hashlib.sha256(source.data).hexdigest() != source.sha256:
        raise PeerCacheError(f"{source.location}: the bytes to run are not the bytes whose "
                             f"sha256 {source.sha256} was checked")
    stem = Path(source.path).with_suffix("").as_posix().replace("/", ".")
    name = f"rope_kernels._peer.{source.package}_{source.version.replace('.', '_')}.{stem}"
    if name in sys.modules:
        return sys.modules[name]
    # A code filename in <...> is one linecache never reads from disk: the source that
    # tracebacks, inspect and Triton see is these lines, even after linecache.clearcache().
    filename = f"<verified {source.location} sha256={source.sha256[:16]}>"
    text = source.data.decode("utf-8")
    code = compile(source.data, filename, "exec", dont_inherit=True)
    spec = importlib.machinery.ModuleSpec(name, _VerifiedSource(text), origin=str(source.location))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = filename  # inspect.getsource(module) reads linecache, not the disk
    # mtime None: linecache.checkcache keeps the entry (it is not a file's).
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    sys.modules[name] = module  # Triton reads kernel sources through the module
    try:
        with _temporary_modules(shims or {}):
            exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# -- fetching -------------------------------------------------------------------
def cache_valid(pin: PinnedWheel, root: Path | None = None) -> bool:
    try:
        for path in pin.files:
            _cached_file(pin, path, root)
    except PeerCacheError:
        return False
    return True


def pip_download_command(pin: PinnedWheel, dest: Path) -> list[str]:
    """pip download of exactly the pinned wheel (the wheelhouse's command, no dependencies)."""
    from rope_kernels.wheels import pip_download_command as wheel_download

    return wheel_download(dest, pin.python, pin.platform, [f"{pin.package}=={pin.version}"],
                          no_deps=True)


def _obtain_wheel(pin: PinnedWheel, wheels: Path | None, tmp: Path) -> Path:
    if wheels is not None and (Path(wheels) / pin.wheel).is_file():
        return Path(wheels) / pin.wheel
    subprocess.run(pip_download_command(pin, tmp), check=True)
    wheel = tmp / pin.wheel
    if not wheel.is_file():
        got = ", ".join(p.name for p in tmp.glob("*.whl")) or "nothing"
        raise PeerCacheError(f"pip downloaded {got}, expected {pin.wheel}")
    return wheel


def _verified_wheel_and_emptied(pin: PinnedWheel, wheels: Path | None, tmp: Path,
                                folder: Path) -> Path:
    """``pin``'s wheel (``_obtain_wheel``), its sha256 checked against the pin; then
    ``folder`` emptied, manifest first (no manifest while files change), so that files an
    earlier pin cached but this one does not select go too: a header left on the include
    path would still be found by a compiler, manifest or not."""
    wheel = _obtain_wheel(pin, wheels, tmp)
    digest = sha256_file(wheel)
    if digest != pin.wheel_sha256:
        raise PeerCacheError(f"{wheel} has sha256 {digest}, pinned {pin.wheel_sha256}")
    (folder / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    return wheel


def fetch_pin(pin: PinnedWheel, *, root: Path | None = None, wheels: Path | None = None,
              force: bool = False) -> str:
    """Cache ``pin``'s files; returns what was done. Idempotent: a valid cache is kept."""
    root = Path(root) if root is not None else peers_dir()
    if not force and cache_valid(pin, root):
        return f"{pin.key}: cache valid"
    folder = root / pin.key
    with tempfile.TemporaryDirectory(prefix="rope-peer-wheel-") as tmp:
        wheel = _verified_wheel_and_emptied(pin, wheels, Path(tmp), folder)
        entries = []
        with zipfile.ZipFile(wheel) as zf:
            for path, pinned in pin.files.items():
                data = zf.read(path)
                got = hashlib.sha256(data).hexdigest()
                if got != pinned:
                    raise PeerCacheError(f"{path} in {pin.wheel} has sha256 {got}, pinned {pinned}")
                write_atomic(folder / path, data)
                entries.append({"path": path, "sha256": got})
    manifest = {"package": pin.package, "version": pin.version, "wheel": pin.wheel,
                "wheel_sha256": pin.wheel_sha256, "files": entries}
    write_atomic(folder / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    return f"{pin.key}: cached {len(entries)} file(s) from {pin.wheel}"


def fetch_all(*, root: Path | None = None, wheels: Path | None = None,
              force: bool = False) -> list[str]:
    """Cache every pinned engine's peer files and trees (``python -m rope_kernels peers
    fetch``); a wheel that two of them need (SGLang's) is downloaded once."""
    if wheels is None:
        with tempfile.TemporaryDirectory(prefix="rope-peer-wheels-") as shared:
            return _fetch_all(root, Path(shared), force, keep_downloads=True)
    return _fetch_all(root, Path(wheels), force, keep_downloads=False)


def _fetch_all(root, wheels: Path, force: bool, *, keep_downloads: bool) -> list[str]:
    lines = []
    for pin in [*PINS.values(), *TREES.values()]:
        if isinstance(pin, PinnedWheel):
            fetch, valid = fetch_pin, cache_valid(pin, root)
        else:
            fetch, valid = fetch_tree, _tree_valid(pin, root)
        if keep_downloads and (force or not valid) and not (wheels / pin.wheel).is_file():
            subprocess.run(pip_download_command(pin, wheels), check=True)
        lines.append(fetch(pin, root=root, wheels=wheels, force=force))
    return lines


def _tree_valid(tree, root) -> bool:
    try:
        load_tree(tree, root)
    except PeerCacheError:
        return False
    return True


def installed_cuda_peer(module: str, package: str, pinned: str, fn, *, why: str = "CUDA only",
                        inplace: bool = True, tokens: int = 8, heads: int = 2,
                        head_dim: int = KIMI_HEAD_DIM) -> tuple[bool, str]:
    """(runs here, why not) for a CUDA-only peer: its module must import, a CUDA
    device must be there, and a tiny float64 check must pass (``fn`` rotates the
    packed-qkv views in place, or returns new q/k when ``inplace`` is False) on
    ``tokens`` x ``heads`` x ``head_dim`` (Kimi's 72 by default; a peer that
    rotates only some head_dims checks at one of those and refuses the rest per call)."""
    import importlib.util

    import torch

    from rope_kernels.kernels.switches import triton_interpreter_enabled

    if importlib.util.find_spec(module) is None:
        return False, f"{package} not installed (pinned {pinned}; {why})"
    if not torch.cuda.is_available() or triton_interpreter_enabled():
        return False, f"{package} {pinned} loads here but needs a CUDA device ({why})"
    try:
        from rope_kernels.correctness import check_variant

        res = check_variant(fn, tokens=tokens, heads=heads, head_dim=head_dim, device="cuda",
                            inplace=inplace, name=module)
    except Exception as exc:  # noqa: BLE001 - any failure means "does not run here"
        return False, f"{package} failed on this device: {type(exc).__name__}: {exc}"
    if not res.passed:
        return False, (f"{package} ran but disagreed with float64 at {tokens} x {heads} x "
                       f"{head_dim} (max error {res.max_abs_err:.3g})")
    return True, ""



# -- pinned trees: a peer that needs a few hundred KB of an engine's package --------
@dataclass(frozen=True)
class PinnedTree:
    """Part of an engine's wheel a JIT-compiled peer runs: its Python files and the
    CUDA sources and headers its build reads.

    ``members`` are paths inside the wheel; one ending in "/" takes every file under
    that folder. The pin is ``tree_sha256``: the sha256 of the listing
    ``"<file sha256>  <path>\\n"`` over every file, sorted by path (``tree_digest``).
    ``fetch`` writes that listing, file by file, into the tree's manifest; loading
    re-hashes every file against the manifest and the manifest against the pin.
    """

    name: str  # the cache folder: <package>-<version>-<name>
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    python: str
    platform: str
    members: tuple[str, ...]
    tree_sha256: str

    @property
    def key(self) -> str:
        return f"{self.package}-{self.version}-{self.name}"

    def selects(self, path: str) -> bool:
        return any(path == m or (m.endswith("/") and path.startswith(m)) for m in self.members)


TREES: dict[str, PinnedTree] = {
    # SGLang 0.5.23's Kimi-K2.5 RoPE: vision_rope.py's apply_fused_qk_complex_rope_inplace
    # -> ops/attention/rope.py apply_rope_inplace -> load_jit (jit/utils) builds
    # jit/csrc/elementwise/rope.cuh with the jit/include headers.
    "sglang_jit": PinnedTree(
        "jit", "sglang", "0.5.23", PINS["sglang"].wheel, PINS["sglang"].wheel_sha256,
        PINS["sglang"].python, PINS["sglang"].platform,
        ("sglang/kernels/jit/__init__.py", "sglang/kernels/jit/utils/",
         "sglang/kernels/jit/include/", "sglang/kernels/jit/csrc/elementwise/rope.cuh",
         "sglang/kernels/ops/attention/rope.py", "sglang/kernels/ops/attention/vision_rope.py"),
        "b3c2e48306056c2f8d5004acd0b18c0f6c6293af2bc264726bc0e17d075b81a6",
    ),
    # FlashInfer 0.7.4's flashinfer.rope (apply_rope_with_cos_sin_cache_inplace): the
    # Python files `import flashinfer.rope` loads without the package's __init__, and
    # the sources and headers of its JIT module "rope" (gen_rope_module).
    "flashinfer_rope": PinnedTree(
        "rope", "flashinfer-python", "0.7.4", "flashinfer_python-0.7.4-py3-none-any.whl",
        "a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32", "3.12", "any",
        tuple(f"flashinfer/{p}" for p in (
            "_build_meta.py", "api_logging.py", "compilation_context.py", "rope.py",
            "utils.py", "version.py", "jit/_cuda_architecture.py", "jit/core.py",
            "jit/cpp_ext.py", "jit/env.py", "jit/rope.py", "jit/spdlog.py", "jit/utils.py",
            "trace/__init__.py", "trace/solution.py", "trace/template.py",
            "trace/templates/__init__.py", "trace/templates/_init_helpers.py",
            "trace/templates/rope.py", "data/csrc/rope.cu", "data/csrc/flashinfer_rope_binding.cu",
            "data/csrc/tvm_ffi_utils.h",
            # what rope.cu's #include chain reaches in data/include (checked by hand:
            # pos_enc.cuh -> layout, math, page, utils, vec_dtypes -> exception, fastdiv)
            *(f"data/include/flashinfer/{h}" for h in (
                "exception.h", "fastdiv.cuh", "layout.cuh", "math.cuh", "page.cuh",
                "pos_enc.cuh", "utils.cuh", "vec_dtypes.cuh")),
            # fastdiv.cuh's cuda::fast_mod_div (<cuda/cmath>) is in the wheel's CCCL, not
            # in CUDA 13.0's: the JIT build puts data/cccl/libcudacxx/include first on the
            # include path. Carried: the folders holding what rope.cu's build reads there
            # (the CUDA 13.0 compiler's -M for sm_90a, 338 headers) and those headers at their top level,
            # 5 MB of its 11 (the whole would not fit one device call beside bundle b)
            *(f"data/cccl/libcudacxx/include/{p}" for p in (
                "nv/", "cuda/__cccl_config", "cuda/cmath",
                *(f"cuda/{d}/" for d in ("__cmath", "__fwd", "__memory", "__ptx",
                                         "__type_traits")),
                *(f"cuda/std/{h}" for h in ("array", "cfloat", "climits", "cmath", "cstddef",
                                            "cstdint", "initializer_list", "limits",
                                            "version")),
                *(f"cuda/std/{d}/" for d in (
                    "__algorithm", "__bit", "__cccl", "__cmath", "__concepts", "__cstddef",
                    "__cstdlib", "__cstring", "__exception", "__floating_point",
                    "__functional", "__fwd", "__host_stdlib", "__internal", "__iterator",
                    "__limits", "__memory", "__new", "__ranges", "__tuple_dir",
                    "__type_traits", "__utility", "detail")))))),
        "bd5fe81b8d825301e4f8148582b9d9fe9edbb4a8f24226ec2491e8631e78b94b",
    ),
}


def tree_digest(entries: dict[str, str]) -> str:
    """sha256 of the sorted ``"<sha256>  <path>\\n"`` listing of a tree's files."""
    listing = "".join(f"{sha}  {path}\n" for path, sha in sorted(entries.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


@dataclass(frozen=True)
class CachedTree:
    """A verified pinned tree in the cache: where it is, its digest, and the bytes of
    its files as they were hashed (``import_tree`` runs its Python from these)."""

    tree: PinnedTree
    root: Path  # folder holding the wheel's paths (e.g. root / "sglang/kernels/jit")
    sha256: str  # tree_digest, equal to the pin
    files: int
    data: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)


def _unlisted(folder: Path, listed: set[str]) -> list[str]:
    """What the tree's folder holds beyond its manifest's files: extra files (a header
    a compiler would find on the include path), links, pipes. ``__pycache__`` folders
    are passed over: bytecode is never read (``import_tree`` compiles the checked bytes)."""
    parents = {str(Path(p).parent) for p in listed}
    parents |= {str(q) for p in parents for q in Path(p).parents}
    extra = []
    for top, dirs, names in os.walk(folder):
        rel_top = Path(top).relative_to(folder)
        for d in list(dirs):
            rel = (rel_top / d).as_posix()
            if d == "__pycache__":
                dirs.remove(d)
            elif (Path(top) / d).is_symlink() or rel not in parents:
                extra.append(rel + "/")
                dirs.remove(d)
        for n in names:
            rel = (rel_top / n).as_posix()
            if rel == MANIFEST or (rel in listed and not (Path(top) / n).is_symlink()):
                continue
            extra.append(rel)
    return sorted(extra)


def load_tree(tree: PinnedTree, root: Path | None = None) -> CachedTree:
    """The cached tree after reading every file once and hashing it against its
    manifest and the pin; a file the manifest does not list (or a link, or a pipe) in
    the tree's folder is an error naming it."""
    folder = (Path(root) if root is not None else peers_dir()) / tree.key
    manifest_path = folder / MANIFEST
    entries = _read_manifest(manifest_path, tree.package, tree.version, f"{tree.name} files")
    digest = tree_digest(entries)
    if digest != tree.tree_sha256:
        raise PeerCacheError(f"{manifest_path} lists a tree with sha256 {digest}, pinned "
                             f"{tree.tree_sha256}: re-run `python -m rope_kernels peers fetch`")
    extra = _unlisted(folder, set(entries))
    if extra:
        raise PeerCacheError(f"{folder} holds {len(extra)} path(s) its pinned tree does not "
                             f"list ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}): "
                             "a compiler or import could pick them up; re-run `python -m "
                             "rope_kernels peers fetch --force`")
    data = {}
    for path, sha in entries.items():
        location = folder / path
        try:
            data[path] = read_regular(location)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise PeerCacheError(f"cached peer file missing: {location}") from None
        got = hashlib.sha256(data[path]).hexdigest()
        if got != sha:
            raise PeerCacheError(f"cached peer file {location} has sha256 {got}, the pinned "
                                 f"tree says {sha}: re-run `python -m rope_kernels peers fetch`")
    return CachedTree(tree, folder, digest, len(entries), data)


class _VerifiedTreeLoader(importlib.abc.Loader):
    """Runs one of a tree's Python files from the bytes ``load_tree`` hashed: never
    the disk again, never ``__pycache__``. ``__file__`` is the file's real path (the
    engines find their data beside it); tracebacks and ``inspect`` read the checked text."""

    def __init__(self, location: Path, data: bytes):
        self._location, self._data = location, data

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        filename = str(self._location)
        text = self._data.decode("utf-8")
        # mtime None: linecache.checkcache keeps the entry (never re-read from disk)
        linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
        exec(compile(self._data, filename, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> str:
        return self._data.decode("utf-8")


class _VerifiedTreeFinder(importlib.abc.MetaPathFinder):
    """Finds a verified tree's modules by name; a module file under the tree that the
    pin does not list (planted after the check) is an ImportError, not run."""

    def __init__(self, cached: CachedTree):
        self.key = cached.tree.key
        self._root = cached.root
        self._sources = {p: d for p, d in cached.data.items() if p.endswith(".py")}
        self._tops = {p.split("/", 1)[0] for p in self._sources}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] not in self._tops:
            return None
        rel = fullname.replace(".", "/")
        for candidate, package in ((f"{rel}.py", False), (f"{rel}/__init__.py", True)):
            if candidate in self._sources:
                location = self._root / candidate
                return importlib.util.spec_from_file_location(
                    fullname, location, loader=_VerifiedTreeLoader(location, self._sources[candidate]),
                    submodule_search_locations=[str(self._root / rel)] if package else None)
        if (self._root / f"{rel}.py").exists() or (self._root / rel).is_dir():
            raise ImportError(f"{fullname}: {self._root / rel} is not a file of the pinned "
                              f"{self.key} tree; not imported", name=fullname)
        return None


def import_tree(cached: CachedTree) -> None:
    """From now on, import the tree's modules (by their package names) from the bytes
    ``load_tree`` checked; once per tree and process (its modules import more at call
    time, so the finder stays)."""
    for i, finder in enumerate(sys.meta_path):
        if isinstance(finder, _VerifiedTreeFinder) and finder.key == cached.tree.key:
            sys.meta_path[i] = _VerifiedTreeFinder(cached)
            return
    sys.meta_path.insert(0, _VerifiedTreeFinder(cached))


def package_module(name: str, path: Path | None = None) -> types.ModuleType:
    """A package module for sys.modules whose ``__init__`` is not run: submodules load
    from ``path`` (an engine package's __init__ would import the whole engine)."""
    import importlib.machinery

    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []
    module.__package__ = name
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = module.__path__
    module.__spec__ = spec
    return module


def fetch_tree(tree: PinnedTree, *, root: Path | None = None, wheels: Path | None = None,
               force: bool = False) -> str:
    """Cache ``tree``'s files from its pinned wheel; a valid cache is kept."""
    root = Path(root) if root is not None else peers_dir()
    if not force:
        try:
            load_tree(tree, root)
            return f"{tree.key}: cache valid"
        except PeerCacheError:
            pass
    folder = root / tree.key
    pin = PinnedWheel(tree.package, tree.version, tree.wheel, tree.wheel_sha256, tree.python,
                      tree.platform, {})
    with tempfile.TemporaryDirectory(prefix="rope-peer-wheel-") as tmp:
        wheel = _verified_wheel_and_emptied(pin, wheels, Path(tmp), folder)
        entries: dict[str, str] = {}
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.is_dir() or not tree.selects(info.filename):
                    continue
                data = zf.read(info)
                entries[info.filename] = hashlib.sha256(data).hexdigest()
                write_atomic(folder / info.filename, data)
    missing = [m for m in tree.members if not any(p == m or p.startswith(m) for p in entries)]
    if missing:
        raise PeerCacheError(f"{tree.wheel} has no {', '.join(missing)}")
    got = tree_digest(entries)
    if got != tree.tree_sha256:
        raise PeerCacheError(f"{tree.key} from {tree.wheel} has tree sha256 {got}, "
                             f"pinned {tree.tree_sha256}")
    manifest = {"package": tree.package, "version": tree.version, "wheel": tree.wheel,
                "wheel_sha256": tree.wheel_sha256, "tree_sha256": got,
                "files": [{"path": p, "sha256": s} for p, s in sorted(entries.items())]}
    write_atomic(folder / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    return f"{tree.key}: cached {len(entries)} file(s) from {tree.wheel}"
