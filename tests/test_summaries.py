"""Reports, the index and the README answer first, with text generated from the rows
(rope_kernels.study.summaries), and the committed ones say what the committed rows give."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from rope_kernels.study import summaries as S
from rope_kernels.study.findings import DEVICE

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / DEVICE


def _committed_reports():
    out = []
    for page in sorted((ROOT / "reports").glob("*/*.html")):
        if page.stem in S.REPORTS and (ROOT / "data" / page.parent.name).is_dir():
            out.append(page)
    return out


@pytest.mark.parametrize("page", _committed_reports(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_reports_say_what_the_committed_rows_give(page):
    """Each committed report's "What we found" is what summaries.py writes from the committed
    rows of its device (re-render: python -m rope_kernels render-reports)."""
    stored = S.stored_findings(page.read_text())
    assert stored is not None, f"{page.relative_to(ROOT)} has no generated 'What we found' block"
    files = S.load(ROOT / "data" / page.parent.name)
    assert stored == S.findings_html(page.stem, files, page.parent.name), (
        f"{page.relative_to(ROOT)}'s findings differ from data/{page.parent.name}/; "
        "run: python -m rope_kernels render-reports")


def test_the_comparison_can_fail(tmp_path):
    """One fused time changed: the microbenchmark report's block and the README's change."""
    copy = tmp_path / DEVICE
    shutil.copytree(DATA, copy)
    micro = pd.read_csv(copy / "microbench.csv")
    micro.loc[(micro["variant"] == "fused") & (micro["tokens"] == S.BIG), "median_us"] *= 1.5
    micro.to_csv(copy / "microbench.csv", index=False)
    before, after = S.load(DATA), S.load(copy)
    assert S.findings_html("02_microbench", before, DEVICE) != S.findings_html("02_microbench", after, DEVICE)
    assert S.readme_block(before, DEVICE) != S.readme_block(after, DEVICE)


def test_readme_opens_with_the_summary_what_to_ship_and_the_commands():
    readme = (ROOT / "README.md").read_text()
    assert S.readme_summary(readme) == S.readme_block(S.load(DATA), DEVICE), \
        "README.md's summary differs from the rows; run: python -m rope_kernels findings --write"
    first = "\n".join(readme.splitlines()[:40])
    assert S.README_BEGIN in first and S.README_END in first
    for words in ("What the study found", "What to ship", "`make study`", "`make test`"):
        assert words in first, words
    assert first.index("What to ship") < first.index("make study")
    assert "| file | rows |" not in first  # provenance lower down


def test_every_report_has_sentences_and_no_nan():
    files = S.load(DATA)
    for stem in S.REPORTS:
        lines = S.report_lines(stem, files)
        assert 1 <= len(lines) <= 6, stem
        assert not any("nan" in re.findall(r"[a-z]+", line) for line in lines), (stem, lines)
    assert 3 <= len(S.study_lines(files)) <= 5


def test_without_rows_everything_reads_not_measured():
    for stem in S.REPORTS:
        text = " ".join(S.report_lines(stem, {}))
        assert "not measured" in text or "nothing measured" in text, stem
    assert S.answer_table({}).empty
    assert S.headline("02_microbench", {}) is None
    with pytest.raises(ValueError, match="no summary"):
        S.report_lines("99_unknown", {})


def _micro(rows):
    base = {"heads": 16, "head_dim": 72, "dtype": "bfloat16", "pct_of_copy": 50.0, "peer_package": None}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_eager_explained_by_host_and_device_time():
    """With eager rows and host time per call: each of native, ours and the shipped kernels
    shows eager, host and device time, and which are host-bound; without them, 'not measured'."""
    rows = []
    for v, dev, host, place in (("native", 93.0, 110.0, False), ("fused", 15.0, 120.0, False),
                                ("fused_inplace", 15.4, 118.0, True), ("vllm_packed_qk", 43.5, 20.0, True)):
        rows.append({"variant": v, "tokens": S.ONE_IMAGE, "mode": "cudagraph", "median_us": dev, "in_place": place})
        rows.append({"variant": v, "tokens": S.ONE_IMAGE, "mode": "eager", "median_us": host + 5,
                     "host_us": host, "in_place": place})
    [line] = S.eager_lines({"microbench": _micro(rows)})
    assert "fused (ours) 125.0 us (host 120.0 us, device 15.0 us)" in line
    assert "host-bound" in line and "vLLM `packed_qk_rope_` device-bound" in line
    no_host = _micro([r for r in rows if r["mode"] == "cudagraph"])
    [line] = S.eager_lines({"microbench": no_host})
    assert "not measured" in line and "native (PyTorch complex) 93.0 us" in line


def test_ship_says_keep_when_ours_is_not_faster():
    rows = [{"variant": "vllm_packed_qk", "tokens": S.BIG, "mode": "cudagraph", "median_us": 100.0,
             "in_place": True, "peer_package": "vllm", "peer_version": "0.33.0"},
            {"variant": "fused_inplace", "tokens": S.BIG, "mode": "cudagraph", "median_us": 120.0, "in_place": True}]
    vllm, sglang = S.ship_lines({"microbench": _micro(rows)})
    assert vllm.startswith("vLLM: keep") and "0.83x" in vllm
    assert "not measured" in sglang


def _notebook():
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x = 1")
    params.metadata["tags"] = ["parameters"]
    title = nbformat.v4.new_markdown_cell("# 2. Microbenchmarks\n\n**Question.** How fast?")
    prov = nbformat.v4.new_code_cell("provenance()")
    prov.metadata["tags"] = ["appendix"]
    prov.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "prov"}, execution_count=1)]
    raw = pd.DataFrame({"tokens": range(50), "median_us": [1.23456789] * 50})
    bench = nbformat.v4.new_code_cell("bench")
    bench.outputs = [nbformat.v4.new_output("stream", name="stdout", text="step\n" * 30),
                     nbformat.v4.new_output("display_data", data={"text/html": raw.to_html(), "text/plain": "t"}),
                     nbformat.v4.new_output("display_data", data={"text/html": raw.head(3).to_html(),
                                                                  "text/plain": "t"})]
    nb.cells = [params, title, prov, bench, nbformat.v4.new_markdown_cell("## Speedup")]
    return nb


def test_reports_answer_first_and_keep_raw_rows_last(tmp_path):
    from rope_kernels.study.reports import APPENDIX_HEADING, answer_first

    nb = answer_first(_notebook(), "02_microbench", DATA, tmp_path)
    text = [c.source if c.cell_type == "markdown" else
            " ".join(str(o.get("data", {}).get("text/html", o.get("text", ""))) for o in c.outputs)
            for c in nb.cells]
    joined = "\n".join(text)
    order = [joined.index(s) for s in ("# 2. Microbenchmarks", "../index.html", "What we found",
                                       "**Question.**", "## Speedup", APPENDIX_HEADING, "step")]
    assert order == sorted(order), order
    assert any("image/png" in o.get("data", {}) for c in nb.cells[:5] for o in c.get("outputs", []))
    appendix = joined[joined.index(APPENDIX_HEADING):]
    assert appendix.count("<tr") >= 50  # the 50-row table moved
    assert joined[:joined.index(APPENDIX_HEADING)].count("<tr") < 20  # the 3-row one stayed


def test_tables_lose_plain_index_and_nan():
    from rope_kernels.study.reports import tidy_number, tidy_tables

    df = pd.DataFrame({"variant": ["fused", "native"], "launches": [1.0, 6.0], "ms": [1.23456789, float("nan")]})
    page = tidy_tables(df.to_html())
    assert "<th>0</th>" not in page and "<th>1</th>" not in page
    cells = re.findall(r"<td>([^<]*)</td>", page)
    assert cells == ["fused", "1", "1.235", "native", "6", "-"]
    assert page.count("<th>") == 3  # no empty index header
    named = tidy_tables(df.set_index("variant").to_html())
    assert "<th>fused</th>" in named  # a meaningful index stays
    assert tidy_number("87616.0") == "87616" and tidy_number("1376.314") == "1376"
    assert tidy_number("0.0000123") == "1.23e-05" and tidy_number("abc") == "abc"


def test_index_opens_with_the_answer_and_a_narrow_table(tmp_path):
    from rope_kernels.study.reports import build_index

    root = tmp_path
    shutil.copytree(DATA, root / "data" / DEVICE)
    shutil.copytree(ROOT / "data" / "reference", root / "data" / "reference")
    (root / "reports" / DEVICE).mkdir(parents=True)
    (root / "reports" / DEVICE / "02_microbench.html").write_text("<html></html>")
    page = build_index(root, device_folders="all").read_text()
    assert page.index("The answer") < page.index("What to ship") < page.index("<h2>Reports</h2>")
    answer = re.search(r"<table[^>]*answer.*?</table>", page, re.DOTALL).group(0)
    assert len(re.findall(r"<th", answer.split("</thead>")[0])) <= 8
    assert S.QUESTIONS["02_microbench"].split(",")[0] in page
    assert "nan" not in re.findall(r"[a-z]+", answer.lower())


def test_the_appendix_is_collapsed_in_the_html(tmp_path):
    from rope_kernels.study.reports import collapse_appendix, notebook_to_html

    nb_path = tmp_path / "02_microbench.ipynb"
    nbformat.write(_notebook(), str(nb_path))
    page = notebook_to_html(nb_path, tmp_path / "02_microbench.html", data_dir=DATA).read_text()
    details = page.index("<details class='appendix'>")
    assert page.index("What we found") < page.index("Speedup") < details < page.index("step\nstep")
    assert page.index("</details>") > page.rindex("step") and page.index("</details>") < page.index("</main>")
    assert collapse_appendix("<main><div>x</div></main>") == "<main><div>x</div></main>"  # none: unchanged


def test_ttft_sentence_names_the_prefill_source_and_follows_the_rows():
    """04's TTFT sentence: native against the fastest of ours at 1 and the most images under vLLM's
    default (eager), with where the prefill comes from; no rows, no sentence."""
    import pandas as pd

    from rope_kernels.study import summaries as S

    def rows(fused_ms, source="aiconfigurator"):
        out = []
        for n, nat in ((1, 170.0), (16, 1770.0)):
            for v, ms in (("native", nat), ("fused", fused_ms[n])):
                out.append({"variant": v, "resolution": "1024x1024", "images": n, "encoder_policy": "eager",
                            "ttft_ms": ms, "encoder_share_pct": 20.0, "prefill_source": source,
                            "prefill_package": "aiconfigurator-core 0.12.0", "prefill_system": "h200_sxm",
                            "prefill_backend": "vllm", "prefill_tables_version": "0.24.0",
                            "prefill_parallelism": "TP8 + EP8", "prefill_note": "no tables for cpu"})
        return {S.TIME_TO_FIRST_TOKEN_CSV: pd.DataFrame(out)}

    line = S.ttft_lines(rows({1: 168.3, 16: 1752.3}))[0]
    assert "aiconfigurator-core 0.12.0 (h200_sxm" in line
    assert "1 image: native 170.0 ms, fused (ours) 168.3 ms (1.0% less" in line
    assert "16 images: native 1770.0 ms, fused (ours) 1752.3 ms (1.0% less" in line
    assert "the hand model (no tables for cpu)" in S.ttft_lines(rows({1: 168.3, 16: 1752.3}, "hand"))[0]
    assert S.ttft_lines({}) == []


def test_tower_lines_ship_whichever_is_ahead_beyond_noise():
    """README's per-tower line: ours ahead beyond the p20/p80 bands -> ours; the peer ahead
    beyond them -> the peer; overlapping bands -> within noise (each case can fail)."""
    import pandas as pd

    from rope_kernels.study.summaries import tower_ship_lines

    def rows(ours, peer):
        out = []
        for variant, (med, p20, p80), place in (("fused", ours, False), ("quack_rotary", peer, False)):
            out.append(dict(variant=variant, tokens=4096, heads=16, head_dim=72, dtype="bfloat16",
                            mode="cudagraph", rotation="half", tower="qwen3_vl", median_us=med,
                            p20_us=p20, p80_us=p80, in_place=place, pct_of_same_bytes_copy=80.0))
        return {"microbench.csv": pd.DataFrame(out)}

    assert "ship ours" in tower_ship_lines(rows((10, 9.9, 10.1), (12, 11.9, 12.1)))[0]
    assert "ship QuACK" in tower_ship_lines(rows((12, 11.9, 12.1), (10, 9.9, 10.1)))[0]
    assert "within noise" in tower_ship_lines(rows((10, 9, 11), (10.2, 9.5, 11)))[0]


def test_rotate_half_rows_of_a_superseded_kernel_say_so_and_newer_rows_do_not():
    """The committed rotate-half rows time a layout the code has since replaced: the first
    screen says so for that commit's rows; rows of any other commit get no note."""
    micro = pd.read_csv(Path(S.__file__).resolve().parents[2] / "data" / DEVICE / "microbench.csv")
    half = micro[micro["rotation"] == "half"]
    superseded = [c for c in half["git_commit"].astype(str).unique() if c in S.SUPERSEDED_ROWS]
    notes = S.superseded_lines(micro)
    assert len(notes) == len(superseded)
    if superseded:
        assert all("has not run on a GPU yet" in n for n in notes)
        assert all(n in S.readme_block({"microbench.csv": micro}, DEVICE) for n in notes)
    newer = micro.assign(git_commit="0123456789ab")
    assert S.superseded_lines(newer) == []
    assert S.superseded_lines(micro[micro["rotation"] == "pairs"]) == []
