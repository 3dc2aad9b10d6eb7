"""HTML reports that open offline, and reports/index.html linking every device."""

from __future__ import annotations

import html
import re
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


def notebook_to_html(notebook_path: Path, html_path: Path, *, hide_inputs: bool = True) -> Path:
    """Export an executed notebook to a self-contained HTML file (atomically), its
    outputs cleaned for readers (:func:`clean_outputs`)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = clean_outputs(nbformat.read(str(notebook_path), as_version=4))
    exporter = HTMLExporter(template_name="lab")
    exporter.exclude_input = hide_inputs
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    body, _ = exporter.from_notebook_node(nb)
    body = body.replace("</head>", f"<style>{SCROLL_CSS}</style></head>", 1)
    write_atomic(Path(html_path), strip_remote_resources(body))
    return Path(html_path)


# Whole tables in the reports, each in its own scrolling box instead of a page-long one.
SCROLL_CSS = (".jp-OutputArea-output.jp-RenderedHTMLCommon, .jp-OutputArea-output.jp-RenderedText "
              "{ max-height: 36rem; overflow: auto; }")


_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
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


def build_index(root: Path, device_folders: str = "committed") -> Path:
    """reports/index.html: every device's reports and a one-row-per-device summary.

    By default only devices whose results git tracks (``summary.all_devices``):
    the index is a tracked file, so a local run (data/cpu) leaves it unchanged,
    and the same committed data gives byte-identical output. The file is written
    only when its content changes."""
    root = Path(root)
    reports = root / "reports"
    devices_with_reports = sorted(p for p in reports.iterdir() if p.is_dir()) \
        if reports.exists() else []
    if device_folders == "committed" and reports.exists():
        tracked = committed_device_folders(reports)
        if tracked is not None:
            devices_with_reports = [p for p in devices_with_reports if p.name in tracked]
    summary = all_devices(root / "data", device_folders)
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             "<title>Vision RoPE kernel study: reports</title>",
             f"<style>{_CSS}</style></head><body>",
             "<h1>Vision RoPE kernel study (vLLM PR #50400, Kimi-K2.5)</h1>",
             "<p class='note'>Every figure below was measured by this project's runner; "
             "device, versions and commit are in each report and in every row of data/.</p>"]
    parts.append("<h2>Summary per device</h2>")
    if summary.empty:
        parts.append("<p>No results yet: run <code>make study</code>.</p>")
    else:
        parts.append(_summary_table(summary))
    parts.append("<h2>Reports</h2>")
    for dev in devices_with_reports:
        pages = sorted(dev.glob("*.html"))
        if not pages:
            continue
        parts.append(f"<h3>{html.escape(dev.name)}</h3><ul>")
        for page in pages:
            href = relative_href(page.relative_to(reports))
            parts.append(f"<li><a href='{html.escape(href)}'>{html.escape(page.stem)}</a></li>")
        parts.append("</ul>")
    parts.append("</body></html>")
    out = reports / "index.html"
    page = "\n".join(parts) + "\n"
    if not out.exists() or out.read_text() != page:
        write_atomic(out, page)
    return out


_COLUMNS = {
    "device": "device folder",
    "device_name": "device",
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

    table = pd.DataFrame({labels[c]: [cell(c, v) for v in summary[c]] for c in cols})
    return table.to_html(index=False, border=0)
