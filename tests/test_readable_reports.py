"""Reports people can read whole: no pandas truncation in notebooks, long outputs scroll
in the HTML export, the index's ratios are oriented and labelled."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from rope_kernels.study.devices import REPO_ROOT


def test_notebook_tables_are_whole():
    from rope_kernels.study.notebooks import notebook_setup

    names = ("display.width", "display.max_columns", "display.max_rows", "display.max_colwidth")
    with pd.option_context(*[x for n in names for x in (n, pd.get_option(n))]):  # restored afterwards
        notebook_setup("cpu")
        df = pd.DataFrame({f"column_{i}": [f"a long value {'x' * 60} {r}" for r in range(120)]
                           for i in range(30)})
        text, page = repr(df), df._repr_html_()
        assert "..." not in text and "…" not in text
        assert "119" in text and "column_29" in text and "x" * 60 in text
        assert "..." not in page and page.count("<tr>") == 120  # every body row


def test_every_notebook_shows_whole_tables():
    """Each notebook's code calls notebook_setup or report_display (06_summary, which needs
    no device, printed its targets' "what" cut at 50 characters before it did), and
    report_display alone gives whole tables."""
    from rope_kernels.study.notebooks import code_cells, notebook_paths, report_display

    for path in notebook_paths():
        code = "\n".join(code_cells(path))
        assert re.search(r"\b(notebook_setup|report_display)\(", code), path.name
    names = ("display.width", "display.max_columns", "display.max_rows", "display.max_colwidth")
    with pd.option_context(*[x for n in names for x in (n, pd.get_option(n))]):
        pd.set_option("display.max_colwidth", 50)
        report_display()
        assert "..." not in repr(pd.DataFrame({"what": ["y" * 120]}))


def test_html_reports_scroll_long_outputs(tmp_path):
    from rope_kernels.study.reports import SCROLL_CSS, notebook_to_html

    page = notebook_to_html(REPO_ROOT / "notebooks" / "06_summary.ipynb", tmp_path / "r.html").read_text()
    assert SCROLL_CSS in page
    selector = SCROLL_CSS.split(",")[0].strip().lstrip(".").split(".")  # the classes it targets
    outputs = re.findall(r'class="([^"]*)"', page)
    assert any(set(selector) <= set(c.split()) for c in outputs), "the CSS targets no output of the report"


def test_index_ratios_are_oriented_and_labelled(tmp_path):
    from rope_kernels.study.reports import build_index

    root = tmp_path
    dev = root / "data" / "gpu-x"
    dev.mkdir(parents=True)
    rows = []
    for v, us, place in (("native", 600.0, False), ("fused", 100.0, False), ("fused_inplace", 110.0, True),
                         ("vllm_packed_qk", 220.0, True), ("vllm_merged", 800.0, False)):
        rows.append({"variant": v, "tokens": 87616, "heads": 16, "head_dim": 72, "dtype": "bfloat16",
                     "mode": "cudagraph", "median_us": us, "speedup_vs_native": 600.0 / us, "in_place": place,
                     "bytes": 1e6, "copy_gbps": 4000.0, "pct_of_copy": 1.0, "device_name": "GPU X",
                     "git_commit": "c0ffee"})
    pd.DataFrame(rows).to_csv(dev / "microbench.csv", index=False)
    (root / "reports" / "gpu-x").mkdir(parents=True)
    page = build_index(root, device_folders="all").read_text()
    assert "merged vLLM / native" not in page
    assert "time of vllm_packed_qk / time of ours" in page and "<td>2.00</td>" in page  # 220 / 110, like for like
    assert "time of vllm_merged / time of ours" in page and "<td>8.00</td>" in page      # 800 / 100
    assert "native time / fused time" in page
    assert "targets (study/targets.py)" in page
