"""Wheels for nodes without internet: the notebook and test toolchain only.

GPU nodes already have torch and triton (built for their CUDA or ROCm); what
they lack is papermill, nbclient, ipykernel, nbconvert, nbval and friends. We
download those, with their dependencies, as binary wheels for the node's Python
and platform, so that there

    pip install --no-index --find-links DIR papermill nbclient ipykernel nbconvert nbval

works offline. Packages that depend on torch (liger-kernel) are fetched without
dependencies so that no torch wheel is pulled in. The engines' peers are not
installed there at all: ``python -m rope_kernels wheelhouse`` also fills the
peer-file cache (``rope_kernels.peers.cache``: a few KB from the pinned vLLM and
SGLang wheels, git-ignored in ``.peers/``): copy that folder to the node with the
repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

TOOLCHAIN = ["papermill", "nbclient", "nbformat", "ipykernel", "nbconvert", "nbval",
             "pytest", "hypothesis", "pyyaml", "tqdm"]
NO_DEPS = ["liger-kernel"]  # would drag in torch and triton


def platform_tags(platform: str) -> list[str]:
    """pip matches --platform tags exactly; a manylinux_2_N machine also runs
    wheels for every older glibc, so list them all (plus the legacy aliases)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for n, name in legacy.items() if n <= minor]
    return tags


def check_target(python: str, platform: str) -> None:
    """The node's Python (3.N) and wheel platform tag, as pip's --python-version and
    --platform take them; a ``ValueError`` naming the option otherwise."""
    if not isinstance(python, str) or not re.fullmatch(r"3\.\d+", python):
        raise ValueError(f"--python must look like 3.12, got {python!r}")
    if not isinstance(platform, str) or not (
            platform == "any" or re.fullmatch(r"[a-z0-9]+(_[A-Za-z0-9]+)+", platform)):
        raise ValueError(f"--platform must be a wheel platform tag such as "
                         f"manylinux_2_28_x86_64, got {platform!r}")


def pip_download_command(out: Path, python: str, platform: str, packages: list[str],
                         *, no_deps: bool = False) -> list[str]:
    check_target(python, platform)
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(out),
           "--python-version", python, "--implementation", "cp"]
    for tag in dict.fromkeys(platform_tags(platform) + ["any"]):
        cmd += ["--platform", tag]
    if no_deps:
        cmd.append("--no-deps")
    return cmd + packages


def build_wheelhouse(out: Path, python: str = "3.12", platform: str = "manylinux_2_28_x86_64",
                     *, peers: bool = True) -> list[Path]:
    """Download the toolchain wheels into ``out``; returns the wheel files. The
    arguments are checked before anything is made, and a folder this call made is
    removed again when a download fails (a folder that existed is left as it was)."""
    check_target(python, platform)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(pip_download_command(out, python, platform, TOOLCHAIN), check=True)
        if peers:
            subprocess.run(pip_download_command(out, python, platform, NO_DEPS, no_deps=True),
                           check=True)
    except BaseException:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return sorted(out.glob("*.whl"))
