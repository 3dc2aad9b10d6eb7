"""The ``pip download`` line for wheels of a node's Python and platform: used by the
wheelhouse (``infra/wheelhouse.py``) and by the peer cache (``peers/cache.py``, one pinned
wheel). Bottom layer: imports nothing of the package."""

from __future__ import annotations

import re
import sys
from pathlib import Path


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
