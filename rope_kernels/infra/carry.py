"""Bundles that carry the CUDA peers and the notebook toolchain to an air-gapped GPU node.

A device call takes the checkout (about 6 MB) plus git-ignored folders, 64 MiB in
all. QuACK needs nvidia-cutlass-dsl, whose cu13 libraries wheel alone is 88 MiB, and
the notebook toolchain (papermill, nbclient, ipykernel, nbval, ...) is another 21 MiB,
so ``python -m rope_kernels carry`` packs three bundles, each at most ``BUNDLE_LIMIT``:

- ``.carry/a``: the toolchain wheelhouse (``rope_kernels.infra.wheelhouse``) and the first part of
  the cu13 wheel; call 1 stages it in /tmp/q on the node (``tools/device_setup.sh stage``).
- ``.carry/b``: the other part and the peer wheels (QuACK, cutlass-dsl, apache-tvm-ffi,
  torch-c-dlpack-ext, msgspec, nvidia-ml-py); call 2 carries it with ``.peers`` (the
  SGLang and FlashInfer trees, ``python -m rope_kernels peers fetch``) and runs
  ``tools/device_setup.sh install``: it joins the parts, checks every sha256,
  ``pip install --no-index --no-deps --target /tmp/site`` the peer wheels and
  ``pip install --no-index --find-links`` the toolchain.

- ``.carry/c``: aiconfigurator-core with the H100's and H200's tables only (notebook 04's prefill; call C
  of ``tools/study_calls.sh`` carries it with ``.peers``; ``tools/device_setup.sh aic``).

Every wheel is pinned (version and sha256 of the file PyPI serves). The cu13 wheel
is re-packed without compression (the same files, byte for byte, in the same order),
then xz-compressed (88 MiB -> about 63 MiB) and split; the bundle records the sha256
of the PyPI wheel, the re-packed wheel and the xz stream, and the node checks the
last two after joining and decompressing. Nothing here is committed: ``.carry/`` is
git-ignored, downloads are kept in ``.carry/downloads`` for the next build.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rope_kernels.peers.cache import sha256_file
from rope_kernels.provenance import REPO_ROOT
from rope_kernels.infra.wheelhouse import NO_DEPS, TOOLCHAIN, build_wheelhouse, pip_download_command

MiB = 1 << 20
BUNDLE_LIMIT = 56 * MiB  # what one call takes beside the ~6 MB checkout (64 MiB in all)
CARRY_DIR = REPO_ROOT / ".carry"
PYTHON = "3.12"  # the H200 image's Python
PLATFORM = "manylinux_2_28_x86_64"


@dataclass(frozen=True)
class PinnedPeerWheel:
    package: str
    version: str
    wheel: str
    sha256: str


# What QuACK 0.6.5 and the tvm-ffi JIT peers need beyond the node's torch 2.11+cu130,
# cuda-bindings and einops (seen working on the H200: see STUDY_FACTS "QuACK on the H200").
PEER_WHEELS = (
    PinnedPeerWheel("quack-kernels", "0.6.5", "quack_kernels-0.6.5-py3-none-any.whl",
                    "df1ddd31366c82eb9692fe087c671209189dcbde53c909c81a865d4ee66b158d"),
    PinnedPeerWheel("nvidia-cutlass-dsl", "4.8.1", "nvidia_cutlass_dsl-4.8.1-py3-none-any.whl",
                    "43ed46b21d151aa643c6765457c7310827b938c1cf45d5109a0152de4ef06227"),
    PinnedPeerWheel("nvidia-cutlass-dsl-libs-base", "4.8.1",
                    "nvidia_cutlass_dsl_libs_base-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl",
                    "ac2fd8c7fa3d6ded00917fa7cba8686061005da8c4703c6a29e03c1504543909"),
    PinnedPeerWheel("nvidia-cutlass-dsl-libs-core", "4.8.1",
                    "nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl",
                    "bacc6760e3286db447d45720d32ae58ac2e6cecade1152345ef784b2d5e44431"),
    PinnedPeerWheel("nvidia-cutlass-dsl-libs-cu13", "4.8.1",
                    "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl",
                    "50191a381d8cc1393373ae0bc879b0aefa9a256c23c22d4fa1c2fe3dfe57bc90"),
    PinnedPeerWheel("apache-tvm-ffi", "0.1.15.post2",
                    "apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64."
                    "manylinux_2_28_x86_64.whl",
                    "059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b"),
    PinnedPeerWheel("torch-c-dlpack-ext", "0.1.5",
                    "torch_c_dlpack_ext-0.1.5-cp312-cp312-manylinux_2_24_x86_64."
                    "manylinux_2_28_x86_64.whl",
                    "e6f9da4bb9af70e27facc777458be62e10dbbbddda7672d16138db0553c5a524"),
    PinnedPeerWheel("msgspec", "0.23.0",
                    "msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64."
                    "manylinux_2_28_x86_64.whl",
                    "c08f294663135183bd633efd843645687285a445054a876c37506d4e9de7d80b"),
    PinnedPeerWheel("nvidia-ml-py", "13.615.71", "nvidia_ml_py-13.615.71-py3-none-any.whl",
                    "959bf4adf6fe1308e4bd739e722236b0d1ec8392e2cefad33ff70c311380b9b6"),
)
SPLIT_WHEEL = "nvidia-cutlass-dsl-libs-cu13"  # the one that fits no call: re-packed, xz, split
# sha256 of its uncompressed re-pack (``repack_stored`` is deterministic): what the node installs
SPLIT_WHEEL_STORED_SHA256 = "20ead9f32044f83ee59a8c57085aa5024fd9f620adb6aff894678d8df40546bf"


class CarryError(RuntimeError):
    """A bundle cannot be built: a wheel is not the pinned one, or a bundle is too large."""


def _download(pin: PinnedPeerWheel, dest: Path) -> Path:
    wheel = dest / pin.wheel
    if not wheel.is_file() or sha256_file(wheel) != pin.sha256:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(pip_download_command(dest, PYTHON, PLATFORM,
                                            [f"{pin.package}=={pin.version}"], no_deps=True),
                       check=True)
    if not wheel.is_file():
        raise CarryError(f"pip did not download {pin.wheel}")
    digest = sha256_file(wheel)
    if digest != pin.sha256:
        raise CarryError(f"{wheel} has sha256 {digest}, pinned {pin.sha256}")
    return wheel


def repack_stored(wheel: Path, out: Path) -> None:
    """The same wheel (same files, bytes, order, dates, modes) without compression."""
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            stored = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            stored.external_attr = info.external_attr
            stored.compress_type = zipfile.ZIP_STORED
            zout.writestr(stored, zin.read(info))
    os.replace(tmp, out)


def _xz(src: Path, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    if shutil.which("xz"):
        with open(tmp, "wb") as f:
            subprocess.run(["xz", "-6", "-T0", "-c", str(src)], stdout=f, check=True)
    else:
        with open(src, "rb") as fin, lzma.open(tmp, "wb", preset=6) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    os.replace(tmp, out)


def compressed_wheel(wheel: Path, work: Path, expected_stored: str = "") -> dict:
    """xz of the uncompressed re-pack of ``wheel`` (reused while the record matches)."""
    record_path = work / (wheel.name + ".xz.json")
    xz_path = work / (wheel.name + ".stored.xz")
    source_sha = sha256_file(wheel)
    if record_path.is_file() and xz_path.is_file():
        record = json.loads(record_path.read_text())
        if (record.get("source_sha256") == source_sha
                and record.get("stored_sha256") == (expected_stored or record.get("stored_sha256"))
                and sha256_file(xz_path) == record.get("xz_sha256")):
            return record | {"xz_path": str(xz_path)}
    stored = work / (wheel.name + ".stored")
    repack_stored(wheel, stored)
    if expected_stored and sha256_file(stored) != expected_stored:
        raise CarryError(f"the re-pack of {wheel.name} has sha256 {sha256_file(stored)}, "
                         f"pinned {expected_stored}")
    print(f"compressing {wheel.name} (a few minutes)", flush=True)
    _xz(stored, xz_path)
    record = {"wheel": wheel.name, "source_sha256": source_sha,
              "stored_sha256": sha256_file(stored), "xz_sha256": sha256_file(xz_path)}
    stored.unlink()
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record | {"xz_path": str(xz_path)}


def _sha256_lines(folder: Path, names: list[str]) -> str:
    return "".join(f"{sha256_file(folder / n)}  {n}\n" for n in sorted(names))


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)


def _split(src: Path, first: int, dest_a: Path, dest_b: Path) -> None:
    """Bytes [0, first) to dest_a, the rest to dest_b (what ``split -b`` makes)."""
    with open(src, "rb") as f:
        for dest, size in ((dest_a, first), (dest_b, None)):
            with open(dest, "wb") as out:
                remaining = size
                while remaining is None or remaining > 0:
                    block = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
                    if not block:
                        break
                    out.write(block)
                    if remaining is not None:
                        remaining -= len(block)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def build_bundles(out: Path = CARRY_DIR, *, limit: int = BUNDLE_LIMIT) -> dict[str, int]:
    """Build ``out/a`` and ``out/b``; returns their sizes in bytes. Each is written in a
    temporary folder and renamed into place, so a failed build leaves no half bundle."""
    out = Path(out)
    downloads = out / "downloads"
    peer_dir, tool_dir = downloads / "peer", downloads / "toolchain"
    wheels = {pin.package: _download(pin, peer_dir) for pin in PEER_WHEELS}
    if not tool_dir.is_dir() or not any(tool_dir.glob("*.whl")):
        build_wheelhouse(tool_dir, PYTHON, PLATFORM, peers=True)
    big = compressed_wheel(wheels[SPLIT_WHEEL], downloads, SPLIT_WHEEL_STORED_SHA256)
    xz_path = Path(big["xz_path"])
    xz_name = Path(big["wheel"]).name + ".stored.xz"

    tool_wheels = sorted(tool_dir.glob("*.whl"))
    tool_bytes = sum(w.stat().st_size for w in tool_wheels)
    peer_bytes = sum(wheels[p.package].stat().st_size for p in PEER_WHEELS if p.package != SPLIT_WHEEL)
    xz_bytes = xz_path.stat().st_size
    # balance the two bundles: a = toolchain + first part, b = second part + peer wheels
    first = max(0, min(xz_bytes, (tool_bytes + peer_bytes + xz_bytes) // 2 - tool_bytes))

    staging = {name: out / f".{name}.tmp" for name in ("a", "b")}
    for folder in staging.values():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    a, b = staging["a"], staging["b"]
    for w in tool_wheels:
        _copy(w, a / "toolchain" / w.name)
    _split(xz_path, first, a / f"{xz_name}.part-aa", b / f"{xz_name}.part-ab")
    for pin in PEER_WHEELS:
        if pin.package != SPLIT_WHEEL:
            _copy(wheels[pin.package], b / pin.wheel)
    (a / "TOOLCHAIN").write_text(" ".join(TOOLCHAIN) + "\n" + " ".join(NO_DEPS) + "\n")
    (a / "SHA256SUMS.a").write_text(_sha256_lines(a, [f"{xz_name}.part-aa"] + [
        f"toolchain/{w.name}" for w in tool_wheels]))
    peer_names = [pin.wheel for pin in PEER_WHEELS if pin.package != SPLIT_WHEEL]
    (b / "PEER_WHEELS").write_text("".join(f"{n}\n" for n in peer_names + [Path(big["wheel"]).name]))
    (b / "JOINED").write_text(f"{xz_name} {Path(big['wheel']).name}\n")
    (b / "SHA256SUMS.b").write_text(_sha256_lines(b, [f"{xz_name}.part-ab"] + peer_names))
    # after joining: the xz stream, then the uncompressed re-pack it holds
    (b / "SHA256SUMS.joined").write_text(f"{big['xz_sha256']}  {xz_name}\n"
                                         f"{big['stored_sha256']}  {Path(big['wheel']).name}\n")
    (b / "PROVENANCE.json").write_text(json.dumps({
        "peer_wheels": [pin.__dict__ for pin in PEER_WHEELS],
        "split_wheel": big | {"xz_path": xz_name},
        "note": "the cu13 wheel travels re-packed without compression (same files), xz-compressed"},
        indent=2) + "\n")
    sizes = {name: folder_bytes(folder) for name, folder in staging.items()}
    too_big = {n: s for n, s in sizes.items() if s > limit}
    if too_big:
        raise CarryError(", ".join(f"bundle {n} is {s / MiB:.1f} MiB" for n, s in too_big.items())
                         + f": over the {limit / MiB:.0f} MiB a call can take")
    for name, folder in staging.items():
        final = out / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(folder, final)
    return sizes


def main_sizes(out: Path = CARRY_DIR) -> str:
    """A line per bundle and for .peers, in MiB."""
    from rope_kernels.peers.cache import peers_dir

    lines = [f"{out / n}: {folder_bytes(out / n) / MiB:.1f} MiB" for n in ("a", "b", "c")]
    lines.append(f"{peers_dir()}: {folder_bytes(peers_dir()) / MiB:.1f} MiB (carried with b and c)")
    return "\n".join(lines)



# -- bundle c: aiconfigurator-core with the lent GPUs' tables (notebook 04's TTFT) ----------
#
# Its wheel is 78 MiB, most of it per-system performance tables (systems/data/<system>/,
# 1-13 MB each); the study's device reads only the lent GPU's (``AIC_SYSTEMS``). Bundle c holds
# the wheel's own files, unmodified, less the other systems' data folders (their small system
# yaml files, the support matrix and the reuse manifest stay), re-zipped (23.8 MiB with
# the H100's and H200's tables: within ``AIC_LIMIT``), and lists every
# file with the sha256 the wheel's RECORD gives it; ``tools/device_setup.sh aic`` unpacks it
# and checks every file before it goes on PYTHONPATH.
AIC_WHEEL = PinnedPeerWheel("aiconfigurator-core", "0.12.0",
                            "aiconfigurator_core-0.12.0-cp311-abi3-manylinux_2_28_x86_64.whl",
                            "aadc4aad0a00bf8a61c477c62bef43de479849c3aa0b1c3078068e08309eccc4")
# the lent GPUs, as aiconfigurator names them: an H100 SXM (most often) or an H200 SXM; the
# prefill takes the tables of the GPU that timed the encoder (prefill.aic_system)
AIC_SYSTEMS = ("h100_sxm", "h200_sxm")
AIC_DATA = "aiconfigurator_core/systems/data/"
# call C carries bundle c beside the checkout (about 6 MB) and .peers (about 9 MB): 64 MiB in all
AIC_LIMIT = 40 * MiB


def aic_keeps(name: str, systems: tuple[str, ...] = AIC_SYSTEMS) -> bool:
    """Whether the wheel member ``name`` goes into bundle c: everything but other systems' data."""
    if not name.startswith(AIC_DATA):
        return True
    return name[len(AIC_DATA):].split("/", 1)[0] in systems


def _record_sha256(wheel: zipfile.ZipFile) -> dict[str, str]:
    """{member: hex sha256} from the wheel's RECORD (``sha256=<urlsafe base64>``)."""
    import base64
    import csv
    import io

    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    sums = {}
    for row in csv.reader(io.StringIO(wheel.read(record).decode())):
        if len(row) >= 2 and row[1]:
            algo, _, digest = row[1].partition("=")
            if algo != "sha256":
                raise CarryError(f"{record} gives {row[0]} a {algo} digest, not sha256")
            sums[row[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    # RECORD cannot hold its own digest: the wheel's pinned sha256 vouches for its bytes
    sums[record] = hashlib.sha256(wheel.read(record)).hexdigest()
    return sums


def build_aic_bundle(out: Path = CARRY_DIR, *, wheel: Path | None = None, pin: PinnedPeerWheel = AIC_WHEEL,
                     systems: tuple[str, ...] = AIC_SYSTEMS, limit: int = AIC_LIMIT) -> int:
    """Build ``out/c`` (aiconfigurator-core with ``systems``' tables); returns its size in bytes."""
    out = Path(out)
    wheel = Path(wheel) if wheel else _download(pin, out / "downloads" / "peer")
    if sha256_file(wheel) != pin.sha256:
        raise CarryError(f"{wheel} has sha256 {sha256_file(wheel)}, pinned {pin.sha256}")
    staging = out / ".c.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    zip_name = f"{pin.wheel.split('-')[0]}-{pin.version}-{'-'.join(systems)}.zip"
    kept, dropped = [], 0
    with zipfile.ZipFile(wheel) as zin:
        sums = _record_sha256(zin)
        missing_data = [s for s in systems if not any(n.startswith(f"{AIC_DATA}{s}/") for n in zin.namelist())]
        if missing_data:
            raise CarryError(f"{pin.wheel} has no tables for {', '.join(missing_data)}")
        with zipfile.ZipFile(staging / zip_name, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in zin.infolist():
                if info.is_dir():
                    continue
                if not aic_keeps(info.filename, systems):
                    dropped += info.file_size
                    continue
                data = zin.read(info)
                if hashlib.sha256(data).hexdigest() != sums.get(info.filename):
                    raise CarryError(f"{info.filename} in {pin.wheel} does not match its RECORD")
                member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                member.external_attr = info.external_attr
                member.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(member, data)
                kept.append(info.filename)
    (staging / "SHA256SUMS.c").write_text("".join(f"{sums[n]}  {n}\n" for n in sorted(kept)))
    (staging / "ZIP").write_text(f"{sha256_file(staging / zip_name)}  {zip_name}\n")
    (staging / "PROVENANCE.json").write_text(json.dumps({
        "wheel": pin.__dict__, "systems": list(systems), "files": len(kept),
        "dropped_bytes": dropped,
        "note": "the wheel's files, unmodified, less systems/data/<system>/ of the other systems; "
                "SHA256SUMS.c gives each the sha256 of the wheel's RECORD"}, indent=2) + "\n")
    size = folder_bytes(staging)
    if size > limit:
        raise CarryError(f"bundle c is {size / MiB:.1f} MiB: over the {limit / MiB:.0f} MiB it may take")
    shutil.rmtree(out / "c", ignore_errors=True)
    os.replace(staging, out / "c")
    return size
