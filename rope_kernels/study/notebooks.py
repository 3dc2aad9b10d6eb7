"""Helpers the notebooks share, and refreshing their stored (nbval) outputs."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

from rope_kernels.study.devices import REPO_ROOT, device_kind, torch_device

NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def resolve_device(device: str):
    """A notebook's ``device`` parameter ('auto', 'cpu', 'cuda', 'rocm') -> torch.device."""
    kind = device_kind() if device == "auto" else device
    if kind not in ("cpu", "cuda", "rocm"):
        raise ValueError(f"device must be auto, cpu, cuda or rocm, got {device!r}")
    if kind != "cpu" and device_kind() == "cpu":
        raise RuntimeError(f"device={device!r} but PyTorch sees no GPU here")
    return kind, torch_device(kind)


def show_source(obj) -> None:
    """Render a library object's source in the notebook (one source of truth)."""
    from IPython.display import Markdown, display

    fn = getattr(obj, "fn", obj)  # a Triton JITFunction wraps the Python function
    display(Markdown(f"```python\n{inspect.getsource(fn).rstrip()}\n```"))


def refresh_notebooks(only=None) -> list[Path]:
    """Execute notebooks in place with their default parameters (what nbval
    re-runs) so the stored outputs are those of a deterministic CPU run."""
    import nbformat
    from nbclient import NotebookClient

    from rope_kernels.study.runner import kernel_sees_repo

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("refresh notebooks with TRITON_INTERPRET=1 (make notebooks does)")
    kernel_sees_repo()
    paths = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.stem.startswith(Path(o).stem) for o in only)]
    for path in paths:
        nb = nbformat.read(str(path), as_version=4)
        NotebookClient(nb, timeout=1800, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
        from rope_kernels.study.results import write_atomic

        write_atomic(path, nbformat.writes(nb) + "\n")
    return paths
