"""``python -m rope_kernels run``: every notebook, this device, one command.

Parameters come from a profile (``params/<cpu|cuda|rocm>.yaml``), an optional
``--params FILE`` and ``-p NAME=VALUE`` overrides, in that order. They are all
checked against the notebooks' parameters cells before anything runs: an
unknown name, a value of the wrong type or out of range (``VALUE_RULES``) is an
error that names it (papermill itself would only warn), and nothing is written. Executed notebooks and HTML go
to ``reports/<device>/``, data to ``data/<device>/``; each file is replaced
atomically, so a crash leaves the previous results intact.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from rope_kernels.study.devices import REPO_ROOT, device_kind, device_name, device_slug

NOTEBOOKS = ("01_kernels", "02_microbench", "03_profile", "04_ttft", "05_summary")
# Set by the runner for every notebook that declares them; not user parameters.
# device_folders="all": the summary of a run includes this machine's own results
# (the notebooks' default, "committed", is what nbval compares on every clone).
RUNNER_PARAMS = ("device", "data_dir", "report_dir", "device_folders")


class ParameterError(ValueError):
    """A parameter the notebooks do not declare, or a value of the wrong type."""


class NotebookError(RuntimeError):
    """A notebook cell raised; its partial output is kept as <notebook>.failed.ipynb."""


def notebook_parameters(path: Path) -> dict[str, object]:
    """Name -> default of the cell tagged ``parameters`` (literal assignments only).
    Reads the notebook's JSON directly (nbformat's import alone takes about a second)."""
    import json

    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else source
            params = {}
            for node in ast.parse(source).body:
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


# Value rules, checked on every value a profile, --params or -p gives (the
# notebooks' defaults are the CPU configuration). Each returns a problem or None.
DTYPE_NAMES = ("float32", "bfloat16", "float16")
GPU_ONLY_MODES = ("cudagraph", "cudagraph_warm")


def _at_least(lo: int) -> Callable:
    def check(v, kind):
        return None if v >= lo else f"must be >= {lo}, got {v!r}"
    return check


def _one_of(choices: Sequence[str]) -> Callable:
    def check(v, kind):
        return None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"
    return check


def _head_dim_problem(d) -> str | None:
    if isinstance(d, bool) or not isinstance(d, int) or d < 2 or d % 2:
        return f"head_dim must be a positive even int (pairs are rotated), got {d!r}"
    return None


def _shape_problem(item) -> str | None:
    if not (isinstance(item, (list, tuple)) and len(item) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
        return f"each shape must be [tokens, heads, head_dim] ints, got {item!r}"
    if item[0] < 1 or item[1] < 1:
        return f"tokens and heads must be >= 1, got {item!r}"
    return _head_dim_problem(item[2])


def _family_problem(item) -> str | None:
    if not isinstance(item, dict) or set(item) != {"tokens", "heads", "head_dim"}:
        return f"each family must be {{tokens: ..., heads: ..., head_dim: ...}}, got {item!r}"
    for field_name, values in item.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            return f"family {field_name} is empty"
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                return f"family {field_name} must hold ints >= 1, got {v!r}"
            if field_name == "head_dim" and _head_dim_problem(v):
                return _head_dim_problem(v)
    return None


def _resolution_problem(item) -> str | None:
    from rope_kernels.kernels.freqs import parse_resolution

    try:
        parse_resolution(item)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def _list_of(item_problem: Callable[[object], str | None], *, allow_empty: bool = False):
    def check(v, kind):
        if not v and not allow_empty:
            return "must not be empty"
        for item in v:
            problem = item_problem(item)
            if problem:
                return problem
        return None
    return check


def _modes(choices: Sequence[str]) -> Callable:
    def item_problem(m):
        return None if m in choices else f"unknown mode {m!r}; use {', '.join(choices)}"
    listed = _list_of(item_problem)

    def check(v, kind):
        problem = listed(v, kind)
        if problem is None and kind == "cpu":
            gpu = [m for m in v if m in GPU_ONLY_MODES]
            if gpu:
                problem = f"{', '.join(gpu)} needs a GPU (this run is on the CPU); use [eager]"
        return problem
    return check


def _int_ge1(v) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else \
        f"must hold ints >= 1, got {v!r}"


def _dtype_item(v) -> str | None:
    return None if v in DTYPE_NAMES else f"unknown dtype {v!r}; use {', '.join(DTYPE_NAMES)}"


def _attention_kernels() -> tuple[str, ...]:
    from rope_kernels.bench.vit import ATTENTION_KERNELS

    return ATTENTION_KERNELS


# (notebook or None for every notebook, name) -> check(value, device kind)
VALUE_RULES: dict[tuple[str | None, str], Callable] = {
    (None, "samples"): _at_least(1),
    (None, "tokens"): _at_least(1),
    (None, "heads"): _at_least(1),
    (None, "head_dim"): lambda v, kind: _head_dim_problem(v),
    (None, "dtype"): _one_of(DTYPE_NAMES),
    (None, "dtypes"): _list_of(_dtype_item),
    (None, "shapes"): _list_of(_shape_problem),
    (None, "sweep_shapes"): _list_of(_shape_problem),
    (None, "families"): _list_of(_family_problem),
    (None, "image_counts"): _list_of(_int_ge1),
    (None, "resolutions"): _list_of(_resolution_problem),
    (None, "max_tokens"): _at_least(1),
    (None, "prefill_tokens_per_s"): lambda v, kind: None if v >= 0 else f"must be >= 0, got {v!r}",
    (None, "encoder"): _one_of(("small", "kimi_k25")),
    (None, "attention"): lambda v, kind: _one_of(_attention_kernels())(v, kind),
    ("02_microbench", "modes"): _modes(("eager", "cudagraph", "cudagraph_warm")),
    ("04_ttft", "modes"): _modes(("eager", "cudagraph")),
    ("03_profile", "layers"): _at_least(1),
    ("04_ttft", "layers"): lambda v, kind: None if v >= 0 else
    f"must be >= 0 (0: the encoder's own depth), got {v!r}",
}


def value_problem(notebook: str, name: str, value, kind: str | None) -> str | None:
    """What is wrong with ``value`` for ``notebook.name`` on a ``kind`` device, or None."""
    rule = VALUE_RULES.get((notebook, name)) or VALUE_RULES.get((None, name))
    return rule(value, kind) if rule else None


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
        raise ParameterError(f"-p {key}: cannot parse value {raw!r}: {_yaml_problem(exc)}") \
            from None
    return (notebook or None), name, value


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong, and where."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"{context + ': ' if context else ''}{problem}{where}"


def load_profile(path: Path) -> dict:
    """A params YAML: ``common:`` for every notebook, then one mapping per notebook."""
    path = Path(path)
    if not path.exists():
        raise ParameterError(f"parameter file {path} does not exist")
    if not path.is_file():
        raise ParameterError(f"parameter file {path} is not a file")
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ParameterError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ParameterError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except OSError as exc:
        raise ParameterError(f"parameter file {path}: {exc.strerror or exc}") from None
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
                       overrides: Sequence[str], kind: str | None = None) -> dict[str, dict]:
    """Merge profile layers and overrides into per-notebook parameters, checking
    every name, type and value (``VALUE_RULES``; GPU-only modes when ``kind`` is
    'cpu'). Raises ParameterError naming every problem found."""
    errors: list[str] = []
    resolved: dict[str, dict] = {nb: {} for nb in notebooks}
    origins: dict[tuple[str, str], str] = {}  # where each value came from, for messages

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
            origins[nb, name] = origin
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
    # Values are judged once every layer applied: a later layer may replace a value.
    for nb, values in resolved.items():
        for name, value in values.items():
            problem = value_problem(nb, name, value, kind)
            if problem:
                errors.append(f"{origins[nb, name]}: {nb}.{name} {problem}")
    if errors:
        if len(errors) == 1:
            raise ParameterError(errors[0])
        raise ParameterError(f"{len(errors)} invalid parameters:\n  " + "\n  ".join(errors))
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
              verbose: bool = False, log=print) -> list[Path]:
    """Run the notebooks; returns the HTML reports written. One line per notebook
    (a live progress line on a terminal); ``verbose`` streams every cell's output."""
    root = Path(root)
    kind = resolve_device(device)
    notebooks = select_notebooks(only)
    specs = {nb: notebook_parameters(root / "notebooks" / f"{nb}.ipynb") for nb in NOTEBOOKS}
    layers = [(f"params/{kind}.yaml", load_profile(root / "params" / f"{kind}.yaml"))]
    if params_file is not None:
        layers.append((str(params_file), load_profile(Path(params_file))))
    params = resolve_parameters(notebooks, specs, layers, overrides, kind)

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
                if name in specs[nb]:
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
