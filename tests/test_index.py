"""reports/index.html and the cross-device summary: a study run never modifies a
tracked file, the same committed data gives the same bytes, cells are readable."""

import configparser
import re
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from rope_kernels.study import reports, runner
from rope_kernels.study.reports import _summary_table, build_index
from rope_kernels.study.results import upsert_csv
from rope_kernels.study.summary import all_devices, load_device_tables

ROOT = Path(__file__).resolve().parent.parent


def micro_rows(device, commit="aaaaaaaaaaaa", tokens=(4096, 65536)):
    rows = []
    for t in tokens:
        for v, us in (("native", 6.0), ("fused", 1.0)):
            rows.append({"variant": v, "tokens": t, "heads": 16, "head_dim": 72,
                         "dtype": "bfloat16", "mode": "cudagraph", "device_name": device,
                         "median_us": us * t / 1000, "speedup_vs_native": 6.0 / us,
                         "pct_of_copy": 85.0 if v == "fused" else 14.0, "git_commit": commit})
    return rows


def ttft_rows(device, resolutions, mode="cudagraph", commit="bbbbbbbbbbbb"):
    rows = []
    for res, tokens in resolutions:
        for images in (1, 2):
            for v, ms in (("native", 10.0), ("fused", 9.0)):
                rows.append({"variant": v, "resolution": res, "images": images, "mode": mode,
                             "device_name": device, "vit_tokens": tokens * images,
                             "median_ms": ms * images * tokens / 100, "git_commit": commit})
    return rows


def make_clone(tmp_path):
    """A git repo with one committed device (data + a report) and its index."""
    root = tmp_path / "clone"
    (root / "reports" / "big-gpu").mkdir(parents=True)
    upsert_csv(root / "data" / "big-gpu" / "microbench.csv", micro_rows("Big GPU"))
    upsert_csv(root / "data" / "big-gpu" / "encoder_latency.csv", ttft_rows("Big GPU", [("1024x1024", 5476)]))
    (root / "reports" / "big-gpu" / "02_microbench.html").write_text("<html></html>")
    shutil.copytree(ROOT / "notebooks", root / "notebooks",
                    ignore=shutil.ignore_patterns("*.py", ".ipynb_checkpoints"))
    shutil.copytree(ROOT / "params", root / "params")
    (root / ".gitignore").write_text("/data/cpu/\n/reports/cpu/\n/reports/local.html\n*.lock\n")
    build_index(root)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "fixture"], cwd=root, check=True)
    return root


def test_a_cpu_run_leaves_every_tracked_file_alone(tmp_path, monkeypatch):
    root = make_clone(tmp_path)
    index_before = (root / "reports" / "index.html").read_bytes()
    stale = root / "reports" / "cpu" / ".02_microbench.x1y2z3w4.ipynb"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    old = time.time() - 3600
    import os
    os.utime(stale, (old, old))

    def fake_execute(src, dest, params, **kw):
        if "data_dir" in params and src.stem == "02_microbench":
            upsert_csv(Path(params["data_dir"]) / "microbench.csv", micro_rows("cpu", tokens=(16,)))
        dest.write_text("{}")
        return dest

    monkeypatch.setattr(runner, "execute_notebook", fake_execute)
    monkeypatch.setattr(runner, "resolve_device", lambda requested: "cpu")
    monkeypatch.setattr(reports, "notebook_to_html",
                        lambda nb, html, hide_inputs: (Path(html).write_text("x"), Path(html))[1])
    for _ in range(2):
        runner.run_study(root=root, log=lambda *a: None)
    assert (root / "data" / "cpu" / "microbench.csv").exists()
    assert not stale.exists()  # a killed run's leftover is swept at start
    status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", status
    assert (root / "reports" / "index.html").read_bytes() == index_before
    # the local device is in "all", never in "committed"
    assert set(all_devices(root / "data", "all").device) == {"big-gpu", "cpu"}
    assert set(all_devices(root / "data", "committed").device) == {"big-gpu"}
    assert set(load_device_tables(root / "data", "microbench.csv", "committed")
               .device_folder) == {"big-gpu"}


def test_index_is_byte_identical_for_the_same_data(tmp_path):
    root = make_clone(tmp_path)
    first = (root / "reports" / "index.html").read_bytes()
    mtime = (root / "reports" / "index.html").stat().st_mtime_ns
    build_index(root)
    assert (root / "reports" / "index.html").read_bytes() == first
    assert (root / "reports" / "index.html").stat().st_mtime_ns == mtime  # not even rewritten


def test_summary_cells_are_values_not_series_text():
    """A CPU run stores two resolutions per image count; a GPU row may lack the
    encoder figures (NaN makes the tokens column float)."""
    cpu_ttft = pd.DataFrame(ttft_rows("cpu", [("56x56", 16), ("112x84", 48)], mode="eager"))
    cpu_ttft["device_folder"] = "cpu"
    gpu = pd.DataFrame(micro_rows("Big GPU"))
    gpu["device_folder"] = "big-gpu"
    from rope_kernels.study.summary import device_summary

    rows = [{"device": "big-gpu", **device_summary(gpu, pd.DataFrame())},
            {"device": "cpu", **device_summary(pd.DataFrame(), cpu_ttft)}]
    summary = pd.DataFrame(rows)
    assert summary.loc[1, "encoder_resolution"] == "112x84"  # the largest, one value
    page = _summary_table(summary)
    assert "dtype" not in page and "Name:" not in page
    cells = re.findall(r"<td>([^<]*)</td>", page)
    assert "65536" in cells and "65536.00" not in cells
    assert "2" in cells  # encoder images, an integer
    assert "-" in cells  # missing figures


def test_summary_table_refuses_a_non_scalar_cell():
    bad = pd.DataFrame({"device": ["x"], "encoder_native_ms": [pd.Series([1.0, 2.0])]})
    with pytest.raises(TypeError, match="encoder_native_ms"):
        _summary_table(bad)


def _sanitize(text):
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "notebooks" / "nbval_sanitize.cfg")
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section].get("replace", ""), text)
    return text


@pytest.mark.parametrize("stored, now", [("1.2e-07", "4.8e-07"), ("3.0e-07", "1.2e-06"),
                                         ("9.7e-04", "2.4e-04"), ("2.4e-07", "4.9e-07")])
def test_sanitizer_keeps_a_2x_change_in_a_stored_error_visible(stored, now):
    assert _sanitize(f"max_abs_err {stored}") != _sanitize(f"max_abs_err {now}")


def test_sanitizer_still_masks_last_digit_rounding():
    assert _sanitize("max_abs_err 2.3e-07") == _sanitize("max_abs_err 2.4e-07")


def test_local_index_lists_every_device_on_disk_and_marks_the_local_run(tmp_path):
    """A newcomer's own run: reports/index.html (tracked) keeps the committed devices and
    names reports/local.html, which lists the committed device and the local run, marked."""
    root = make_clone(tmp_path)
    index_before = (root / "reports" / "index.html").read_bytes()
    upsert_csv(root / "data" / "cpu" / "microbench.csv", micro_rows("cpu", tokens=(16,)))
    (root / "reports" / "cpu").mkdir()
    for stem in ("02_microbench", "06_summary"):
        (root / "reports" / "cpu" / f"{stem}.html").write_text("<html></html>")
    build_index(root)
    assert (root / "reports" / "index.html").read_bytes() == index_before
    assert "reports/local.html" in index_before.decode()
    local = (root / "reports" / "local.html").read_text()
    assert "href='./cpu/02_microbench.html'" in local and "href='./cpu/06_summary.html'" in local
    assert "href='./big-gpu/02_microbench.html'" in local
    assert "<h3>cpu <span class='note'>(local run, not committed)</span></h3>" in local
    assert "<h3>big-gpu</h3>" in local  # committed: not marked
    assert "<th>cpu</th>" in local or ">cpu<" in local.split("Headline figures per device")[1]
    status = subprocess.run(["git", "status", "--porcelain", "--ignored=no"], cwd=root, capture_output=True,
                            text=True, check=True).stdout
    assert "local.html" not in status


def test_every_report_links_all_six(tmp_path):
    from rope_kernels.study.summaries import QUESTIONS

    root = make_clone(tmp_path)
    first = root / "reports" / "cpu"
    first.mkdir()
    nav = reports._nav("01_kernels", first)  # rendered first: no other report exists yet
    assert len(QUESTIONS) == 6
    for other in QUESTIONS:
        assert (f"(./{other}.html)" in nav) == (other != "01_kernels"), other
    assert "(../local.html)" in nav  # git ignores reports/cpu: a local run links its own index
    assert "(../local.html)" not in reports._nav("02_microbench", root / "reports" / "big-gpu")
