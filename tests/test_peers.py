"""The engines' peers: loaded from their pinned files, checked like our own variants.

On the CPU tier the Triton peers (vLLM's packed_qk_rope_ and merged-path rotary,
SGLang's vision_rope) run under Triton's interpreter from the cache that
``python -m rope_kernels peers fetch`` fills (.ci/run does, and sets
ROPE_REQUIRE_PEERS=1 so a missing cache fails instead of skipping).
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from rope_kernels import VARIANTS, peer_status
from rope_kernels.correctness import check_variant, make_inputs
from rope_kernels.bench.launches import count_launches
from rope_kernels.model.vit import EncoderConfig, MoonViTEncoder, encoder_inputs, pick_attention
from rope_kernels.peers import cache

ENGINE_PEERS = ("vllm_packed_qk", "vllm_merged", "sglang_vision", "vllm_rotary_qkv", "tokenspeed_qkv")
PIN_OF = {"vllm_packed_qk": "vllm", "vllm_merged": "vllm", "vllm_rotary_qkv": "vllm",
          "sglang_vision": "sglang", "tokenspeed_qkv": "tokenspeed-kernel"}
# rotates with cos/sin in the data's dtype (flash-attention's rotary asserts it)
LOW_PRECISION_ANGLES = ("vllm_rotary_qkv",)
CUDA_PEERS = ("sglang_kimi_k25", "flashinfer", "quack_qkv", "quack_rotary")  # JIT CUDA / CuTe DSL
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _require_engine_peers():
    missing = [n for n in ENGINE_PEERS if n not in VARIANTS]
    if missing:
        why = {r["name"]: r["reason"] for r in peer_status()}
        msg = "; ".join(f"{n}: {why.get(n, '?')}" for n in missing)
        if os.environ.get("ROPE_REQUIRE_PEERS") == "1":
            pytest.fail(f"engine peers absent ({msg}); run `python -m rope_kernels peers fetch`")
        pytest.skip(f"engine peers absent ({msg}); run `python -m rope_kernels peers fetch`")


@pytest.fixture
def engine_peers():
    _require_engine_peers()


@pytest.mark.parametrize("name", ENGINE_PEERS)
def test_peer_rows_carry_pinned_provenance(name, engine_peers):
    v = VARIANTS[name]
    pin = cache.PINS[PIN_OF[name]]
    assert v.peer_package == pin.package
    if next(r for r in peer_status() if r["name"] == name)["origin"] == "cache":
        assert v.peer_version == pin.version
        assert v.peer_sha256 in pin.files.values()
    for own in ("native", "fused", "fused_inplace", "vllm_merged_recreated"):
        assert VARIANTS[own].peer_columns == {"peer_package": "", "peer_version": "",
                                              "peer_sha256": ""}
    assert VARIANTS["compiled"].peer_package == "torch" and VARIANTS["compiled"].peer_version


@pytest.mark.parametrize("name", ENGINE_PEERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 3, 72), (5, 2, 8), (1, 1, 4)], ids=lambda s: "x".join(map(str, s)))
def test_peer_matches_float64_or_says_why_not(name, dtype, shape, engine_peers, device):
    res = check_variant(VARIANTS[name], tokens=shape[0], heads=shape[1], head_dim=shape[2],
                        dtype=dtype, device=device)
    if name == "sglang_vision" and dtype == torch.float32:
        assert not res.supported and "bfloat16" in res.reason and not res.passed
        return
    if name in LOW_PRECISION_ANGLES and dtype != torch.float32:
        return  # judged against its own rule below (its error is its bf16/fp16 cos/sin's)
    assert res.supported and res.passed, res
    assert res.peer_package == VARIANTS[name].peer_package and res.peer_sha256


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_flash_attention_rotary_error_is_that_of_its_rounded_angles(dtype, engine_peers, device):
    """vllm_rotary_qkv takes cos/sin in the data's dtype: its result is the float64
    rotation by the rounded cos/sin, to within the rounding of one output. The
    correctness rows judge it against the exact angles, so that error is its own."""
    from rope_kernels.correctness import max_abs_error
    from rope_kernels.kernels.reference import rope_reference

    inp = make_inputs(9, 3, 72, dtype, device, seed=11)
    rounded = torch.complex(inp.freqs_cis.real.to(dtype).float(), inp.freqs_cis.imag.to(dtype).float())
    ref_rounded = rope_reference(inp.xq, inp.xk, rounded)
    xq, xk = inp.xq.clone(), inp.xk.clone()  # the inputs' values, for the references
    out = VARIANTS["vllm_rotary_qkv"](inp.xq, inp.xk, inp.freqs_cis)
    ulp = max(r.abs().max().item() for r in ref_rounded) * torch.finfo(dtype).eps
    assert max_abs_error(out, ref_rounded) <= ulp, (max_abs_error(out, ref_rounded), ulp)
    assert not torch.equal(xq, out[0])  # rotated in place: the caller's q changed


def test_unsupported_layout_is_recorded(engine_peers, device):
    res = check_variant(VARIANTS["vllm_packed_qk"], tokens=5, heads=2, head_dim=8,
                        dtype=torch.bfloat16, device=device, packed=False)
    assert not res.supported and "packed" in res.reason
    inp = make_inputs(5, 2, 8, torch.bfloat16, device, packed=False)
    with pytest.raises(ValueError, match="packed qkv"):
        VARIANTS["vllm_packed_qk"](inp.xq, inp.xk, inp.freqs_cis)


def test_sglang_refuses_fp32_with_a_reason(engine_peers, device):
    inp = make_inputs(4, 2, 8, torch.float32, device)
    with pytest.raises(TypeError, match="bfloat16 and float16 only"):
        VARIANTS["sglang_vision"](inp.xq, inp.xk, inp.freqs_cis)


@pytest.mark.parametrize("name", ENGINE_PEERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_peer_launch_counts(name, dtype, engine_peers, device):
    v = VARIANTS[name]
    if v.unsupported(dtype):
        pytest.skip(v.unsupported(dtype))
    inp = make_inputs(6, 2, 8, dtype, device)
    # one call first, as the profiler's warm-up does: tables a peer builds once per
    # freqs_cis (vllm_rotary_qkv's cos/sin in the data's dtype) are not per-call work
    v(inp.xq, inp.xk, inp.freqs_cis)
    total, counts = count_launches(v, inp.xq, inp.xk, inp.freqs_cis)
    assert total == v.launch_count(dtype), counts
    assert {k.removeprefix("triton:") for k in counts if k.startswith("triton:")} \
        == set(v.triton_kernels), counts


def test_packed_call_rotates_like_the_pair_call(engine_peers, device):
    """Variant.packed (how the encoder calls a peer) equals its (xq, xk) call."""
    for name in ENGINE_PEERS + ("native", "fused", "fused_inplace", "vllm_merged_recreated"):
        v = VARIANTS[name]
        inp = make_inputs(6, 2, 8, torch.bfloat16, device, seed=5)
        qkv = inp.qkv.clone()
        from rope_kernels.kernels.reference import cos_sin_views

        q, k, vv = v.packed(qkv, inp.freqs_cis, *cos_sin_views(inp.freqs_cis))
        q2, k2 = v(inp.xq, inp.xk, inp.freqs_cis)
        assert torch.equal(q, q2) and torch.equal(k, k2), name
        assert torch.equal(vv, inp.qkv[:, 2]), name
        if v.packed_fn is not None and v.inplace:
            assert q.data_ptr() == qkv[:, 0].data_ptr(), name  # rotated inside qkv


def test_encoder_runs_the_engines_paths(engine_peers, device):
    cfg = EncoderConfig.small()
    model = MoonViTEncoder(cfg, device=device, dtype=torch.bfloat16, seed=2)
    inp = encoder_inputs([(1, 4, 4)], cfg, device=device, seed=4)
    att = pick_attention(inp.grids, device)
    ref = model(inp.patches, inp.grids, rope="native", attention=att).float()
    tol = 4 * ref.abs().max().item() * 2**-7
    for name in ENGINE_PEERS + ("vllm_merged_recreated",):
        out = model(inp.patches, inp.grids, rope=name, attention=att).float()
        assert (out - ref).abs().max().item() <= tol, name


def test_peer_status_lists_every_peer_with_a_reason():
    rows = {r["name"]: r for r in peer_status()}
    for name in ENGINE_PEERS + ("liger", "compiled") + CUDA_PEERS:
        assert name in rows
        row = rows[name]
        assert row["available"] == (name in VARIANTS), row
        assert row["available"] or row["reason"], row
    if not torch.cuda.is_available():
        for name in CUDA_PEERS:
            assert not rows[name]["available"] and name not in VARIANTS, rows[name]
    from rope_kernels.variants import KNOWN_VARIANTS

    # a peer absent here is still a name the parameters and the GPU registry accept
    assert set(rows) <= set(KNOWN_VARIANTS), set(rows) - set(KNOWN_VARIANTS)


# -- the cache -------------------------------------------------------------------
@pytest.fixture
def cache_copy(tmp_path):
    """A private copy of the vLLM cache entry (the real one must be valid)."""
    pin = cache.PINS["vllm"]
    src = cache.peers_dir() / pin.key
    if not cache.cache_valid(pin):
        _require_engine_peers()
        pytest.skip("vLLM peer cache not valid here")
    shutil.copytree(src, tmp_path / pin.key)
    return tmp_path, pin


def test_tampered_file_is_refused_naming_it(cache_copy):
    root, pin = cache_copy
    path = next(iter(pin.files))
    target = root / pin.key / path
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01  # one byte changed
    target.write_bytes(bytes(data))
    with pytest.raises(cache.PeerCacheError, match=target.name):
        cache.find_source("vllm", path, root=root)
    assert not cache.cache_valid(pin, root)


def test_manifest_cannot_vouch_for_a_changed_file(cache_copy):
    """Editing the file and its manifest entry together is still refused: the pin decides."""
    root, pin = cache_copy
    path = next(iter(pin.files))
    target = root / pin.key / path
    target.write_bytes(target.read_bytes() + b"\n# edited\n")
    manifest_path = root / pin.key / cache.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    for e in manifest["files"]:
        if e["path"] == path:
            e["sha256"] = cache.sha256_file(target)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(cache.PeerCacheError, match="pinned"):
        cache.find_source("vllm", path, root=root)


def test_missing_manifest_or_file_is_a_clear_error(cache_copy):
    root, pin = cache_copy
    path = next(iter(pin.files))
    (root / pin.key / path).unlink()
    with pytest.raises(cache.PeerCacheError, match="missing"):
        cache.find_source("vllm", path, root=root)
    (root / pin.key / cache.MANIFEST).unlink()
    with pytest.raises(cache.PeerCacheError, match="no manifest.*peers fetch"):
        cache.find_source("vllm", path, root=root)


def test_fetch_keeps_a_valid_cache_without_downloading(cache_copy, monkeypatch):
    root, pin = cache_copy

    def no_download(*args, **kwargs):
        raise AssertionError("a valid cache must not be downloaded again")

    monkeypatch.setattr(cache.subprocess, "run", no_download)
    assert cache.fetch_pin(pin, root=root) == f"{pin.key}: cache valid"


def test_fetch_rejects_a_wheel_that_is_not_the_pinned_one(tmp_path):
    pin = cache.PINS["sglang"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / pin.wheel).write_bytes(b"not the wheel")
    with pytest.raises(cache.PeerCacheError, match="sha256"):
        cache.fetch_pin(pin, root=tmp_path / "cache", wheels=wheels)
    assert not (tmp_path / "cache" / pin.key / cache.MANIFEST).exists()


def test_loading_leaves_no_fake_engine_in_sys_modules(engine_peers):
    """The vllm.triton_utils shim exists only while packed_qk_rope.py is imported, the
    tokenspeed_kernel._triton one (stock Triton for its fork) while qkv_rotary.py is."""
    if cache.installed_version("vllm") is None:
        assert "vllm" not in sys.modules and "vllm.triton_utils" not in sys.modules
    if cache.installed_version("tokenspeed-kernel") is None:
        assert "tokenspeed_kernel" not in sys.modules
        assert "tokenspeed_kernel._triton" not in sys.modules
    if cache.installed_version("einops") is None:
        assert "einops" not in sys.modules


def test_transformer_engine_is_recorded_with_why_it_did_not_run():
    row = next(r for r in peer_status() if r["name"] == "transformer_engine")
    assert not row["available"] and "transformer_engine" not in VARIANTS
    assert row["package"] == "transformer-engine" and "64 MiB" in row["reason"]


# -- what runs is what was checked ----------------------------------------------------
GENUINE = b'def answer():\n    return "pinned"\n'
SWAPPED = b'def answer():\n    return "swappd"\n'  # same size


@pytest.fixture
def fake_pin(tmp_path, monkeypatch):
    """A pinned one-file 'engine' in a cache under tmp_path (no wheel needed)."""
    import hashlib

    path = "fakepeer/ops/kernel.py"
    digest = hashlib.sha256(GENUINE).hexdigest()
    pin = cache.PinnedWheel("fakepeer", "1.0", "fakepeer-1.0-py3-none-any.whl", "0" * 64,
                            "3.11", "any", {path: digest})
    monkeypatch.setitem(cache.PINS, "fakepeer", pin)
    folder = tmp_path / pin.key
    (folder / path).parent.mkdir(parents=True)
    (folder / path).write_bytes(GENUINE)
    (folder / cache.MANIFEST).write_text(json.dumps(
        {"package": "fakepeer", "version": "1.0", "files": [{"path": path, "sha256": digest}]}))
    yield tmp_path, path, folder / path
    for name in [n for n in sys.modules if n.startswith("rope_kernels._peer.fakepeer_")]:
        del sys.modules[name]


def test_a_file_swapped_after_the_check_does_not_run(fake_pin):
    """The bytes hashed are the bytes executed, and the source inspect (so Triton) sees."""
    import inspect
    import linecache

    root, path, target = fake_pin
    src = cache.find_source("fakepeer", path, root=root)
    target.write_bytes(SWAPPED)  # between the check and the load
    module = cache.load_module(src)
    assert module.answer() == "pinned"
    assert '"pinned"' in inspect.getsource(module.answer)
    assert inspect.getsource(module) == GENUINE.decode()
    linecache.clearcache()  # then the source is unavailable, never the file on disk
    with pytest.raises(OSError):
        inspect.getsource(module.answer)


def test_a_planted_pyc_does_not_run_and_none_is_written(fake_pin):
    """A __pycache__ entry valid for the genuine file's mtime and size, compiled from other
    source, is what an import would execute; loading a peer never reads (or writes) one."""
    import importlib.util
    import py_compile

    root, path, target = fake_pin
    target.write_bytes(SWAPPED)
    pyc = Path(importlib.util.cache_from_source(str(target)))
    py_compile.compile(str(target), cfile=str(pyc), doraise=True)
    stamp = target.stat().st_mtime
    target.write_bytes(GENUINE)
    os.utime(target, (stamp, stamp))  # the pyc's header now matches the genuine file
    module = cache.load_module(cache.find_source("fakepeer", path, root=root))
    assert module.answer() == "pinned"
    pyc.unlink()
    for name in [n for n in sys.modules if n.startswith("rope_kernels._peer.fakepeer_")]:
        del sys.modules[name]
    cache.load_module(cache.find_source("fakepeer", path, root=root))
    assert not pyc.parent.exists() or not any(pyc.parent.iterdir())


def test_peers_dir_is_absolute_with_home_expanded(tmp_path, monkeypatch):
    """A relative ROPE_PEERS_DIR keeps naming the same folder after a chdir (notebooks run
    in notebooks/), child processes get the absolute path, and '~' is the home folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ROPE_PEERS_DIR", "~/peer-cache")
    assert cache.peers_dir() == tmp_path / "home" / "peer-cache"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROPE_PEERS_DIR", "rel-cache")
    first = cache.peers_dir()
    assert first == tmp_path / "rel-cache"
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert cache.peers_dir() == first
    from rope_kernels.study.runner import kernel_sees_repo

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    kernel_sees_repo()  # what `run` does before it starts a notebook's kernel
    assert os.environ["ROPE_PEERS_DIR"] == str(first)


# -- pinned trees (SGLang's JIT tree, FlashInfer's rope files) ----------------------
def _fake_tree(tmp_path, files: dict[str, bytes]):
    """A wheel in tmp_path/wheels holding ``files``, and a PinnedTree that pins them."""
    import hashlib
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "fake_engine-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr("fake_engine/unrelated.py", b"not selected\n")
    members = ("fake_engine/jit/", "fake_engine/rope.py")
    selected = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()
                if p.startswith("fake_engine/jit/") or p == "fake_engine/rope.py"}
    tree = cache.PinnedTree("jit", "fake-engine", "1.0", wheel.name, cache.sha256_file(wheel),
                            "3.12", "any", members, cache.tree_digest(selected))
    return tree, wheels


TREE_FILES = {"fake_engine/rope.py": b"def rope():\n    return 1\n",
              "fake_engine/jit/include/a.cuh": b"// header a\n",
              "fake_engine/jit/csrc/b.cuh": b"// source b\n"}


def test_tree_fetch_keeps_only_the_pinned_members_and_loads_verified(tmp_path):
    tree, wheels = _fake_tree(tmp_path, TREE_FILES)
    root = tmp_path / "cache"
    assert "cached 3 file(s)" in cache.fetch_tree(tree, root=root, wheels=wheels)
    assert not (root / tree.key / "fake_engine/unrelated.py").exists()
    loaded = cache.load_tree(tree, root)
    assert loaded.sha256 == tree.tree_sha256 and loaded.files == 3
    assert (loaded.root / "fake_engine/rope.py").read_bytes() == TREE_FILES["fake_engine/rope.py"]
    assert cache.fetch_tree(tree, root=root, wheels=wheels).endswith("cache valid")


def test_tree_refuses_a_changed_file_even_with_its_manifest_edited(tmp_path):
    tree, wheels = _fake_tree(tmp_path, TREE_FILES)
    root = tmp_path / "cache"
    cache.fetch_tree(tree, root=root, wheels=wheels)
    target = root / tree.key / "fake_engine/jit/csrc/b.cuh"
    target.write_bytes(b"// edited\n")
    with pytest.raises(cache.PeerCacheError, match="b.cuh"):
        cache.load_tree(tree, root)
    manifest_path = root / tree.key / cache.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    for e in manifest["files"]:
        if e["path"].endswith("b.cuh"):
            e["sha256"] = cache.sha256_file(target)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(cache.PeerCacheError, match="pinned"):
        cache.load_tree(tree, root)


def test_tree_refuses_a_missing_file_and_a_wheel_without_a_member(tmp_path):
    tree, wheels = _fake_tree(tmp_path, TREE_FILES)
    root = tmp_path / "cache"
    cache.fetch_tree(tree, root=root, wheels=wheels)
    (root / tree.key / "fake_engine/rope.py").unlink()
    with pytest.raises(cache.PeerCacheError, match="missing"):
        cache.load_tree(tree, root)
    short = {p: d for p, d in TREE_FILES.items() if p != "fake_engine/rope.py"}
    (tmp_path / "second").mkdir()
    tree2, wheels2 = _fake_tree(tmp_path / "second", short)
    with pytest.raises(cache.PeerCacheError, match="has no fake_engine/rope.py"):
        cache.fetch_tree(tree2, root=tmp_path / "second" / "cache", wheels=wheels2)


def test_tree_fetch_rejects_a_wheel_that_is_not_the_pinned_one(tmp_path):
    """The tree's wheel is checked like a pin's (one helper since issue 44): refused before
    anything is written, an earlier cache left as it was."""
    tree, wheels = _fake_tree(tmp_path, TREE_FILES)
    root = tmp_path / "cache"
    cache.fetch_tree(tree, root=root, wheels=wheels)
    wrong = cache.PinnedTree(**{**tree.__dict__, "wheel_sha256": "0" * 64})
    with pytest.raises(cache.PeerCacheError, match="has sha256 .*, pinned 0000"):
        cache.fetch_tree(wrong, root=root, wheels=wheels, force=True)
    assert cache.load_tree(tree, root).files == 3


def test_tree_refetch_drops_files_the_new_pin_no_longer_selects(tmp_path):
    """A header left behind on disk would still be found by a compiler's include path."""
    tree, wheels = _fake_tree(tmp_path, TREE_FILES)
    root = tmp_path / "cache"
    cache.fetch_tree(tree, root=root, wheels=wheels)
    stale = root / tree.key / "fake_engine/jit/include/a.cuh"
    assert stale.is_file()
    kept = {p: d for p, d in TREE_FILES.items() if "/include/" not in p}
    narrower = cache.PinnedTree(
        **{**tree.__dict__, "members": ("fake_engine/jit/csrc/", "fake_engine/rope.py"),
           "tree_sha256": cache.tree_digest({p: hashlib.sha256(d).hexdigest()
                                             for p, d in kept.items()})})
    assert "cached 2 file(s)" in cache.fetch_tree(narrower, root=root, wheels=wheels)
    assert not stale.exists()


def test_flashinfer_rope_tree_carries_the_cccl_fast_mod_div_it_compiles_against():
    """fastdiv.cuh includes <cuda/cmath> for cuda::fast_mod_div, which CUDA 13.0's own
    CCCL lacks: without the wheel's libcudacxx headers rope.cu does not compile."""
    tree = cache.TREES["flashinfer_rope"]
    inc = "flashinfer/data/cccl/libcudacxx/include/"
    for header in ("cuda/cmath", "cuda/__cmath/fast_modulo_division.h",
                   "cuda/std/detail/__config", "nv/target"):
        assert tree.selects(inc + header), header
    # not the whole 13 MB libcudacxx, nor the cub/thrust folders rope.cu never includes
    assert not tree.selects(inc + "cuda/std/__atomic/api/owned.h")
    assert not any(tree.selects(f"flashinfer/data/cccl/{d}/x.h") for d in ("cub", "thrust"))


def test_pinned_trees_name_their_wheels():
    for tree in cache.TREES.values():
        assert len(tree.wheel_sha256) == 64 and len(tree.tree_sha256) == 64, tree.key
        assert tree.wheel.startswith(tree.package.replace("-", "_") + "-" + tree.version)


# -- tables an engine builds once per forward --------------------------------------
def test_prepared_tables_are_built_once_per_freqs_tensor():
    from rope_kernels.peers.prepared import prepared_count, prepared_per_freqs

    builds = []

    def build(f):
        builds.append(f)
        return f.real.contiguous()

    f = torch.polar(torch.ones(4, 3), torch.rand(4, 3))
    a = prepared_per_freqs(f, "test", build)
    assert prepared_per_freqs(f, "test", build) is a and len(builds) == 1
    g = f.clone()  # equal values, another tensor: its own table
    prepared_per_freqs(g, "test", build)
    assert len(builds) == 2
    f.mul_(1j)  # modified in place: rebuilt
    assert torch.equal(prepared_per_freqs(f, "test", build), f.real) and len(builds) == 3
    before = prepared_count()
    del f, g, builds[:]
    assert prepared_count() == before - 2


# -- the CUDA peers' wrappers off the GPU ------------------------------------------
def test_sglang_shims_keep_sglang_defaults(monkeypatch, tmp_path):
    from rope_kernels.peers.sglang_kimi_k25 import import_shims

    mods = import_shims(tmp_path)
    envs = mods["sglang.srt.environ"].envs
    monkeypatch.delenv("SGLANG_JIT_FORCE_RECOMPILE", raising=False)
    assert envs.SGLANG_SAIL_GPU_ARCH.get() == "native"
    assert envs.SGLANG_JIT_FORCE_RECOMPILE.get() is False
    assert envs.SGLANG_JIT_CACHE_DIR.get() is None
    monkeypatch.setenv("SGLANG_JIT_FORCE_RECOMPILE", "1")
    assert envs.SGLANG_JIT_FORCE_RECOMPILE.get() is True
    register = mods["sglang.srt.utils.custom_op"].register_custom_op

    def f(x):
        return x + 1

    assert register(f) is f and register(op_name="x", mutates_args=["q"])(f) is f
    # package __init__ files are skipped; submodules load from the tree
    assert mods["sglang.kernels.ops.attention"].__path__ == [
        str(tmp_path / "sglang" / "kernels" / "ops" / "attention")]
    assert mods["sglang.srt"].environ is mods["sglang.srt.environ"]


@pytest.mark.parametrize("name", ["sglang_kimi_k25", "quack_qkv", "quack_rotary"])
def test_packed_only_cuda_peers_refuse_other_layouts_with_one_line(name):
    from rope_kernels.peers import quack, sglang_kimi_k25

    fn = {"sglang_kimi_k25": sglang_kimi_k25.sglang_kimi_k25_rope,
          "quack_qkv": quack.quack_qkv_rope, "quack_rotary": quack.quack_rotary_rope}[name]
    inp = make_inputs(5, 2, 8, torch.bfloat16, "cpu", packed=False)
    with pytest.raises(ValueError, match=name):
        fn(inp.xq, inp.xk, inp.freqs_cis)


def test_jit_cuda_peers_refuse_fp32_with_a_reason():
    from rope_kernels.peers.flashinfer import flashinfer_rope
    from rope_kernels.peers.sglang_kimi_k25 import sglang_kimi_k25_rope

    inp = make_inputs(5, 2, 8, torch.float32, "cpu")
    for fn in (sglang_kimi_k25_rope, flashinfer_rope):
        with pytest.raises(TypeError, match="bfloat16 and float16"):
            fn(inp.xq, inp.xk, inp.freqs_cis)


# -- the CUDA peers' wiring, with stand-in engine functions on the CPU ----------------
def _rotate_interleaved(x, cos, sin):
    """What the engines' kernels compute, in fp32: pairs (2j, 2j+1) turned by the angle."""
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def test_sglang_kimi_k25_hands_the_engine_contiguous_copies_and_its_prepared_cache(monkeypatch):
    import types

    from rope_kernels.peers import sglang_kimi_k25 as sk

    calls = []

    def prepare(freqs_cis):  # SGLang's prepare_fused_qk_complex_rope_inplace
        return (torch.cat((freqs_cis.real, freqs_cis.imag), dim=-1),
                torch.arange(freqs_cis.size(0), dtype=torch.long))

    def apply_inplace(q, k, prepared):
        cache, positions = prepared
        calls.append((q, k, cache, positions))
        half = cache.shape[-1] // 2
        cos, sin = cache[positions, :half][:, None], cache[positions, half:][:, None]
        q.copy_(_rotate_interleaved(q, cos, sin))
        k.copy_(_rotate_interleaved(k, cos, sin))
        return q, k

    fake = types.SimpleNamespace(prepare_fused_qk_complex_rope_inplace=prepare,
                                 apply_fused_qk_complex_rope_inplace=apply_inplace)
    monkeypatch.setattr(sk, "source", lambda: ("0.5.23", "x" * 64, "cache", fake))
    res = check_variant(sk.sglang_kimi_k25_rope, tokens=9, heads=3, head_dim=72,
                        dtype=torch.bfloat16, inplace=False)
    assert res.passed and res.inputs_intact, res
    q, k, cache, positions = calls[-1]
    assert q.is_contiguous() and k.is_contiguous()
    assert cache.dtype == torch.float32 and tuple(cache.shape) == (9, 72)
    assert positions.dtype == torch.int64
    inp = make_inputs(9, 3, 72, torch.bfloat16, "cpu")
    f = inp.freqs_cis
    sk.sglang_kimi_k25_rope(inp.xq, inp.xk, f)
    sk.sglang_kimi_k25_rope(inp.xq, inp.xk, f)
    assert calls[-1][2] is calls[-2][2]  # prepared once per freqs_cis, as once per forward
    q, k, v = sk.sglang_kimi_k25_packed(inp.qkv, f)
    assert v.is_contiguous() and torch.equal(v, inp.qkv[:, 2])


def test_flashinfer_gets_kimis_cache_positions_and_interleaved_pairs(monkeypatch):
    import types

    from rope_kernels.peers import flashinfer as fi

    seen = {}

    def apply(positions, query, key, head_size, cache, is_neox=True):
        seen.update(positions=positions, head_size=head_size, cache=cache, is_neox=is_neox)
        half = cache.shape[-1] // 2
        cos, sin = cache[positions, :half][:, None], cache[positions, half:][:, None]
        query.copy_(_rotate_interleaved(query, cos, sin))
        key.copy_(_rotate_interleaved(key, cos, sin))

    fake = types.SimpleNamespace(apply_rope_with_cos_sin_cache_inplace=apply)
    monkeypatch.setattr(fi, "source", lambda: ("0.7.4", "x" * 64, "cache", fake))
    res = check_variant(fi.flashinfer_rope, tokens=9, heads=3, head_dim=80,
                        dtype=torch.bfloat16, inplace=True)  # 72: refused (test_flashinfer_head_dims)
    assert res.passed, res
    assert seen["is_neox"] is False and seen["head_size"] == 80
    assert seen["cache"].is_contiguous() and seen["cache"].dtype == torch.float32
    assert seen["positions"].dtype == torch.int64


@pytest.mark.parametrize("name", ["quack_qkv", "quack_rotary"])
def test_quack_gets_contiguous_fp32_cos_sin_and_the_packed_layout(name, monkeypatch):
    import types

    from rope_kernels.peers import quack

    seen = {}

    def apply_qkv_(qkv, cos, sin, interleaved=False):
        seen.update(shape=tuple(qkv.shape), cos=cos, interleaved=interleaved,
                    grad=torch.is_grad_enabled())
        qk = qkv[:, :, :2]
        qk.copy_(_rotate_interleaved(qk, cos[None, :, None, None], sin[None, :, None, None]))
        return qkv

    def apply_rotary(x, cos, sin, interleaved=False):
        seen.update(shape=tuple(x.shape), cos=cos, interleaved=interleaved, x=x)
        return _rotate_interleaved(x, cos[None, :, None], sin[None, :, None])

    rotary = types.ModuleType("quack.rotary")
    rotary.apply_rotary_emb_qkv_, rotary.apply_rotary = apply_qkv_, apply_rotary
    package = types.ModuleType("quack")
    package.rotary = rotary
    monkeypatch.setitem(sys.modules, "quack", package)
    monkeypatch.setitem(sys.modules, "quack.rotary", rotary)
    fn = quack.quack_qkv_rope if name == "quack_qkv" else quack.quack_rotary_rope
    res = check_variant(fn, tokens=9, heads=3, head_dim=72, dtype=torch.bfloat16,
                        inplace=name == "quack_qkv")
    assert res.passed and res.inputs_intact, res
    assert seen["interleaved"] is True
    assert seen["cos"].is_contiguous() and seen["cos"].dtype == torch.float32
    assert tuple(seen["cos"].shape) == (9, 36)
    if name == "quack_qkv":
        assert seen["shape"] == (1, 9, 3, 3, 72) and seen["grad"] is False
    else:  # one out-of-place call on the q|k view of the packed qkv
        assert seen["shape"] == (1, 9, 6, 72) and seen["x"].stride(-1) == 1
