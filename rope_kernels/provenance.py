"""Which machine a run is on, and the provenance every result row carries: the
repository's root, the device, the versions and the commit. The one home of these
(bench/ writes rows with them, study/ names folders by them); nothing here imports
the rest of the package, and torch only when a device is asked about."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def device_kind() -> str:
    """'cuda', 'rocm' or 'cpu'. ROCm builds of PyTorch also answer to torch.cuda;
    torch.version.hip tells them apart."""
    import torch

    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return "cpu"


def device_name(kind: str | None = None) -> str:
    """The accelerator's marketing name ('NVIDIA H200'), or 'cpu'."""
    import torch

    kind = kind or device_kind()
    if kind in ("cuda", "rocm"):
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def device_slug(name: str) -> str:
    """Folder name for a device: lower case, each run of other characters -> '-'."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"device name must be a non-empty string, got {name!r}")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"device name {name!r} has no letters or digits")
    return slug


def torch_device(kind: str | None = None) -> "torch.device":
    """The torch device for a kind: ROCm GPUs are addressed as 'cuda' in PyTorch."""
    import torch

    kind = kind or device_kind()
    return torch.device("cpu" if kind == "cpu" else "cuda")


def git_commit() -> str:
    """HEAD's short hash (+'-dirty' with uncommitted changes); ROPE_STUDY_COMMIT
    overrides it for copies of the tree that travel without .git."""
    env = os.environ.get("ROPE_STUDY_COMMIT")
    if env:
        return env
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT,
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "absent"


def provenance(kind: str | None = None) -> dict[str, str]:
    """Columns every result row carries."""
    import torch

    kind = kind or device_kind()
    return {
        "device_name": device_name(kind),
        "device_kind": kind,
        "torch_version": torch.__version__,
        "triton_version": triton_version(),
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
