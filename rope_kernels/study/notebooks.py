"""Helpers the notebooks share, and refreshing their stored (nbval) outputs."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

from rope_kernels.study.devices import REPO_ROOT, resolve_device, torch_device

NOTEBOOK_DIR = REPO_ROOT / "notebooks"


# Warnings a reader cannot act on: library deprecations, the profiler's note that it
# clears events per cycle, tqdm.auto's "IProgress not found" (text bars are intended).
QUIET_WARNINGS = (
    (DeprecationWarning, ""),
    (FutureWarning, ""),
    (UserWarning, r".*Profiler clears events at the end of each cycle"),
    (Warning, r".*IProgress not found"),
)

# Library log lines that depend on the machine, not the study (a stored output must not
# follow them): torch's "No CUDA runtime is found, using CUDA_HOME=..." on a CUDA build
# without a GPU. Their loggers print errors only.
QUIET_LOGGERS = ("torch.utils.cpp_extension",)


def report_display() -> None:
    """Quiet known warnings, whole pandas tables (never "...": the HTML export scrolls
    long ones, reports.SCROLL_CSS) and the report plot style: what every notebook
    needs, with or without a device (06_summary reads committed CSVs only)."""
    import logging
    import warnings

    import pandas as pd

    from rope_kernels.study.plots import use_report_style

    for category, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    pd.set_option("display.width", 200)
    # A wide table is one block per row set, never wrapped: where pandas wraps follows
    # the columns' widths, which follow e.g. the torch version string (nbval_sanitize.cfg
    # collapses the padding itself).
    pd.set_option("display.expand_frame_repr", False)
    pd.set_option("display.max_columns", None)
    pd.set_option("display.max_rows", None)
    pd.set_option("display.max_colwidth", None)
    use_report_style()


def notebook_setup(device: str = "auto"):
    """Every device notebook's first code: ``report_display``; returns (device kind,
    torch.device) for the ``device`` parameter, by the runner's own rule
    (``devices.resolve_device``)."""
    report_display()
    kind = resolve_device(device, name="device")
    return kind, torch_device(kind)


PAPERMILL_ORIGIN = "notebook parameters"


def check_parameters(notebook: str, values, kind: str | None = None) -> None:
    """Judge a notebook's parameters (its ``globals()`` after papermill's injected cell) by
    the runner's rules (``parameters.resolve_parameters``, ``specs.SPECS``): plain papermill
    refuses a bad value with the message ``run -p`` gives (after the origin, here
    ``PAPERMILL_ORIGIN``) instead of a deep traceback. ``kind``: the device kind
    (``notebook_setup``), None for notebooks without one. Every notebook's first code cell
    calls it; the runner-set parameters (``by_runner``) are not judged here."""
    from rope_kernels.study.parameters import resolve_parameters
    from rope_kernels.study.specs import SPECS

    spec = SPECS[notebook]
    given = {name: values[name] for name, p in spec.parameters.items() if name in values and not p.by_runner}
    resolve_parameters([notebook], SPECS, [(PAPERMILL_ORIGIN, {notebook: given})], [], kind)


def show_source(obj) -> None:
    """Render a library object's source in the notebook (one source of truth)."""
    from IPython.display import Markdown, display

    fn = getattr(obj, "fn", obj)  # a Triton JITFunction wraps the Python function
    display(Markdown(f"```python\n{inspect.getsource(fn).rstrip()}\n```"))


def notebook_paths(only=None) -> list[Path]:
    """The numbered notebooks (``NN_name.ipynb``); with ``only``, those whose name
    starts with one of its entries."""
    paths = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.stem.startswith(Path(o).stem) for o in only)]
    return paths


def code_cells(path: Path) -> list[str]:
    """The code cells' sources of a notebook or its percent-format ``.py`` (via jupytext)."""
    import jupytext

    return [c.source.strip() for c in jupytext.read(str(path)).cells if c.cell_type == "code"]


def unsynced_pairs(paths=None) -> list[str]:
    """Notebooks whose ``.py`` source and ``.ipynb`` differ in their code cells."""
    problems = []
    for ipynb in paths or notebook_paths():
        script = ipynb.with_suffix(".py")
        if not script.exists():
            problems.append(f"{ipynb.name}: no paired {script.name}")
        elif code_cells(script) != code_cells(ipynb):
            problems.append(f"{ipynb.name} and {script.name} differ: run jupytext --sync")
    return problems


def sync_notebooks(paths) -> None:
    """``jupytext --sync``: the newer side of each pair updates the other (outputs kept)."""
    from jupytext.cli import jupytext as jupytext_cli

    jupytext_cli(["--sync", "--quiet", *(str(p) for p in paths)])


def refresh_notebooks(only=None) -> list[Path]:
    """Sync each ``.ipynb`` with its ``.py`` source, then execute it in place with its
    default parameters (what nbval re-runs) so the stored outputs are those of a
    deterministic CPU run."""
    import nbformat
    from nbclient import NotebookClient

    from rope_kernels.study.results import write_atomic
    from rope_kernels.study.execution import kernel_sees_repo

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("refresh notebooks with TRITON_INTERPRET=1 (make notebooks does)")
    kernel_sees_repo()
    paths = notebook_paths(only)
    sync_notebooks(paths)
    for path in paths:
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:  # no timestamps: a refresh diffs only where outputs changed
            cell.metadata.pop("execution", None)
        # "python3" is this process's own interpreter (jupyter_client maps it to
        # sys.executable), whichever kernels are registered.
        NotebookClient(nb, timeout=1800, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
        write_atomic(path, nbformat.writes(nb) + "\n")
    return paths
