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


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=10)


def _in_own_checkout() -> bool:
    """Whether REPO_ROOT is the top of a git work tree (not a copy inside someone
    else's repository, whose HEAD says nothing about this tree)."""
    top = _git("rev-parse", "--show-toplevel")
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == REPO_ROOT


def git_commit() -> str:
    """HEAD's short hash (+'-dirty' with uncommitted changes). ROPE_STUDY_COMMIT names
    the commit for copies of the tree that travel without .git, or with a stale one;
    where that commit is in this checkout's history the tree is still compared with
    it, so uncommitted changes say '-dirty' whichever way the commit was named."""
    env = os.environ.get("ROPE_STUDY_COMMIT")
    try:
        if not _in_own_checkout():
            return env or "unknown"
        if env:
            commit = _git("rev-parse", "--verify", "--quiet", f"{env.removesuffix('-dirty')}^{{commit}}")
            if commit.returncode != 0 or env.endswith("-dirty"):
                return env  # a commit this copy's git does not hold: nothing to compare with
            base = commit.stdout.strip()
            label = env
        else:
            base = "HEAD"
            head = _git("rev-parse", "--short=12", "HEAD")
            if head.returncode != 0:
                return "unknown"
            label = head.stdout.strip()
        # tracked files against the commit (a stale index is refreshed by git diff)
        diff = _git("diff", "--quiet", base, "--")
    except (OSError, subprocess.SubprocessError):
        return env or "unknown"
    if diff.returncode not in (0, 1):
        return env or "unknown"
    return f"{label}-dirty" if diff.returncode == 1 else label


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
