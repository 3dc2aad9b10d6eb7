"""HTML reports that open offline, and reports/index.html linking every device."""

from __future__ import annotations

import html
import math
import re
import textwrap
import urllib.parse
from pathlib import Path

import pandas as pd

from rope_kernels.study.devices import REPO_ROOT
from rope_kernels.study.results import write_atomic
from rope_kernels.study.summary import all_devices, committed_device_folders

_NETWORK = re.compile(r"(https?:)?//[\w.-]+\.[a-z]{2,}/", re.IGNORECASE)
_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.IGNORECASE | re.DOTALL)
_LINK = re.compile(r"<link\b[^>]*>", re.IGNORECASE)


def _fetches(tag_or_script: str) -> bool:
    if re.search(r"\bsrc\s*=\s*[\"']?(https?:)?//", tag_or_script, re.IGNORECASE):
        return True
    if re.search(r"\bhref\s*=\s*[\"']?(https?:)?//", tag_or_script, re.IGNORECASE):
        return True
    return bool(re.search(r"import\s*\(?\s*[\"'](https?:)?//", tag_or_script))


def strip_remote_resources(page: str) -> str:
    """Drop every <script> and <link> that would fetch from the network when the
    page opens (nbconvert's template carries require.js, MathJax and mermaid
    loaders; the reports need none of them and must open offline)."""
    page = _SCRIPT.sub(lambda m: "" if _fetches(m.group(0)) else m.group(0), page)
    return _LINK.sub(lambda m: "" if _fetches(m.group(0)) else m.group(0), page)


# An absolute path on the machine that ran the notebook (or a virtualenv below it).
_HOST_PATH = re.compile(
    r"(?<![\w.-])(?:/(?:opt|tmp|home|root|usr|var|mnt|scratch|work|srv|private|Users)"
    r"|[\w.-]*\.venv)(?:/[^\s'\"<>:,;()\[\]]+)+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TEXT_MIMES = ("text/plain", "text/html", "text/markdown", "text/latex")


def scrub_host_paths(text: str, root: Path = REPO_ROOT) -> str:
    """Paths inside the checkout become relative; any other host path keeps only its
    file name (``/opt/torch/.venv/.../profiler.py`` -> ``.../profiler.py``)."""
    text = text.replace(str(root) + "/", "").replace(str(root), ".")
    return _HOST_PATH.sub(lambda m: ".../" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


def clean_outputs(nb, root: Path = REPO_ROOT):
    """What a reader should see of an executed notebook: no stderr streams (progress
    bars, warnings, profiler chatter: the runner already showed them on the terminal)
    and no host paths in what remains. Modifies and returns ``nb``."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                if out.name == "stderr":
                    continue
                out.text = scrub_host_paths(out.text, root)
            elif out.output_type in ("display_data", "execute_result"):
                for mime in _TEXT_MIMES:
                    if isinstance(out.data.get(mime), str):
                        out.data[mime] = scrub_host_paths(out.data[mime], root)
            elif out.output_type == "error":
                # colour codes glue to the paths they colour ("\x1b[32m/opt/..."): drop them first
                out.traceback = [scrub_host_paths(_ANSI.sub("", line), root) for line in out.traceback]
            kept.append(out)
        cell.outputs = kept
    return nb


def notebook_to_html(notebook_path: Path, html_path: Path, *, hide_inputs: bool = True,
                     data_dir: Path | None = None) -> Path:
    """Export an executed notebook to a self-contained HTML file (atomically), its
    outputs cleaned for readers (:func:`clean_outputs`) and arranged to answer first
    (:func:`answer_first`: what we found, generated from ``data_dir``'s rows, by default
    ``data/<the report's folder name>``; raw rows and logs last); tables tidied
    (:func:`tidy_tables`)."""
    import nbformat
    from nbconvert import HTMLExporter

    html_path = Path(html_path)
    nb = clean_outputs(nbformat.read(str(notebook_path), as_version=4))
    if data_dir is None:
        data_dir = html_path.resolve().parent.parent.parent / "data" / html_path.parent.name
    nb = answer_first(nb, html_path.stem, Path(data_dir), html_path.parent)
    exporter = HTMLExporter(template_name="lab")
    exporter.exclude_input = hide_inputs
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    body, _ = exporter.from_notebook_node(nb)
    body = body.replace("</head>", f"<style>{SCROLL_CSS}{REPORT_CSS}</style></head>", 1)
    body = collapse_appendix(body)
    write_atomic(html_path, strip_remote_resources(body))
    return html_path


# -- reports that answer first -------------------------------------------------------------

APPENDIX_TAG = "appendix"  # a cell whose outputs are raw rows or provenance: shown last
APPENDIX_HEADING = "## Appendix: raw rows, provenance and run logs"
LONG_TABLE_ROWS = 40  # a table longer than this is raw rows: it goes to the appendix
LONG_LOG_LINES = 12  # a cell's printed lines beyond this are a run log: appendix
REPORT_CSS = (" .what-we-found { border-left: 4px solid #d62728; padding: 0.2rem 1rem; margin: 1rem 0;"
              " background: #fafafa; } .what-we-found li { margin: 0.3rem 0; }"
              " .report-nav { font-size: 0.9rem; }"
              " details.appendix > summary { font: 600 1.2rem system-ui, sans-serif; margin: 2rem 0 1rem;"
              " cursor: pointer; }")


APPENDIX_CELL_ID = "appendix"


def collapse_appendix(page: str) -> str:
    """The appendix (from its heading cell to the end of the notebook) inside a closed
    <details>: a click opens it; the page without one is returned unchanged."""
    start = re.search(r'<div class="jp-Cell [^"]*" id="cell-id=' + APPENDIX_CELL_ID + '">', page)
    end = page.rfind("</main>")
    if start is None or end < start.start():
        return page
    return (page[:start.start()] + "<details class='appendix'><summary>Appendix: raw rows, provenance and run "
            "logs (click to open)</summary>\n" + page[start.start():end] + "</details>\n" + page[end:])


def _html_rows(output) -> int:
    page = output.get("data", {}).get("text/html", "") if output.output_type in ("display_data",
                                                                                   "execute_result") else ""
    return page.count("<tr") if isinstance(page, str) else 0


def _split_raw(cell):
    """(outputs a reader needs in place, raw outputs for the appendix) of a code cell."""
    outputs = cell.get("outputs", [])
    lines = sum(o.get("text", "").count("\n") for o in outputs if o.output_type == "stream")
    keep, raw = [], []
    for o in outputs:
        long_log = o.output_type == "stream" and lines > LONG_LOG_LINES
        (raw if long_log or _html_rows(o) > LONG_TABLE_ROWS else keep).append(o)
    return keep, raw


def _heading_split(cell) -> tuple[str, str]:
    """A markdown cell's leading '# title' block and the rest."""
    lines = cell.source.splitlines()
    end = next((i for i, line in enumerate(lines) if i and not line.strip()), len(lines))
    return "\n".join(lines[:end]), "\n".join(lines[end:]).strip("\n")


def _nav(stem: str, report_dir: Path) -> str:
    from rope_kernels.study.summaries import QUESTIONS

    links = ["[All reports: reports/index.html](../index.html)"]
    if _ignored(report_dir):  # a local run's reports (never committed): its own index
        links.append(f"[with this machine's runs: reports/{LOCAL_INDEX}](../{LOCAL_INDEX})")
    # the reports this folder holds, and while a run renders them in order (none after this
    # one exists yet) the ones it renders next; any other is named unlinked
    order = list(QUESTIONS)
    later = order[order.index(stem) + 1:] if stem in order else []
    mid_run = not any((report_dir / f"{other}.ipynb").exists() for other in later)
    links += [f"[{other}](./{other}.html)" if (report_dir / f"{other}.ipynb").exists()
              or (mid_run and other in later) else f"{other} (not in this run)"
              for other in QUESTIONS if other != stem]
    return "<nav class='report-nav'>\n\n" + " · ".join(links) + "\n\n</nav>"


def _ignored(path: Path) -> bool:
    """True if git ignores ``path`` (e.g. reports/cpu/: a local run, never committed)."""
    import subprocess

    try:
        return subprocess.run(["git", "check-ignore", "-q", str(Path(path).resolve())], cwd=Path(path).parent,
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _figure_output(spec: dict):
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import nbformat

    from rope_kernels.study.plots import headline_bars

    with matplotlib.rc_context({"figure.dpi": 100, "font.size": 10}):
        fig = headline_bars(spec["values"], spec["xlabel"], highlight=spec["highlight"],
                            reference=spec["reference"], fmt=spec["fmt"],
                            title=textwrap.fill(f"solid: {spec['solid']}; faded: the rest", 110))
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
        plt.close(fig)
    return nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(buf.getvalue()).decode(),
                                                        "text/plain": "<Figure>"})


def answer_first(nb, stem: str, data_dir: Path, report_dir: Path):
    """Arrange an executed notebook for a reader: its title, links to the index and the
    other reports, "What we found" (``summaries.findings_html`` over ``data_dir``'s rows)
    and one figure of the numbers that matter, then the notebook's narrative and plots,
    then an appendix of what was raw (cells tagged ``appendix``, tables of more than
    ``LONG_TABLE_ROWS`` rows, long run logs). Modifies and returns ``nb``."""
    import nbformat

    from rope_kernels.study import summaries

    front, body, appendix = [], [], []
    title_done = False
    original = {id(c) for c in nb.cells}
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "markdown" and not title_done and cell.source.lstrip().startswith("# "):
            title, rest = _heading_split(cell)
            front.append(nbformat.v4.new_markdown_cell(title))
            front.append(nbformat.v4.new_markdown_cell(_nav(stem, Path(report_dir))))
            if stem in summaries.REPORTS:
                files = summaries.load(data_dir)
                block = summaries.findings_html(stem, files, Path(data_dir).name)
                found = nbformat.v4.new_code_cell("")
                found.outputs = [nbformat.v4.new_output("display_data", data={"text/html": block,
                                                                             "text/plain": "What we found"})]
                front.append(found)
                spec = summaries.headline(stem, files)
                if spec is not None:
                    fig = nbformat.v4.new_code_cell("")
                    fig.outputs = [_figure_output(spec)]
                    front.append(fig)
            if rest:
                body.append(nbformat.v4.new_markdown_cell(rest))
            title_done = True
            continue
        if APPENDIX_TAG in tags:
            appendix.append(cell)
            continue
        if cell.cell_type == "code":
            keep, raw = _split_raw(cell)
            if raw:
                moved = nbformat.v4.new_code_cell(cell.source)
                moved.outputs = raw
                appendix.append(moved)
                cell.outputs = keep
        body.append(cell)
    if appendix:
        heading = nbformat.v4.new_markdown_cell(
            APPENDIX_HEADING + "\n\nPer-row tables, provenance and the run's log, for whoever wants to check "
            "the sections above.")
        heading.id = APPENDIX_CELL_ID
        body.append(heading)
    nb.cells = front + body + appendix
    for i, cell in enumerate(nb.cells):  # cells made here get ids by position: a re-render diffs only where text did
        if id(cell) not in original and cell.get("id") != APPENDIX_CELL_ID:
            cell.id = f"report-{stem}-{i}"
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            page = out.get("data", {}).get("text/html") if out.output_type in ("display_data", "execute_result") \
                else None
            if isinstance(page, str) and "dataframe" in page:
                out.data["text/html"] = tidy_tables(page)
    return nb


_TABLE = re.compile(r"<table\b[^>]*class=\"dataframe\"[^>]*>.*?</table>", re.DOTALL)
_ROW = re.compile(r"<tr\b[^>]*>(.*?)</tr>", re.DOTALL)
_CELL = re.compile(r"\s*<(th|td)\b([^>]*)>(.*?)</\1>", re.DOTALL)
_NUMBER = re.compile(r"^-?\d+(\.\d+)?(e[+-]?\d+)?$", re.IGNORECASE)
MISSING = ("NaN", "nan", "None", "<NA>", "NaT", "&lt;NA&gt;")


def tidy_number(text: str) -> str:
    """A table cell as people read it: '-' for a missing value, integers without '.0',
    at most 4 significant figures, no scientific notation above 0.001."""
    t = text.strip()
    if t in MISSING:
        return "-"
    if not _NUMBER.match(t) or ("." not in t and "e" not in t.lower()):
        return text
    v = float(t)
    if not math.isfinite(v):
        return text
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    if abs(v) >= 1000:
        return f"{v:.0f}"
    short = f"{v:.4g}"
    return short if "e" not in short or abs(v) < 1e-3 else f"{v:.4f}"


def tidy_tables(page: str) -> str:
    """pandas tables in ``page`` without a plain 0..n-1 index column, numbers tidied
    (:func:`tidy_number`)."""
    def table(m):
        t = m.group(0)
        body = t.split("<tbody>", 1)[1] if "<tbody>" in t else ""
        rows = _ROW.findall(body)
        firsts = [_CELL.match(r) for r in rows]
        plain_index = bool(rows) and all(
            f is not None and f.group(1) == "th" and "rowspan" not in f.group(2) and f.group(3).strip() == str(i)
            for i, f in enumerate(firsts))

        def row(rm):
            inner = rm.group(1)
            if plain_index:
                first = _CELL.match(inner)
                if first is not None and "colspan" not in first.group(2):
                    inner = inner[first.end():]
            inner = _CELL.sub(lambda c: c.group(0) if c.group(1) == "th" else
                              c.group(0).replace(f">{c.group(3)}<", f">{tidy_number(c.group(3))}<", 1), inner)
            return rm.group(0).replace(rm.group(1), inner, 1)

        return _ROW.sub(row, t)

    return _TABLE.sub(table, page)


# Whole tables in the reports, each in its own scrolling box instead of a page-long one.
SCROLL_CSS = (".jp-OutputArea-output.jp-RenderedHTMLCommon, .jp-OutputArea-output.jp-RenderedText "
              "{ max-height: 36rem; overflow: auto; }")


_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
.what-we-found { border-left: 4px solid #d62728; padding: 0.2rem 1rem; background: #fafafa; }
.what-we-found li { margin: 0.3rem 0; } table.answer td:nth-child(2) { color: #555; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.note { color: #555; font-size: 0.9rem; }
"""


def relative_href(rel: Path) -> str:
    """A link to ``rel`` (a path below the page's folder) that can only be that file:
    every segment percent-encoded and a leading './', so a folder named like a URL
    scheme ('javascript:...') or with quotes stays a relative path."""
    segments = Path(rel).parts
    if not segments or any(s in ("", ".", "..") for s in segments) or Path(rel).is_absolute():
        raise ValueError(f"{rel}: not a path below the index's folder")
    return "./" + "/".join(urllib.parse.quote(s, safe="") for s in segments)


LOCAL_INDEX = "local.html"  # every device on disk, local runs marked; git-ignored


def build_index(root: Path, device_folders: str = "committed") -> Path:
    """reports/index.html: every device's reports and a one-row-per-device summary.

    By default only devices whose results git tracks (``summary.all_devices``):
    the index is a tracked file, so a local run (data/cpu) leaves it unchanged,
    and the same committed data gives byte-identical output. It names
    ``reports/local.html`` (``LOCAL_INDEX``, git-ignored), written here too: the same
    page over every device with results or reports on disk, committed or local (marked
    so), the index of a run on this machine. Each file is written only when its
    content changes."""
    root = Path(root)
    reports = root / "reports"
    out = _write_index(root, reports / "index.html", device_folders, local_link=device_folders == "committed")
    if device_folders == "committed":
        _write_index(root, reports / LOCAL_INDEX, "all", local_link=False)
    return out


def _write_index(root: Path, out: Path, device_folders: str, *, local_link: bool) -> Path:
    reports = root / "reports"
    devices_with_reports = sorted(p for p in reports.iterdir() if p.is_dir()) \
        if reports.exists() else []
    tracked = committed_device_folders(reports) if reports.exists() else None
    if device_folders == "committed" and tracked is not None:
        devices_with_reports = [p for p in devices_with_reports if p.name in tracked]
    summary = all_devices(root / "data", device_folders)
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             "<title>Vision RoPE kernel study: reports</title>",
             f"<style>{_CSS}</style></head><body>",
             "<h1>Vision RoPE kernel study (vLLM PR #50400, Kimi-K2.5)</h1>"]
    parts += _answer(root, [d.name for d in devices_with_reports], summary)
    parts.append("<h2>Reports</h2>")
    if local_link:
        parts.append(f"<p class='note'>A run on this machine (<code>make study</code>) is listed beside these in "
                     f"<code>reports/{LOCAL_INDEX}</code>, which the run writes (not committed).</p>")
    for dev in devices_with_reports:
        pages = sorted(dev.glob("*.html"))
        if not pages:
            continue
        local = tracked is not None and dev.name not in tracked
        mark = " <span class='note'>(local run, not committed)</span>" if local else ""
        parts.append(f"<h3>{html.escape(dev.name)}{mark}</h3><ul>")
        for page in pages:
            href = relative_href(page.relative_to(reports))
            question = _questions().get(page.stem, "")
            parts.append(f"<li><a href='{html.escape(href)}'>{html.escape(page.stem)}</a>"
                         + (f": {html.escape(question)}" if question else "") + "</li>")
        parts.append("</ul>")
    parts.append("<h2>Headline figures per device</h2>")
    parts.append("<p class='note'>Every figure was measured by this project's runner; device, versions and "
                 "commit are in each report and in every row of data/.</p>")
    if summary.empty:
        parts.append("<p>No results yet: run <code>make study</code>.</p>")
    else:
        parts.append(_device_details(summary))
    parts.append("</body></html>")
    page = "\n".join(parts) + "\n"
    if not out.exists() or out.read_text() != page:
        write_atomic(out, page)
    return out


def _questions() -> dict:
    from rope_kernels.study.summaries import QUESTIONS

    return QUESTIONS


def _answer(root: Path, report_devices: list[str], summary: pd.DataFrame) -> list[str]:
    """The study's answer on one device (the findings' device where it has rows, else the first
    with rows): a few generated sentences and a table of variants that fits a laptop screen."""
    from rope_kernels.study import summaries
    from rope_kernels.study.findings import DEVICE

    with_rows = [d for d in (summary["device"] if "device" in summary.columns else [])
                 if (root / "data" / d).is_dir()]
    if not with_rows:
        return []
    device = DEVICE if DEVICE in with_rows else sorted(with_rows)[0]
    files = summaries.load(root / "data" / device)
    out = [f"<h2>The answer (on {html.escape(device)})</h2>",
           "<div class='what-we-found'><ul>"
           + "".join(f"<li>{summaries.inline_html(s)}</li>" for s in summaries.study_lines(files)) + "</ul>",
           "<p><b>What to ship</b></p><ul>"
           + "".join(f"<li>{summaries.inline_html(s)}</li>" for s in summaries.ship_lines(files)) + "</ul></div>"]
    table = summaries.answer_table(files)
    if len(table):
        out.append(table.to_html(index=False, border=0, classes="answer"))
        out.append("<p class='note'>Kernel: median per call, cold L2, CUDA graphs; encoder: median forward of "
                   "the MoonViT-shaped encoder, CUDA graphs; '-': not measured for that variant. Generated from "
                   f"<code>data/{html.escape(device)}/</code> by <code>rope_kernels/study/summaries.py</code>.</p>")
    if device in report_devices:
        out.append(f"<p>Open <a href='{html.escape(relative_href(Path(device) / '02_microbench.html'))}'>the "
                   "kernel report</a> or pick a report below.</p>")
    return out


def _device_details(summary: pd.DataFrame) -> str:
    """The per-device summary (``_summary_table``) with devices as columns: one figure a row."""
    table = _summary_frame(summary)
    if _COLUMNS["device"] not in table.columns:
        return table.to_html(index=False, border=0)
    wide = table.set_index(_COLUMNS["device"]).T.rename_axis(index="figure", columns=None)
    return wide.reset_index().to_html(index=False, border=0)


_COLUMNS = {
    "device": "device folder",
    "device_name": "device",
    "timed_on": "timed on",
    "microbench_commit": "kernel runs' commit",
    "kimi_tokens": "tokens (16x72)",
    "fused_speedup_vs_native": "speedup of fused over native (native time / fused time, 16x72, cold)",
    "fused_pct_of_copy": "fused % of copy bandwidth",
    "pr_fused_at_or_under_cudagraph": "PR rows: fused at/under PR time (cold L2)",
    "pr_fused_at_or_under_cudagraph_warm": "PR rows: fused at/under PR time (warm L2)",
    "encoder_images": "images (encoder)",
    "encoder_native_ms": "encoder native ms",
    "encoder_fused_ms": "encoder fused ms",
    "encoder_saving_pct": "encoder saving %, fused vs native (ratio of medians, CUDA graph)",
    "encoder_commit": "encoder runs' commit",
}


# Counts: shown as integers even where a missing value made their column float.
_INTEGER_COLUMNS = ("kimi_tokens", "encoder_images")


def _summary_table(summary: pd.DataFrame) -> str:
    """The summary as an HTML table: counts as integers, measurements to 2 decimals,
    missing values as '-' (one scalar per cell; anything else is a bug upstream)."""
    return _summary_frame(summary).to_html(index=False, border=0)


def _summary_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's cells as text under their labelled headers (see ``_summary_table``)."""
    labels = dict(_COLUMNS)
    ratios = {c: f"time of {c.removeprefix('ratio_')} / time of ours (16x72, most tokens, cold; "
                 "in place vs fused_inplace, else vs fused)"
              for c in summary.columns if c.startswith("ratio_")}
    savings = {c: f"encoder saving %, {c.removeprefix('encoder_saving_pct_')} vs native"
               for c in summary.columns if c.startswith("encoder_saving_pct_")}
    at = list(labels).index("fused_pct_of_copy") + 1
    items = list(labels.items())
    labels = dict(items[:at] + list(ratios.items()) + items[at:])
    items = list(labels.items())
    at = list(labels).index("encoder_saving_pct") + 1
    labels = dict(items[:at] + list(savings.items()) + items[at:] + [("targets", "targets (study/targets.py)")])
    cols = [c for c in labels if c in summary.columns]
    for c in cols:
        bad = [v for v in summary[c] if not pd.api.types.is_scalar(v)]
        if bad:
            raise TypeError(f"summary column {c!r} holds a {type(bad[0]).__name__}, not a value")

    def cell(column: str, v) -> str:
        if pd.isna(v):
            return "-"
        if column in _INTEGER_COLUMNS:
            return f"{int(v)}"
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    return pd.DataFrame({labels[c]: [cell(c, v) for v in summary[c]] for c in cols})
