"""A pinned peer tree runs the bytes it checked, and only them (issue 36 items 1, 16):
no planted ``.pyc``, no file swapped after the check, no unlisted file, link or pipe in
the tree; a named pipe in the cache is an error, not a hang."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import py_compile
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rope_kernels.peers import cache

GENUINE = b'def answer():\n    return "pinned"\n'
SWAPPED = b'def answer():\n    return "swappd"\n'  # same size: a stat-valid .pyc for it
FILES = {"fake_tree_engine/rope.py": GENUINE,
         "fake_tree_engine/jit/__init__.py": b"",
         "fake_tree_engine/jit/core.py": b"from fake_tree_engine.rope import answer\nVALUE = answer()\n",
         "fake_tree_engine/jit/include/a.cuh": b"// header a\n"}


@pytest.fixture
def tree(tmp_path):
    """A pinned tree written into a cache folder as fetch_tree leaves it; sys.meta_path
    and sys.modules are restored afterwards."""
    root = tmp_path / "cache"
    entries = {p: hashlib.sha256(d).hexdigest() for p, d in FILES.items()}
    pin = cache.PinnedTree("jit", "fake-tree-engine", "1.0", "x.whl", "0" * 64, "3.12", "any",
                           ("fake_tree_engine/",), cache.tree_digest(entries))
    folder = root / pin.key
    for p, d in FILES.items():
        (folder / p).parent.mkdir(parents=True, exist_ok=True)
        (folder / p).write_bytes(d)
    (folder / cache.MANIFEST).write_text(json.dumps(
        {"package": pin.package, "version": pin.version,
         "files": [{"path": p, "sha256": s} for p, s in sorted(entries.items())]}))
    meta_path = list(sys.meta_path)
    yield pin, root, folder
    sys.meta_path[:] = meta_path
    for name in [n for n in sys.modules if n.split(".")[0] == "fake_tree_engine"]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _import(cached):
    """What sglang_kimi_k25.source() / flashinfer.source() do: package shim, then import."""
    sys.modules["fake_tree_engine"] = cache.package_module("fake_tree_engine",
                                                           cached.root / "fake_tree_engine")
    return importlib.import_module("fake_tree_engine.rope")


def _plant_pyc(folder: Path) -> None:
    """A .pyc of SWAPPED that the normal import takes as rope.py's (same mtime and size)."""
    src = folder / "fake_tree_engine/rope.py"
    src.write_bytes(SWAPPED)
    py_compile.compile(str(src), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    st = src.stat()
    src.write_bytes(GENUINE)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_planted_pyc_would_run_under_a_plain_import(tree):
    """The check below can fail: Python's own import runs the planted bytecode."""
    _, _, folder = tree
    _plant_pyc(folder)
    sys.path.insert(0, str(folder))
    try:
        importlib.invalidate_caches()
        assert importlib.import_module("fake_tree_engine.rope").answer() == "swappd"
    finally:
        sys.path.remove(str(folder))


def test_a_planted_pyc_never_runs(tree):
    pin, root, folder = tree
    _plant_pyc(folder)
    cached = cache.load_tree(pin, root)
    cache.import_tree(cached)
    module = _import(cached)
    assert module.answer() == "pinned"
    assert module.__file__ == str(folder / "fake_tree_engine/rope.py")
    import inspect
    assert inspect.getsource(module.answer) == GENUINE.decode()
    # a module the first imports, and a package's __init__, come from the checked bytes too
    assert importlib.import_module("fake_tree_engine.jit.core").VALUE == "pinned"


def test_a_file_swapped_after_the_check_never_runs(tree):
    pin, root, folder = tree
    cached = cache.load_tree(pin, root)
    (folder / "fake_tree_engine/rope.py").write_bytes(SWAPPED)
    cache.import_tree(cached)
    assert _import(cached).answer() == "pinned"


def test_a_module_planted_after_the_check_is_not_imported(tree):
    pin, root, folder = tree
    cached = cache.load_tree(pin, root)
    cache.import_tree(cached)
    _import(cached)
    (folder / "fake_tree_engine/evil.py").write_text("RAN = True\n")
    (folder / "fake_tree_engine/evil_pkg").mkdir()
    for name in ("fake_tree_engine.evil", "fake_tree_engine.evil_pkg"):
        with pytest.raises(ImportError, match="not a file of the pinned"):
            importlib.import_module(name)


@pytest.mark.parametrize("plant", ["header", "python", "folder", "link", "linked folder",
                                   "pipe beside", "pipe instead"])
def test_anything_unlisted_in_the_tree_is_refused(tree, plant):
    pin, root, folder = tree
    include = folder / "fake_tree_engine/jit/include"
    if plant == "header":
        (include / "planted.cuh").write_text("#define X 1\n")
    elif plant == "python":
        (folder / "fake_tree_engine/jit/extra.py").write_text("x = 1\n")
    elif plant == "folder":
        (include / "more").mkdir()
    elif plant == "link":  # a listed file replaced by a link to the same bytes
        (folder / "elsewhere.cuh").write_bytes(FILES["fake_tree_engine/jit/include/a.cuh"])
        (include / "a.cuh").unlink()
        (include / "a.cuh").symlink_to(folder / "elsewhere.cuh")
    elif plant == "linked folder":
        (include / "sys").symlink_to("/usr/include")
    elif plant == "pipe beside":
        os.mkfifo(include / "b.cuh")
    else:
        (include / "a.cuh").unlink()
        os.mkfifo(include / "a.cuh")
    with _no_hang():
        with pytest.raises(cache.PeerCacheError, match="does not list|not a regular file"):
            cache.load_tree(pin, root)


def test_bytecode_folders_are_passed_over_not_refused(tree):
    """__pycache__ is never read (the checked bytes are compiled), so one left by an
    earlier import does not make the peer absent."""
    pin, root, folder = tree
    _plant_pyc(folder)
    assert cache.load_tree(pin, root).files == len(FILES)


class _no_hang:
    """Fail instead of waiting forever on a pipe (SIGALRM after 20 s)."""

    def __enter__(self):
        def fail(*_):
            raise TimeoutError("hung reading a named pipe")
        self._old = signal.signal(signal.SIGALRM, fail)
        signal.alarm(20)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self._old)


# -- single pinned files and the manifest ----------------------------------------------
def _single_cache(tmp_path) -> tuple[cache.PinnedWheel, Path]:
    pin = cache.PinnedWheel("fake-single", "1.0", "x.whl", "0" * 64, "3.12", "any",
                            {"fake_single/k.py": hashlib.sha256(GENUINE).hexdigest()})
    folder = tmp_path / "cache" / pin.key
    (folder / "fake_single").mkdir(parents=True)
    (folder / "fake_single/k.py").write_bytes(GENUINE)
    (folder / cache.MANIFEST).write_text(json.dumps(
        {"package": pin.package, "version": pin.version,
         "files": [{"path": "fake_single/k.py", "sha256": pin.files["fake_single/k.py"]}]}))
    return pin, folder


@pytest.mark.parametrize("where", ["fake_single/k.py", cache.MANIFEST])
def test_a_named_pipe_in_the_cache_is_an_error_not_a_hang(tmp_path, where):
    pin, folder = _single_cache(tmp_path)
    assert cache._cached_file(pin, "fake_single/k.py", folder.parent).data == GENUINE
    (folder / where).unlink()
    os.mkfifo(folder / where)
    with _no_hang():
        with pytest.raises(cache.PeerCacheError, match="not a regular file|no manifest"):
            cache._cached_file(pin, "fake_single/k.py", folder.parent)
        assert not cache.cache_valid(pin, folder.parent)
        with pytest.raises(cache.PeerCacheError, match="named pipe"):
            cache.sha256_file(folder / where) if where != cache.MANIFEST else \
                cache.read_regular(folder / where)


def test_peers_status_with_a_pipe_in_the_cache_returns(tmp_path):
    """The CLI's status reads every peer's cache: a pipe in place of a pinned file makes
    that peer absent with the reason, and the command returns."""
    src = Path(os.environ.get("ROPE_PEERS_DIR") or cache.REPO_ROOT / ".peers")
    if not (src / "vllm-0.33.0" / cache.MANIFEST).is_file():
        pytest.skip("no peer cache here: python -m rope_kernels peers fetch")
    copy = tmp_path / "peers"
    shutil.copytree(src, copy, symlinks=True)
    victim = copy / "vllm-0.33.0" / next(iter(cache.PINS["vllm"].files))
    victim.unlink()
    os.mkfifo(victim)
    env = {**os.environ, "ROPE_PEERS_DIR": str(copy), "PYTHONPATH": str(cache.REPO_ROOT)}
    out = subprocess.run([sys.executable, "-m", "rope_kernels", "peers", "status"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not a regular file" in out.stdout and "Traceback" not in out.stderr
