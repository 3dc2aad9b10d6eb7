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
