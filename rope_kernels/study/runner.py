"""``python -m rope_kernels run``: every notebook, this device, one command.

Parameters come from a profile (``params/<cpu|cuda|rocm>.yaml``), an optional
``--params FILE`` and ``-p NAME=VALUE`` overrides, in that order. They are all
checked against the notebook specs (``specs.py``, by ``parameters.py``) before
anything runs: an unknown name, a value of the wrong type or out of range, a
variant that does not run here, is an error that names it (papermill itself would
only warn), and nothing is written. Executed notebooks and HTML go
to ``reports/<device>/``, data to ``data/<device>/``; each file is replaced
atomically, so a crash leaves the previous results intact.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rope_kernels.study.devices import REPO_ROOT, device_kind, device_name, device_slug

# Parameters: specs.py says what each notebook takes, parameters.py reads and checks values.
from rope_kernels.study.parameters import (  # noqa: F401
    ParameterError,
    check_variants_run_here,
    load_profile,
    notebook_parameters,
    parse_override,
    resolve_parameters,
    select_notebooks,
    study_parameters,
    value_problem,
)
from rope_kernels.study.specs import NOTEBOOKS, RUNNER_PARAMS, SPECS  # noqa: F401


class NotebookError(RuntimeError):
    """A notebook cell raised; its partial output is kept as <notebook>.failed.ipynb."""


def resolve_device(requested: str) -> str:
    if requested not in ("auto", "cpu", "cuda", "rocm"):
        raise ParameterError(f"--device must be auto, cpu, cuda or rocm, got {requested!r}")
    found = device_kind()
    if requested == "auto":
        return found
    if requested != "cpu" and found != requested:
        raise RuntimeError(f"--device {requested} was asked for, but this machine has "
                           f"{'no GPU' if found == 'cpu' else 'a ' + found + ' GPU'} "
                           "visible to PyTorch")
    return requested


def run_study(*, device: str = "auto", params_file: Path | None = None,
              overrides: Sequence[str] = (), only: Sequence[str] | None = None,
              keep_inputs: bool = False, root: Path = REPO_ROOT, kernel_name: str | None = None,
              verbose: bool = False, log=print) -> list[Path]:
    """Run the notebooks; returns the HTML reports written. One line per notebook
    (a live progress line on a terminal); ``verbose`` streams every cell's output."""
    root = Path(root)
    kind = resolve_device(device)
    notebooks = select_notebooks(only)
    params = study_parameters(kind, root=root, notebooks=notebooks, params_file=params_file,
                              overrides=overrides)
    check_variants_run_here(params)

    slug = device_slug(device_name(kind))
    data_dir = root / "data" / slug
    report_dir = root / "reports" / slug
    written = []
    from rope_kernels.study.reports import build_index, notebook_to_html
    from rope_kernels.study.results import check_writable_folder, run_lock, sweep_temp_files

    for folder in (data_dir, report_dir):
        check_writable_folder(folder)  # before any notebook runs, one line if not

    # Runs may share a device folder (job-array tasks; result files lock per write).
    # Only a run that finds no other sweeps what killed runs left behind.
    def sweep():
        for folder in (data_dir, report_dir, report_dir / "traces"):
            sweep_temp_files(folder)

    with run_lock(report_dir / ".run", when_alone=sweep):
        for i, nb in enumerate(notebooks, 1):
            nb_params = dict(params[nb])
            for name, value in (("device", kind), ("data_dir", str(data_dir)),
                                ("report_dir", str(report_dir)), ("device_folders", "all")):
                if name in SPECS[nb].parameters:
                    nb_params[name] = value
            label = f"[{i}/{len(notebooks)}] {nb}"
            start = time.monotonic()
            with ProgressLine(label, verbose=verbose) as progress:
                try:
                    executed = execute_notebook(root / "notebooks" / f"{nb}.ipynb",
                                                report_dir / f"{nb}.ipynb", nb_params,
                                                cwd=root / "notebooks", kernel_name=kernel_name,
                                                verbose=verbose, progress=progress)
                except Exception as exc:
                    if type(exc).__name__ != "PapermillExecutionError":
                        raise
                    message = (str(exc.evalue).strip().splitlines() or [""])[-1]
                    failed = (report_dir / f"{nb}.failed.ipynb").relative_to(root)
                    raise NotebookError(f"{nb} failed: {exc.ename}: {message} (its output so "
                                        f"far: {failed}; --verbose shows every cell)") from None
                written.append(notebook_to_html(executed, report_dir / f"{nb}.html",
                                                hide_inputs=not keep_inputs))
            log(f"{label} done in {time.monotonic() - start:.0f} s -> "
                f"{written[-1].relative_to(root)}")
    index = build_index(root)
    log(f"reports/index.html lists the committed devices (unchanged by this run unless "
        f"{slug}'s results are tracked); this run's summary: "
        f"{(report_dir / '05_summary.html').relative_to(root)}"
        if "05_summary" in notebooks else f"index: {index.relative_to(root)}")
    return written


class ProgressLine:
    """The notebook's name and, on a terminal, its latest progress bar (the tqdm
    text the kernel writes to stderr), redrawn in place on one line. Everything
    else the kernel prints stays in the executed notebook (``verbose``: shown too).
    Used as papermill's ``stderr_file``/``stdout_file``."""

    _BAR = re.compile(r"\d+%\|")

    def __init__(self, label: str, *, verbose: bool = False, stream=None):
        self.label = label
        self.verbose = verbose
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() and not verbose
        self.latest = ""

    def __enter__(self):
        self._draw(self.label + " ...")
        return self

    def __exit__(self, *exc):
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
        return False

    def write(self, text: str) -> int:
        if self.verbose:
            self.stream.write(text)
            return len(text)
        for piece in re.split(r"[\r\n]", text):
            if self._BAR.search(piece):
                self.latest = piece.strip()
        if self.latest:
            self._draw(f"{self.label}  {self.latest}")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def _draw(self, line: str) -> None:
        if self.live:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\033[K" + line[:width])
            self.stream.flush()
        elif self.verbose or line.endswith(" ..."):
            self.stream.write(line + "\n")
            self.stream.flush()


def kernel_sees_repo() -> None:
    """Kernels inherit our environment: make them import this checkout's
    rope_kernels, installed or not, and the peer cache this process resolved
    (a relative ``$ROPE_PEERS_DIR`` would name another folder from notebooks/)."""
    from rope_kernels.peers.cache import export_peers_dir

    export_peers_dir()
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)


def execute_notebook(src: Path, dest: Path, parameters: dict, *, cwd: Path,
                     kernel_name: str | None = None, verbose: bool = False,
                     progress: ProgressLine | None = None) -> Path:
    """papermill into a temporary file beside ``dest``, renamed over it on success.
    Cell output reaches the terminal only through ``progress`` (its progress bars)
    or, with ``verbose``, whole; the kernel process's own stderr (warnings and
    profiler messages printed outside any cell) is dropped unless ``verbose``."""
    import papermill

    from rope_kernels.study.results import check_replaceable

    check_replaceable(dest)  # a link or read-only report is refused before the run, not after
    dest.parent.mkdir(parents=True, exist_ok=True)
    kernel_sees_repo()
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".ipynb", dir=dest.parent)
    os.close(fd)
    quiet = {} if verbose else {"kernel_manager_class": _quiet_kernel_manager()}
    try:
        # "python3" is jupyter_client's name for this very interpreter: batch runs need
        # no registered kernelspec (air-gapped nodes rarely have "rope-study").
        papermill.execute_notebook(str(src), tmp, parameters=parameters, cwd=str(cwd),
                                   kernel_name=kernel_name or "python3", progress_bar=False,
                                   log_output=False, report_mode=False,
                                   stderr_file=progress, stdout_file=progress if verbose else None,
                                   **quiet)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        # Keep what ran, for debugging, beside (never over) the last good report.
        failed = dest.with_name(dest.stem + ".failed.ipynb")
        if Path(tmp).exists() and Path(tmp).stat().st_size > 0:
            os.replace(tmp, failed)
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _quiet_kernel_manager():
    """A kernel manager whose kernel process writes its own stderr nowhere."""
    from jupyter_client.manager import AsyncKernelManager

    class QuietKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw.setdefault("stderr", subprocess.DEVNULL)
            return await super()._async_launch_kernel(kernel_cmd, **kw)

    return QuietKernelManager
