"""Which machine a run is on (re-exported from ``rope_kernels.provenance``, their one
home, for the notebooks) and the line a report prints about a result file."""

from __future__ import annotations

import re
from pathlib import Path

from rope_kernels.provenance import (  # noqa: F401  (the notebooks' and the study's names)
    REPO_ROOT,
    device_kind,
    device_name,
    device_slug,
    git_commit,
    provenance,
    torch_device,
    triton_version,
)

def resolve_device(requested: str, *, name: str = "--device") -> str:
    """The device kind a run or a notebook uses: ``requested`` ('auto', 'cpu', 'cuda' or
    'rocm'; ``name``: how the caller's option is called, for the messages). 'auto' is what
    PyTorch sees; 'cpu' is always possible; 'cuda' or 'rocm' must be what this machine has
    (a ROCm GPU is not taken for 'cuda', nor the reverse). The one rule of the runner and the
    notebooks (``notebooks.notebook_setup``), which had two that ruled differently on a ROCm
    box (issue 44)."""
    if requested not in ("auto", "cpu", "cuda", "rocm"):
        from rope_kernels.study.parameters import ParameterError
        raise ParameterError(f"{name} must be auto, cpu, cuda or rocm, got {requested!r}")
    found = device_kind()
    if requested == "auto":
        return found
    if requested != "cpu" and found != requested:
        raise RuntimeError(f"{name} {requested} was asked for, but this machine has "
                           f"{'no GPU' if found == 'cpu' else 'a ' + found + ' GPU'} "
                           "visible to PyTorch")
    return requested


DATA_LINE = re.compile(r"^data: (?P<folder>[^/\s]+)/(?P<file>\S+\.csv) commit (?P<commits>\S+) rows (?P<rows>\d+)$")


def data_line(path: Path) -> str:
    """One machine-readable line naming a result file as it is now: its device
    folder and name, the commit(s) its rows were written from and its row count,
    e.g. ``data: nvidia-h200/microbench.csv commit a19d97338d18 rows 540``. Reports
    print it after writing, so a test can tell a report from other data."""
    import csv

    path = Path(path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    commits = sorted({r.get("git_commit") or "none" for r in rows}) or ["none"]
    return f"data: {path.parent.name}/{path.name} commit {','.join(commits)} rows {len(rows)}"
