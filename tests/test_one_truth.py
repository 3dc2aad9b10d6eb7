"""One run, one truth, on the committed results: no committed report holds a failed cell
or shows other data than its device's CSVs, and every GPU device folder's CSVs come
from one commit. These fail until a device's whole study is re-run from one clean
commit and its data/ and reports/ are committed together (issue 16)."""

from __future__ import annotations

import pytest

from rope_kernels.study.devices import REPO_ROOT
from rope_kernels.study.report_checks import NOT_DEVICES, device_commits, report_problems, tracked


def _committed(folder: str):
    files = tracked(REPO_ROOT, folder)
    if not files:
        pytest.skip("no git checkout: the committed files are unknown")
    return files


def test_no_committed_report_is_failed_or_shows_other_data():
    problems = []
    for path in _committed("reports"):
        parts = path.relative_to(REPO_ROOT / "reports").parts
        if len(parts) == 2 and path.suffix in (".ipynb", ".html") and parts[0] not in NOT_DEVICES + ("slurm",):
            problems += report_problems(path, REPO_ROOT / "data")
    assert not problems, "\n".join(problems)


def test_every_gpu_device_folder_shares_one_commit():
    by_folder: dict[str, list] = {}
    for path in _committed("data"):
        parts = path.relative_to(REPO_ROOT / "data").parts
        if len(parts) == 2 and path.suffix == ".csv" and parts[0] not in NOT_DEVICES:
            by_folder.setdefault(parts[0], []).append(path)
    mixed = []
    for folder, files in sorted(by_folder.items()):
        commits = device_commits(REPO_ROOT / "data" / folder, files)
        if len({c for cs in commits.values() for c in cs}) > 1:
            mixed.append(f"data/{folder}: " + "; ".join(f"{n} {', '.join(cs)}" for n, cs in commits.items()))
    assert not mixed, "rows from more than one commit:\n" + "\n".join(mixed)


def test_the_committed_index_is_what_the_committed_results_give(tmp_path):
    """reports/index.html is regenerated from the tracked data and reports, byte for
    byte: an index built before the results were committed ("No results yet") or
    left from an older run fails."""
    import shutil

    from rope_kernels.study.reports import build_index

    for path in _committed("data") + _committed("reports"):
        if path.name == "index.html" and path.parent == REPO_ROOT / "reports":
            continue
        dest = tmp_path / path.relative_to(REPO_ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    built = build_index(tmp_path)
    assert built.read_bytes() == (REPO_ROOT / "reports" / "index.html").read_bytes(), \
        "reports/index.html is stale: run `python -m rope_kernels index` and commit it"
