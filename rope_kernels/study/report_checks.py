"""One run, one truth: checks that a committed report holds no failed cell and shows
the data its device folder holds, and that a device folder's CSVs come from one commit.

Reports print a ``data:`` line (``devices.data_line``) for every result file they
wrote or read; ``report_problems`` compares each line with the file as it is now.
"""

from __future__ import annotations

import csv
import html
import json
import re
import subprocess
from pathlib import Path

from rope_kernels.study.devices import DATA_LINE, data_line

FAILED_MARKERS = ("An Exception was encountered", "Traceback (most recent call last)")
NOT_DEVICES = ("reference", "compile", "cpu", "exploration")  # exploration: data a decision cites, not a run


def tracked(root: Path, folder: str) -> list[Path]:
    """Files under ``root/folder`` that git tracks (none without git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=root, capture_output=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [root / p for p in out.decode().split("\0") if p]


def notebook_text(path: Path) -> tuple[list[str], bool]:
    """(every output and markdown text of a notebook, whether any output is an error).

    A cell's stderr stream is left out: it is library logging (Inductor's autotuner logs the
    tracebacks of candidate kernels it discards), not the cell's result, and the HTML export
    drops it; a cell that raised leaves an error output, which is what marks it failed."""
    nb = json.loads(Path(path).read_text())
    texts, error = [], False
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            texts.append("".join(cell.get("source", "")))
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                continue
            if out.get("output_type") == "error":
                error = True
                texts.append("\n".join(out.get("traceback", [])))
            texts.append("".join(out.get("text", "")))
            for value in out.get("data", {}).values():
                texts.append("".join(value) if isinstance(value, list) else str(value))
    return texts, error


def data_lines(texts) -> list[str]:
    """The ``data:`` lines in texts, in order, each once."""
    lines = []
    for text in texts:
        for line in str(text).splitlines():
            if DATA_LINE.match(line.strip()) and line.strip() not in lines:
                lines.append(line.strip())
    return lines


def report_problems(report: Path, data_root: Path) -> list[str]:
    """Why a committed report cannot stand ([] when it can): a failed cell, or a
    ``data:`` line that differs from the file under ``data_root`` (or none at all,
    for a notebook report)."""
    report = Path(report)
    name = f"{report.parent.name}/{report.name}"
    if report.name.endswith(".failed.ipynb"):
        return [f"{name}: a failed run's notebook is committed"]
    problems = []
    if report.suffix == ".ipynb":
        texts, error = notebook_text(report)
        if error:
            problems.append(f"{name}: a cell raised (error output)")
    else:  # tags become line breaks, so a printed line stands alone
        texts = [html.unescape(re.sub(r"<[^>]+>", "\n", report.read_text(errors="replace")))]
    for marker in FAILED_MARKERS:
        if any(marker in t for t in texts):
            problems.append(f"{name}: holds {marker!r}")
    lines = data_lines(texts)
    if report.suffix == ".ipynb" and not lines:
        problems.append(f"{name}: prints no 'data:' line, so nothing ties it to its CSVs (re-run it)")
    for line in lines:
        m = DATA_LINE.match(line)
        path = Path(data_root) / m["folder"] / m["file"]
        if not path.exists():
            problems.append(f"{name}: shows {line!r} but {path.name} is absent from data/{m['folder']}")
        elif data_line(path) != line:
            problems.append(f"{name}: shows {line!r}, the file holds {data_line(path)!r}")
    if report.suffix == ".html":
        sibling = report.with_suffix(".ipynb")
        if sibling.exists():
            missing = [ln for ln in data_lines(notebook_text(sibling)[0]) if ln not in lines]
            if missing:
                problems.append(f"{name}: not exported from {sibling.name} as it is (lacks {missing[0]!r})")
    return problems


def device_commits(folder: Path, files=None) -> dict[str, list[str]]:
    """{file name: its rows' distinct git_commit values} for a device folder's CSVs."""
    out = {}
    for path in sorted(files if files is not None else Path(folder).glob("*.csv")):
        if path.suffix != ".csv":
            continue
        with open(path, newline="") as f:
            out[path.name] = sorted({r.get("git_commit") or "none" for r in csv.DictReader(f)})
    return out


__all__ = ["report_problems", "device_commits", "tracked", "data_lines", "notebook_text", "NOT_DEVICES"]
