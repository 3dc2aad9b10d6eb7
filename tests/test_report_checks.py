"""The report checks (rope_kernels.study.report_checks) on synthetic reports: a failed
cell, a stale data line, an HTML not exported from its notebook, mixed commits."""

from __future__ import annotations

import json

import pandas as pd

from rope_kernels.study.devices import data_line
from rope_kernels.study.report_checks import device_commits, report_problems


def _notebook(path, *outputs):
    cells = [{"cell_type": "code", "source": "x", "metadata": {}, "execution_count": 1,
              "outputs": list(outputs)}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def _stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def _data(tmp_path, rows=3, commits=("abc",)):
    dev = tmp_path / "data" / "gpu"
    dev.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"variant": range(rows), "git_commit": [commits[i % len(commits)] for i in range(rows)]}
                 ).to_csv(dev / "microbench.csv", index=False)
    return dev / "microbench.csv"


def test_a_report_that_shows_its_csv_passes_and_a_stale_one_fails(tmp_path):
    csv = _data(tmp_path)
    reports = tmp_path / "reports" / "gpu"
    reports.mkdir(parents=True)
    good = reports / "02_microbench.ipynb"
    _notebook(good, _stream(f"some text\n{data_line(csv)}\n"))
    assert data_line(csv) == "data: gpu/microbench.csv commit abc rows 3"
    assert report_problems(good, tmp_path / "data") == []
    html = reports / "02_microbench.html"
    html.write_text(f"<html><pre>{data_line(csv)}\n</pre></html>")
    assert report_problems(html, tmp_path / "data") == []
    _data(tmp_path, rows=4)  # a later run added rows: both reports are stale now
    assert "rows 4" in report_problems(good, tmp_path / "data")[0]
    assert "rows 4" in report_problems(html, tmp_path / "data")[0]
    _data(tmp_path, rows=3, commits=("def",))  # same count, other commit
    assert "commit def" in report_problems(good, tmp_path / "data")[0]


def test_failed_cells_and_missing_lines_fail(tmp_path):
    csv = _data(tmp_path)
    reports = tmp_path / "reports" / "gpu"
    reports.mkdir(parents=True)
    nb = reports / "02_microbench.ipynb"
    _notebook(nb, _stream(data_line(csv) + "\n"),
              {"output_type": "error", "ename": "RuntimeError", "evalue": "x", "traceback": ["boom"]})
    assert any("raised" in p for p in report_problems(nb, tmp_path / "data"))
    _notebook(nb, _stream(data_line(csv) + "\n"),
              {"output_type": "display_data", "data": {"text/markdown": "An Exception was encountered at cell 3"},
               "metadata": {}})
    assert any("An Exception was encountered" in p for p in report_problems(nb, tmp_path / "data"))
    _notebook(nb, _stream("no provenance\n"))
    assert any("no 'data:' line" in p for p in report_problems(nb, tmp_path / "data"))
    html = reports / "02_microbench.html"
    html.write_text("<pre>Traceback (most recent call last):\n</pre>")
    assert any("Traceback" in p for p in report_problems(html, tmp_path / "data"))
    # a traceback printed to stdout marks the report; one a library logs to stderr (Inductor's
    # autotuner discarding a candidate kernel) does not: the cell ran, and readers never see it
    _notebook(nb, _stream(data_line(csv) + "\nTraceback (most recent call last):\n"))
    assert any("Traceback" in p for p in report_problems(nb, tmp_path / "data"))
    _notebook(nb, _stream(data_line(csv) + "\n"),
              {"output_type": "stream", "name": "stderr",
               "text": "E1203 select_algorithm.py] Traceback (most recent call last):\n"})
    assert report_problems(nb, tmp_path / "data") == []
    failed = reports / "02_microbench.failed.ipynb"
    _notebook(failed, _stream(data_line(csv) + "\n"))
    assert report_problems(failed, tmp_path / "data")


def test_html_not_exported_from_its_notebook_fails(tmp_path):
    csv = _data(tmp_path)
    reports = tmp_path / "reports" / "gpu"
    reports.mkdir(parents=True)
    _notebook(reports / "02_microbench.ipynb", _stream(data_line(csv) + "\n"))
    html = reports / "02_microbench.html"
    html.write_text("<pre>an older export\n</pre>")
    assert any("not exported" in p for p in report_problems(html, tmp_path / "data"))


def test_device_commits(tmp_path):
    csv = _data(tmp_path, commits=("abc", "def"))
    assert device_commits(csv.parent) == {"microbench.csv": ["abc", "def"]}
