"""Bundles for an air-gapped GPU node (``python -m rope_kernels carry``) and the script
that installs them there (``tools/device_setup.sh``), on small fake wheels: no download."""

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from rope_kernels.infra import carry

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "device_setup.sh"


def _wheel(path: Path, files: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture
def fake_pins(tmp_path, monkeypatch):
    """Two small peer wheels (one to split) and a toolchain wheel, already 'downloaded'."""
    out = tmp_path / "repo" / ".carry"
    peer = out / "downloads" / "peer"
    big_files = {f"big/lib{i}.so": os.urandom(60_000) + bytes(40_000) for i in range(4)}
    big = _wheel(peer / "big_lib-1.0-py3-none-any.whl", big_files)
    small = _wheel(peer / "small-2.0-py3-none-any.whl", {"small/__init__.py": b"x = 1\n"})
    _wheel(out / "downloads" / "toolchain" / "papermill-9-py3-none-any.whl", {"p.py": b""})
    sha = carry.sha256_file
    pins = (carry.PinnedPeerWheel("small", "2.0", small.name, sha(small)),
            carry.PinnedPeerWheel("big-lib", "1.0", big.name, sha(big)))
    stored = tmp_path / "stored.whl"
    carry.repack_stored(big, stored)
    monkeypatch.setattr(carry, "PEER_WHEELS", pins)
    monkeypatch.setattr(carry, "SPLIT_WHEEL", "big-lib")
    monkeypatch.setattr(carry, "SPLIT_WHEEL_STORED_SHA256", sha(stored))
    return out, big, sha(stored)


def test_repacked_wheel_holds_the_same_files_in_the_same_order(tmp_path):
    files = {"a/x.py": b"print(1)\n" * 50, "a/y.bin": bytes(range(256)) * 40, "z.txt": b"z"}
    wheel = _wheel(tmp_path / "w-1-py3-none-any.whl", files)
    carry.repack_stored(wheel, tmp_path / "s1.whl")
    carry.repack_stored(wheel, tmp_path / "s2.whl")
    assert carry.sha256_file(tmp_path / "s1.whl") == carry.sha256_file(tmp_path / "s2.whl")
    with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(tmp_path / "s1.whl") as b:
        assert [i.filename for i in a.infolist()] == [i.filename for i in b.infolist()]
        assert all(a.read(n) == b.read(n) for n in files)
        assert {i.compress_type for i in b.infolist()} == {zipfile.ZIP_STORED}


def test_bundles_fit_and_split_the_big_wheel(fake_pins):
    out, big, stored_sha = fake_pins
    sizes = carry.build_bundles(out, limit=10 * carry.MiB)
    assert set(sizes) == {"a", "b"} and max(sizes.values()) <= 10 * carry.MiB
    parts = sorted(out.glob("*/*.part-*"))
    assert [p.parent.name for p in parts] == ["a", "b"]
    joined = b"".join(p.read_bytes() for p in parts)
    import lzma

    assert hashlib.sha256(lzma.decompress(joined)).hexdigest() == stored_sha
    assert (out / "b" / "small-2.0-py3-none-any.whl").is_file()
    assert (out / "a" / "toolchain" / "papermill-9-py3-none-any.whl").is_file()


def test_a_bundle_over_the_limit_is_refused_and_none_is_left_half_written(fake_pins):
    out, _, _ = fake_pins
    with pytest.raises(carry.CarryError, match="over the"):
        carry.build_bundles(out, limit=1000)
    assert not (out / "a").exists() and not (out / "b").exists()


def test_a_download_that_is_not_the_pinned_wheel_is_refused(fake_pins, monkeypatch):
    out, big, _ = fake_pins
    big.write_bytes(big.read_bytes() + b"tampered")
    monkeypatch.setattr(carry.subprocess, "run", lambda *a, **k: None)  # "pip" leaves it as is
    with pytest.raises(carry.CarryError, match="pinned"):
        carry.build_bundles(out, limit=10 * carry.MiB)


def _device(tmp_path, out, *calls, pip_log=None, tamper=None):
    """Run device_setup.sh as the node would: call 1 sees only bundle a, call 2 only b."""
    root = tmp_path / "node"
    (root / "tools").mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, root / "tools" / SCRIPT.name)
    recorder = tmp_path / "pip.sh"  # stands in for "python3 -m pip": logs its arguments
    recorder.write_text(f'echo "$*" >> {pip_log}\n')
    env = dict(os.environ, STAGE=str(tmp_path / "q"), SITE=str(tmp_path / "site"),
               PIP=f"bash {recorder}")
    results = []
    for bundle, action in calls:
        shutil.rmtree(root / ".carry", ignore_errors=True)
        shutil.copytree(out / bundle, root / ".carry" / bundle)
        (root / ".peers").mkdir(exist_ok=True)
        if tamper and tamper[0] == bundle:
            target = next((root / ".carry" / bundle).glob(tamper[1]))
            data = bytearray(target.read_bytes())
            data[len(data) // 2] ^= 1
            target.write_bytes(bytes(data))
        results.append(subprocess.run(["bash", "tools/device_setup.sh", action], cwd=root,
                                      env=env, capture_output=True, text=True))
    return results


def test_device_script_joins_checks_and_installs(fake_pins, tmp_path):
    out, big, stored_sha = fake_pins
    carry.build_bundles(out, limit=10 * carry.MiB)
    log = tmp_path / "pip.log"
    stage, install = _device(tmp_path, out, ("a", "stage"), ("b", "install"), pip_log=log)
    assert stage.returncode == 0, stage.stderr
    assert install.returncode == 0, install.stderr
    assert carry.sha256_file(tmp_path / "q" / big.name) == stored_sha
    lines = log.read_text().splitlines()
    assert f"--target {tmp_path / 'site'}" in lines[0] and big.name in lines[0]
    assert "papermill" in lines[1] and "liger-kernel" in lines[2]
    assert "export PYTHONPATH=" in install.stdout and "dsl_packages" in install.stdout


@pytest.mark.parametrize("tamper", [("a", "*.part-aa"), ("b", "*.part-ab"),
                                    ("b", "small-*.whl")], ids=lambda t: t[1])
def test_device_script_refuses_a_changed_file(fake_pins, tmp_path, tamper):
    out, _, _ = fake_pins
    carry.build_bundles(out, limit=10 * carry.MiB)
    log = tmp_path / "pip.log"
    stage, install = _device(tmp_path, out, ("a", "stage"), ("b", "install"), pip_log=log,
                             tamper=tamper)
    failed = stage if tamper[0] == "a" else install
    assert failed.returncode != 0 and "FAILED" in failed.stderr + failed.stdout
    assert not log.exists()  # nothing installed


def test_install_without_a_staged_bundle_says_so(fake_pins, tmp_path):
    out, _, _ = fake_pins
    carry.build_bundles(out, limit=10 * carry.MiB)
    (install,) = _device(tmp_path, out, ("b", "install"))
    assert install.returncode == 2 and "run 'stage'" in install.stderr


@pytest.mark.parametrize("args,says", [
    ([], "usage"), (["D", "0123456789ab"], "usage"), (["A"], "usage"),
    (["B", "2882f31"], "12 hex digits"), (["C", "2882f312be8c-dirty"], "12 hex digits"),
])
def test_study_calls_refuses_a_bad_step_or_commit_before_doing_anything(args, says, tmp_path):
    """tools/study_calls.sh (the GPU study in three device calls) stops with one line
    naming the problem, installing and writing nothing, when the step or the commit it
    would stamp on every row is not right (a short or dirty commit went into rows once)."""
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO / "tools" / "study_calls.sh"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr
    assert not list(tmp_path.iterdir())


# -- bundle c: aiconfigurator-core with the lent GPUs' tables --------------------------------

def _record_line(name: str, data: bytes) -> str:
    import base64

    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


AIC_FILES = {
    "aiconfigurator_core/__init__.py": b"__all__ = []\n",
    "aiconfigurator_core/systems/h200_sxm.yaml": b"name: h200_sxm\n",
    "aiconfigurator_core/systems/b200_sxm.yaml": b"name: b200_sxm\n",
    "aiconfigurator_core/systems/data/h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet": os.urandom(3000),
    "aiconfigurator_core/systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet": os.urandom(3000),
    "aiconfigurator_core/systems/data/b200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet": os.urandom(3000),
    "aiconfigurator_core/systems/data/h100_pcie/gemm/vllm/0.24.0/gemm_perf.parquet": os.urandom(30),
    # a name that starts like the kept system's is another system
    "aiconfigurator_core/systems/data/h200_sxm_nvl/gemm/vllm/0.24.0/gemm_perf.parquet": os.urandom(30),
    "aiconfigurator_core/systems/data/l4/.gitkeep": b"",
    "aiconfigurator_core-0.12.0.dist-info/METADATA": b"Name: aiconfigurator-core\nVersion: 0.12.0\n",
}


@pytest.fixture
def fake_aic(tmp_path):
    """A small wheel laid out like aiconfigurator-core's, with a RECORD, and its pin."""
    record = "".join(_record_line(n, d) for n, d in AIC_FILES.items())
    record += "aiconfigurator_core-0.12.0.dist-info/RECORD,,\n"
    wheel = _wheel(tmp_path / "aiconfigurator_core-0.12.0-cp311-abi3-manylinux_2_28_x86_64.whl",
                   AIC_FILES | {"aiconfigurator_core-0.12.0.dist-info/RECORD": record.encode()})
    pin = carry.PinnedPeerWheel("aiconfigurator-core", "0.12.0", wheel.name, carry.sha256_file(wheel))
    return tmp_path / "repo" / ".carry", wheel, pin


def _listed(bundle: Path) -> dict[str, str]:
    return {name: sha for sha, name in (line.split("  ", 1) for line in
                                        (bundle / "SHA256SUMS.c").read_text().splitlines())}


def test_aic_bundle_holds_the_wheels_files_less_other_systems_tables(fake_aic):
    out, wheel, pin = fake_aic
    carry.build_aic_bundle(out, wheel=wheel, pin=pin)
    bundle = out / "c"
    listed = _listed(bundle)
    data = sorted(n for n in listed if n.startswith(carry.AIC_DATA))
    assert data == ["aiconfigurator_core/systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
                    "aiconfigurator_core/systems/data/h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"]
    # the other systems' small yaml files stay (aiconfigurator reads every one of them)
    assert "aiconfigurator_core/systems/b200_sxm.yaml" in listed
    assert "aiconfigurator_core-0.12.0.dist-info/METADATA" in listed  # its version for the rows
    (zip_name,) = [p.name for p in bundle.glob("*.zip")]
    with zipfile.ZipFile(bundle / zip_name) as zf, zipfile.ZipFile(wheel) as whl:
        assert sorted(zf.namelist()) == sorted(listed)
        for name, sha in listed.items():  # unmodified: the wheel's bytes, RECORD's digest
            assert hashlib.sha256(zf.read(name)).hexdigest() == sha == hashlib.sha256(whl.read(name)).hexdigest()


def test_the_real_pin_keeps_only_the_h100s_and_h200s_tables():
    """The lent GPU is an H100 SXM or an H200 SXM: the prefill needs the tables of either."""
    assert carry.AIC_SYSTEMS == ("h100_sxm", "h200_sxm")
    assert carry.aic_keeps("aiconfigurator_core/systems/data/h200_sxm/moe/vllm/0.24.0/moe_perf.parquet")
    assert carry.aic_keeps("aiconfigurator_core/systems/data/h100_sxm/moe/vllm/0.24.0/moe_perf.parquet")
    assert not carry.aic_keeps("aiconfigurator_core/systems/data/h100_pcie/moe/vllm/0.24.0/moe_perf.parquet")
    # both systems' tables (23.8 MiB built from the real wheel) leave room for the checkout and
    # .peers in one call's 64 MiB
    assert carry.AIC_LIMIT <= 64 * carry.MiB - 24 * carry.MiB
    assert carry.aic_keeps("aiconfigurator_core/systems/support_matrix/vllm.csv")
    assert not carry.aic_keeps("aiconfigurator_core/systems/data/b200_sxm/moe/vllm/0.24.0/moe_perf.parquet")
    assert not carry.aic_keeps("aiconfigurator_core/systems/data/h200_sxm_nvl/x.parquet")


def test_a_wheel_member_that_does_not_match_its_record_is_refused(fake_aic, tmp_path):
    out, wheel, pin = fake_aic
    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    files["aiconfigurator_core/__init__.py"] += b"# changed\n"
    changed = _wheel(tmp_path / "changed" / wheel.name, files)
    with pytest.raises(carry.CarryError, match="RECORD"):
        carry.build_aic_bundle(out, wheel=changed, pin=carry.PinnedPeerWheel(
            pin.package, pin.version, pin.wheel, carry.sha256_file(changed)))
    with pytest.raises(carry.CarryError, match="pinned"):  # and the pin itself is checked
        carry.build_aic_bundle(out, wheel=changed, pin=pin)
    assert not (out / "c").exists()


def _device_aic(tmp_path, out, tamper=None):
    root = tmp_path / "node"
    (root / "tools").mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, root / "tools" / SCRIPT.name)
    shutil.copytree(out / "c", root / ".carry" / "c")
    if tamper:
        tamper(root / ".carry" / "c")
    env = dict(os.environ, AIC=str(tmp_path / "aic"), SITE=str(tmp_path / "site"))
    run = [subprocess.run(["bash", "tools/device_setup.sh", action], cwd=root, env=env,
                          capture_output=True, text=True) for action in ("aic", "env")]
    return run


def test_device_script_unpacks_and_checks_the_aic_bundle(fake_aic, tmp_path):
    out, wheel, pin = fake_aic
    carry.build_aic_bundle(out, wheel=wheel, pin=pin)
    unpack, env = _device_aic(tmp_path, out)
    assert unpack.returncode == 0, unpack.stderr
    aic = tmp_path / "aic"
    for name, sha in _listed(out / "c").items():
        assert carry.sha256_file(aic / name) == sha
    assert not (aic / "aiconfigurator_core/systems/data/b200_sxm").exists()
    assert f":{aic}" in env.stdout  # on PYTHONPATH in every later call


def _flip_zip(bundle: Path) -> None:
    (zip_path,) = bundle.glob("*.zip")
    data = bytearray(zip_path.read_bytes())
    data[len(data) // 2] ^= 1
    zip_path.write_bytes(bytes(data))


def _swap_member(bundle: Path) -> None:
    """A file changed inside the zip, the zip's own sum redone: only the per-file sums catch it."""
    (zip_path,) = bundle.glob("*.zip")
    with zipfile.ZipFile(zip_path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    name = "aiconfigurator_core/systems/data/h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    files[name] = files[name][:-1] + bytes([files[name][-1] ^ 1])
    zip_path.unlink()
    _wheel(zip_path, files)
    (bundle / "ZIP").write_text(f"{carry.sha256_file(zip_path)}  {zip_path.name}\n")


def _extra_member(bundle: Path) -> None:
    """Another system's table slipped into the zip (zip sum redone): the file count catches it."""
    (zip_path,) = bundle.glob("*.zip")
    with zipfile.ZipFile(zip_path, "a") as zf:
        zf.writestr("aiconfigurator_core/systems/data/b200_sxm/x.parquet", b"x")
    (bundle / "ZIP").write_text(f"{carry.sha256_file(zip_path)}  {zip_path.name}\n")


@pytest.mark.parametrize("tamper", [_flip_zip, _swap_member, _extra_member], ids=lambda f: f.__name__)
def test_device_script_refuses_a_changed_aic_bundle(fake_aic, tmp_path, tamper):
    out, wheel, pin = fake_aic
    carry.build_aic_bundle(out, wheel=wheel, pin=pin)
    unpack, env = _device_aic(tmp_path, out, tamper)
    assert unpack.returncode != 0
    assert "FAILED" in unpack.stderr + unpack.stdout or "lists" in unpack.stderr
    assert not (tmp_path / "aic").exists() and f":{tmp_path / 'aic'}" not in env.stdout


@pytest.mark.skipif(not (carry.CARRY_DIR / "c" / "SHA256SUMS.c").is_file(),
                    reason="no .carry/c built here (python -m rope_kernels carry)")
def test_the_built_aic_bundle_predicts_what_the_full_package_does(tmp_path):
    """The real bundle, unpacked by the node's script, in an interpreter that cannot see the
    installed aiconfigurator-core: the same prefill ms and the same provenance in the rows
    as the full package (1 and 16 images of 1024x1024 unchunked: 139.85 and 1392.73 ms in
    STUDY_FACTS), for the H200 and the H100 alike."""
    pytest.importorskip("aiconfigurator_core")
    import sys
    import sysconfig

    listed = _listed(carry.CARRY_DIR / "c")
    assert {n.split("/")[3] for n in listed if n.startswith(carry.AIC_DATA)} == {"h100_sxm", "h200_sxm"}
    (unpack, _) = _device_aic(tmp_path, carry.CARRY_DIR)
    assert unpack.returncode == 0, unpack.stderr
    site = tmp_path / "site-without-aic"  # the venv's packages less aiconfigurator's
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith("aiconfigurator"):
            (site / entry.name).symlink_to(entry)
    script = (
        "import json, pandas as pd, aiconfigurator_core\n"
        "from rope_kernels import prefill as P\n"
        "lat = pd.DataFrame([dict(variant='native', resolution='1024x1024', images=i, mode='eager',\n"
        "                         median_ms=1.0, vit_tokens=4 * 1369 * i) for i in (1, 16)])\n"
        "rows = pd.concat([P.ttft_rows(lat, text_tokens=200, hand=P.PrefillModel(),\n"
        "                              aic=P.choose_prefill(gpu, source='aiconfigurator')[0])\n"
        "                  for gpu in ('NVIDIA H200', 'NVIDIA H100 80GB HBM3')])\n"
        "cols = ['prefill_ms', 'prefill_unchunked_ms', 'prefill_source', 'prefill_package', 'prefill_system',\n"
        "        'prefill_tables_version', 'prefill_tables', 'prefill_note']\n"
        "print(json.dumps({'file': aiconfigurator_core.__file__, 'rows': rows[cols].to_dict('records')}))\n")
    runs = {}
    for where, path, flags in (("full", [REPO], []),
                               ("bundle", [REPO, tmp_path / "aic", site], ["-S"])):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, path)))
        done = subprocess.run([sys.executable, *flags, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[where] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["bundle"]["file"].startswith(str(tmp_path / "aic"))
    assert not runs["full"]["file"].startswith(str(tmp_path))
    assert runs["bundle"]["rows"] == runs["full"]["rows"]
    assert runs["bundle"]["rows"][0]["prefill_package"] == "aiconfigurator-core 0.12.0"
    assert [round(r["prefill_unchunked_ms"], 2) for r in runs["bundle"]["rows"][:2]] == [139.85, 1392.73]
    assert [r["prefill_system"] for r in runs["bundle"]["rows"]] == ["h200_sxm"] * 2 + ["h100_sxm"] * 2
