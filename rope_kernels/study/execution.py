"""Executing one notebook: papermill into a temporary file renamed over the report,
the kernel's environment (this checkout's package, the resolved peer cache), and
the one terminal line per notebook with its latest progress bar. The runner
(``runner.py``) and the Slurm summary job (``submit.py``) call it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rope_kernels.provenance import REPO_ROOT


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
                     progress: ProgressLine | None = None, note: str | None = None) -> Path:
    """papermill into a temporary file beside ``dest``, renamed over it on success.
    Cell output reaches the terminal only through ``progress`` (its progress bars)
    or, with ``verbose``, whole; the kernel process's own stderr (warnings and
    profiler messages printed outside any cell) is dropped unless ``verbose``.
    ``note`` (Markdown), when given, becomes a cell right after the parameters: what
    the runner wants a reader to know about this run (the variants it skipped)."""
    import papermill

    from rope_kernels.study.results import check_replaceable

    check_replaceable(dest)  # a link or read-only report is refused before the run, not after
    failed = dest.with_name(dest.stem + ".failed.ipynb")
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
        if note:
            _insert_note(Path(tmp), note)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        # Keep what ran, for debugging, beside (never over) the last good report.
        if Path(tmp).exists() and Path(tmp).stat().st_size > 0:
            os.replace(tmp, failed)
        Path(tmp).unlink(missing_ok=True)
        raise
    failed.unlink(missing_ok=True)  # an earlier failure's output no longer describes the report
    return dest


def _insert_note(path: Path, note: str) -> None:
    """Put a Markdown cell holding ``note`` after the parameters cells of ``path``."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    after = 0
    for i, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if "parameters" in tags or "injected-parameters" in tags:
            after = i + 1
    nb.cells.insert(after, nbformat.v4.new_markdown_cell(note, metadata={"tags": ["run-note"]}))
    nbformat.write(nb, str(path))


def _quiet_kernel_manager():
    """A kernel manager whose kernel process writes its own stderr nowhere."""
    from jupyter_client.manager import AsyncKernelManager

    class QuietKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw.setdefault("stderr", subprocess.DEVNULL)
            return await super()._async_launch_kernel(kernel_cmd, **kw)

    return QuietKernelManager
