"""HTML reports open offline and display their tables and plots."""

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rope_kernels.study.reports import build_index, notebook_to_html, strip_remote_resources

ROOT = Path(__file__).resolve().parent.parent
NETWORK = ("http://", "https://", "//")


class _Resources(HTMLParser):
    """Everything a browser would fetch when opening the page."""

    def __init__(self):
        super().__init__()
        self.fetches, self.scripts, self.tables, self.images = [], [], 0, []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "href", "data", "poster"):
            value = (attrs.get(key) or "").strip()
            if tag in ("script", "link", "img", "iframe", "source", "video", "audio", "object",
                       "embed") and value.startswith(NETWORK):
                self.fetches.append(f"<{tag} {key}={value}>")
        if tag == "script":
            self._in_script = True
        if tag == "table":
            self.tables += 1
        if tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def offline_problems(page: str) -> list[str]:
    parser = _Resources()
    parser.feed(page)
    problems = list(parser.fetches)
    for body in parser.scripts:
        if "import(" in body and any(p in body for p in ("http://", "https://")):
            problems.append("script imports a module from the network")
    lowered = page.lower()
    for needle in ("@import url(http", "@import \"http", "url(http", "url('http", 'url("http'):
        if needle in lowered:
            problems.append(f"stylesheet fetches: {needle}")
    return problems


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A real report: the stored (executed) microbenchmark notebook, exported."""
    out = tmp_path_factory.mktemp("reports") / "02_microbench.html"
    return notebook_to_html(ROOT / "notebooks" / "02_microbench.ipynb", out)


def test_report_opens_offline(report):
    page = report.read_text()
    assert offline_problems(page) == []
    parser = _Resources()
    parser.feed(page)
    assert parser.tables >= 2
    assert any(src.startswith("data:image/png;base64,") for src in parser.images)


def test_report_hides_inputs_by_default(report, tmp_path):
    assert "run_microbench" not in report.read_text()
    shown = notebook_to_html(ROOT / "notebooks" / "02_microbench.ipynb", tmp_path / "k.html",
                             hide_inputs=False)
    assert "run_microbench" in shown.read_text()


def test_the_checker_catches_network_resources():
    bad = ('<html><head><script src="https://cdn.example.com/x.js"></script>'
           '<link rel="stylesheet" href="//fonts.example.com/f.css"></head><body>'
           '<script type="module">await import("https://cdn.example.com/m.mjs")</script></body></html>')
    assert len(offline_problems(bad)) == 3
    assert offline_problems(strip_remote_resources(bad)) == []


def _fixture_root(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    (root / "reports" / "nvidia-h200").mkdir(parents=True)
    (root / "reports" / "nvidia-h200" / "02_microbench.html").write_text("<html>ok</html>")
    (root / "data" / "nvidia-h200").mkdir(parents=True)
    shutil.copytree(ROOT / "data" / "reference", root / "data" / "reference")
    rows = []
    for variant, us in (("native", 100.0), ("fused", 20.0), ("vllm_merged", 120.0)):
        for mode in ("cudagraph", "eager"):
            rows.append({"variant": variant, "tokens": 65536, "heads": 16, "head_dim": 72,
                         "dtype": "bfloat16", "mode": mode, "median_us": us,
                         "speedup_vs_native": 100.0 / us, "pct_of_copy": 2000.0 / us,
                         "device_name": "NVIDIA H200", "git_commit": "abc"})
    pd.DataFrame(rows).to_csv(root / "data" / "nvidia-h200" / "microbench.csv", index=False)
    ttft = [{"variant": v, "resolution": "1024x1024", "images": 16, "mode": "cudagraph",
             "median_ms": ms, "device_name": "NVIDIA H200"}
            for v, ms in (("native", 400.0), ("fused", 370.0), ("none", 365.0))]
    pd.DataFrame(ttft).to_csv(root / "data" / "nvidia-h200" / "ttft.csv", index=False)
    return root


def test_index_links_reports_and_summarises_devices(tmp_path):
    root = _fixture_root(tmp_path)
    index = build_index(root)
    page = index.read_text()
    assert offline_problems(page) == []
    assert "nvidia-h200/02_microbench.html" in page
    assert "5.00" in page  # fused / native
    assert "7.50" in page  # encoder saving %


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _render(url: str, tmp_path: Path, name: str):
    browser = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / ('profile-' + name)}", "--hide-scrollbars",
             "--virtual-time-budget=5000"]
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120).stdout
    shot = tmp_path / f"{name}.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1280,6000", url],
                   capture_output=True, timeout=120)
    import matplotlib.image as mpimg

    return dom, mpimg.imread(str(shot))[..., :3]


needs_chromium = pytest.mark.skipif(
    _chromium() is None and os.environ.get("ROPE_REQUIRE_CHROMIUM") != "1",
    reason="headless Chromium not installed (CI installs Debian's chromium)")


@needs_chromium
def test_chromium_displays_report_plots_and_tables(report, tmp_path):
    dom, pixels = _render(report.as_uri(), tmp_path, "report")
    assert dom.count("<table") >= 2 and "data:image/png;base64" in dom
    colour = pixels.max(axis=-1) - pixels.min(axis=-1)  # saturation: plot lines, not text
    assert (colour > 0.3).sum() > 1000, "no coloured plot pixels rendered"  # a blank page has 0
    assert (pixels.mean(axis=-1) < 0.5).mean() > 0.002, "no dark (text) pixels rendered"


@needs_chromium
def test_chromium_displays_the_index(tmp_path):
    index = build_index(_fixture_root(tmp_path))
    dom, pixels = _render(index.as_uri(), tmp_path, "index")
    assert "<table" in dom and "02_microbench" in dom
    assert (pixels.mean(axis=-1) < 0.5).mean() > 0.001
    assert np.isfinite(pixels).all()


def _noisy_notebook(path: Path) -> Path:
    """An executed notebook with what a real run leaves behind: a warning naming a
    host path, a tqdm bar on stderr, host paths in stdout and in a table."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    cell = new_code_cell("run()", outputs=[
        new_output("stream", name="stderr", text=(
            "/opt/torch/.venv/lib/python3.12/site-packages/torch/profiler/profiler.py:224: "
            "UserWarning: Warning: Profiler clears events at the end of each cycle.\n")),
        new_output("stream", name="stderr", text="\rmicrobench:  50%|█████     | 2/4 [00:34<00:35]"),
        new_output("stream", name="stdout", text=f"results in {ROOT}/data/cpu and /tmp/site/x.py\n"),
        new_output("execute_result", execution_count=1, data={
            "text/plain": "python  /opt/torch/.venv/bin/python",
            "text/html": "<table><tr><td>/tmp/site/tqdm/auto.py</td><td>42 us</td></tr></table>"}),
    ], execution_count=1)
    nbformat.write(new_notebook(cells=[cell]), str(path))
    return path


LEAKS = ("Warning", "%|", "/opt/", "/tmp/site", ".venv", str(ROOT))


def test_report_shows_no_warnings_progress_or_host_paths(tmp_path):
    import nbformat
    from nbconvert import HTMLExporter

    noisy = _noisy_notebook(tmp_path / "noisy.ipynb")
    raw, _ = HTMLExporter(template_name="lab").from_notebook_node(nbformat.read(str(noisy), 4))
    assert all(leak in raw for leak in LEAKS)  # the fixture leaks when exported as is
    page = notebook_to_html(noisy, tmp_path / "noisy.html").read_text()
    assert [leak for leak in LEAKS if leak in page] == []
    assert "results in data/cpu and .../x.py" in page  # stdout kept, paths shortened
    assert "42 us" in page and ".../auto.py" in page


def test_stored_reports_carry_no_host_paths():
    for html in sorted((ROOT / "reports").glob("*/*.html")):
        page = html.read_text()
        assert not [leak for leak in ("/opt/", "/tmp/site", ".venv/") if leak in page], html


def test_coloured_tracebacks_lose_their_host_paths():
    """A failed cell's traceback is ANSI-coloured; the colour code sits right before
    the path ("\\x1b[32m/opt/...") and once hid it from the scrubber."""
    import nbformat

    from rope_kernels.study.reports import clean_outputs

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("1/0")
    cell.outputs = [nbformat.v4.new_output(
        "error", ename="KeyError", evalue="x",
        traceback=["\x1b[36mFile \x1b[39m\x1b[32m/opt/torch/.venv/lib/python3.12/base.py:3641\x1b[39m"])]
    nb.cells.append(cell)
    line = clean_outputs(nb).cells[0].outputs[0].traceback[0]
    assert "/opt/" not in line and ".venv" not in line and "base.py:3641" in line


def test_nav_links_the_reports_a_folder_holds_and_those_a_run_renders_next(tmp_path):
    """A folder re-rendered after a partial run (the H200's: no 01, no 03) names the missing
    reports unlinked instead of linking pages that are not there; mid-run (nothing after
    this report yet) the ones still to come are linked, as a run renders them in order."""
    from rope_kernels.study.reports import _nav

    for stem in ("02_microbench", "04_ttft", "05_qkv_gemm", "06_summary"):
        (tmp_path / f"{stem}.ipynb").write_text("{}")
    nav = _nav("04_ttft", tmp_path)
    assert "01_kernels (not in this run)" in nav and "(./01_kernels.html)" not in nav
    assert "(./02_microbench.html)" in nav and "(./06_summary.html)" in nav
    nav = _nav("06_summary", tmp_path)
    assert "(./03_profile.html)" not in nav and "(./05_qkv_gemm.html)" in nav
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "01_kernels.ipynb").write_text("{}")
    nav = _nav("01_kernels", fresh)  # the first report of a run in order: all six ahead
    assert all(f"(./{s}.html)" in nav for s in ("02_microbench", "03_profile", "06_summary"))
