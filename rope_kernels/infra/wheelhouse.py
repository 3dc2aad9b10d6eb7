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

import shutil
import subprocess
from pathlib import Path

# The pip download line lives in the bottom layer (peers/cache.py uses it too)
from rope_kernels.wheels import check_target, pip_download_command, platform_tags  # noqa: F401

TOOLCHAIN = ["papermill", "nbclient", "nbformat", "ipykernel", "nbconvert", "nbval",
             "pytest", "hypothesis", "pyyaml", "tqdm"]
NO_DEPS = ["liger-kernel"]  # would drag in torch and triton


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
