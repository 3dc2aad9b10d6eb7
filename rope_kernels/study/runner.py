"""``python -m rope_kernels run``: every notebook, this device, one command.

Parameters come from a profile (``params/<cpu|cuda|rocm>.yaml``), an optional
``--params FILE`` and ``-p NAME=VALUE`` overrides, in that order. They are all
checked against the notebooks' parameters cells before anything runs: an
unknown name or a value of the wrong type is an error that names it (papermill
itself would only warn), and nothing is written. Executed notebooks and HTML go
to ``reports/<device>/``, data to ``data/<device>/``; each file is replaced
atomically, so a crash leaves the previous results intact.
"""

from __future__ import annotations

import ast
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from rope_kernels.study.devices import REPO_ROOT, device_kind, device_name, device_slug

NOTEBOOKS = ("01_kernels", "02_microbench", "03_profile", "04_ttft", "05_summary")
# Set by the runner for every notebook that declares them; not user parameters.
RUNNER_PARAMS = ("device", "data_dir", "report_dir")


class ParameterError(ValueError):
    """A parameter the notebooks do not declare, or a value of the wrong type."""


def notebook_parameters(path: Path) -> dict[str, object]:
    """Name -> default of the cell tagged ``parameters`` (literal assignments only)."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            params = {}
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                        isinstance(node.targets[0], ast.Name):
                    params[node.targets[0].id] = ast.literal_eval(node.value)
            return params
    raise ParameterError(f"{path.name} has no cell tagged 'parameters'")


def _type_ok(value, default) -> bool:
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _type_name(default) -> str:
    return "any" if default is None else type(default).__name__


def parse_override(text: str) -> tuple[str | None, str, object]:
    """'NAME=VALUE' or 'NOTEBOOK.NAME=VALUE'; VALUE is YAML (numbers, lists, ...)."""
    if "=" not in text:
        raise ParameterError(f"-p wants NAME=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    notebook, _, name = key.strip().rpartition(".")
    if not name.isidentifier():
        raise ParameterError(f"-p: {name!r} is not a parameter name")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ParameterError(f"-p {key}: cannot parse value {raw!r}: {exc}") from None
    return (notebook or None), name, value


def load_profile(path: Path) -> dict:
    """A params YAML: ``common:`` for every notebook, then one mapping per notebook."""
    path = Path(path)
    if not path.exists():
        raise ParameterError(f"parameter file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ParameterError(f"{path}: expected a mapping of notebook -> parameters")
    for section, values in data.items():
        if section != "common" and section not in NOTEBOOKS:
            raise ParameterError(f"{path}: unknown section {section!r}; use 'common' or one of "
                                 f"{', '.join(NOTEBOOKS)}")
        if values is not None and not isinstance(values, dict):
            raise ParameterError(f"{path}: section {section!r} must be a mapping")
    return data


def resolve_parameters(notebooks: Sequence[str], specs: dict[str, dict], layers: Sequence[dict],
                       overrides: Sequence[str]) -> dict[str, dict]:
    """Merge profile layers and overrides into per-notebook parameters, checking
    every name and type. Raises ParameterError naming every problem found."""
    errors: list[str] = []
    resolved: dict[str, dict] = {nb: {} for nb in notebooks}

    def assign(scope: str | None, name: str, value, origin: str):
        if scope is not None and scope not in NOTEBOOKS:
            errors.append(f"{origin}: unknown notebook {scope!r}")
            return
        if name in RUNNER_PARAMS:
            errors.append(f"{origin}: {name!r} is set by the runner, not by parameters")
            return
        # Check against every notebook in scope, run now or not, so a profile's
        # mistakes surface whichever notebooks are selected.
        declared = [nb for nb in NOTEBOOKS if scope in (None, nb) and name in specs[nb]]
        if not declared:
            where = scope or "no notebook"
            errors.append(f"{origin}: {where} has no parameter {name!r}" if scope
                          else f"{origin}: {where} has a parameter {name!r}")
            return
        for nb in declared:
            default = specs[nb][name]
            if not _type_ok(value, default):
                errors.append(f"{origin}: {nb}.{name} must be {_type_name(default)}, "
                              f"got {type(value).__name__} {value!r}")
                continue
            if nb in resolved:
                resolved[nb][name] = value

    for layer_name, layer in layers:
        for section, values in (layer or {}).items():
            for name, value in (values or {}).items():
                assign(None if section == "common" else section, name, value, layer_name)
    for text in overrides:
        try:
            scope, name, value = parse_override(text)
        except ParameterError as exc:
            errors.append(str(exc))
            continue
        assign(scope, name, value, f"-p {text}")
    if errors:
        raise ParameterError("invalid parameters:\n  " + "\n  ".join(errors))
    return resolved


def select_notebooks(only: Sequence[str] | None) -> list[str]:
    if not only:
        return list(NOTEBOOKS)
    chosen = []
    for item in only:
        stem = Path(item).stem
        matches = [nb for nb in NOTEBOOKS if nb == stem or nb.startswith(stem)]
        if len(matches) != 1:
            raise ParameterError(f"--only {item!r} matches {matches or 'no notebook'}; "
                                 f"choose from {', '.join(NOTEBOOKS)}")
        chosen.append(matches[0])
    return [nb for nb in NOTEBOOKS if nb in chosen]


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
              log=print) -> list[Path]:
    """Run the notebooks; returns the HTML reports written."""
    root = Path(root)
    kind = resolve_device(device)
    notebooks = select_notebooks(only)
    specs = {nb: notebook_parameters(root / "notebooks" / f"{nb}.ipynb") for nb in NOTEBOOKS}
    layers = [(f"params/{kind}.yaml", load_profile(root / "params" / f"{kind}.yaml"))]
    if params_file is not None:
        layers.append((str(params_file), load_profile(Path(params_file))))
    params = resolve_parameters(notebooks, specs, layers, overrides)

    slug = device_slug(device_name(kind))
    data_dir = root / "data" / slug
    report_dir = root / "reports" / slug
    written = []
    for i, nb in enumerate(notebooks, 1):
        nb_params = dict(params[nb])
        for name, value in (("device", kind), ("data_dir", str(data_dir)),
                            ("report_dir", str(report_dir))):
            if name in specs[nb]:
                nb_params[name] = value
        log(f"[{i}/{len(notebooks)}] {nb} on {slug} ...")
        start = time.monotonic()
        executed = execute_notebook(root / "notebooks" / f"{nb}.ipynb",
                                    report_dir / f"{nb}.ipynb", nb_params,
                                    cwd=root / "notebooks", kernel_name=kernel_name)
        from rope_kernels.study.reports import notebook_to_html

        written.append(notebook_to_html(executed, report_dir / f"{nb}.html",
                                        hide_inputs=not keep_inputs))
        log(f"[{i}/{len(notebooks)}] {nb} done in {time.monotonic() - start:.0f} s "
            f"-> {written[-1].relative_to(root)}")
    from rope_kernels.study.reports import build_index

    index = build_index(root)
    log(f"index: {index.relative_to(root)}")
    return written


def kernel_sees_repo() -> None:
    """Kernels inherit our environment: make them import this checkout's
    rope_kernels, installed or not."""
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)


def execute_notebook(src: Path, dest: Path, parameters: dict, *, cwd: Path,
                     kernel_name: str | None = None) -> Path:
    """papermill into a temporary file beside ``dest``, renamed over it on success."""
    import papermill

    dest.parent.mkdir(parents=True, exist_ok=True)
    kernel_sees_repo()
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".ipynb", dir=dest.parent)
    os.close(fd)
    try:
        # The notebooks name the "rope-study" kernel (registered by the Makefile, for
        # JupyterLab); batch runs use "python3", which jupyter_client maps to this
        # interpreter, so an offline node without that registration runs them too.
        papermill.execute_notebook(str(src), tmp, parameters=parameters, cwd=str(cwd),
                                   kernel_name=kernel_name or "python3",
                                   progress_bar=sys.stderr.isatty(), log_output=True,
                                   report_mode=False)
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
