"""``python -m rope_kernels submit``: the study as a Slurm job array.

One array task per (partition, notebook, parameter shard), each on one GPU,
running the ordinary runner (``python -m rope_kernels run --only NB -p ...``)
in this checkout, so every task writes ``data/<device>/`` through the runner's
lock and upsert. Sharding: ``02_microbench`` one task per shape family,
``04_ttft`` one per resolution, every other notebook one task; a shard is
nothing but ``-p`` overrides, so a task is a plain runner call.

A final job, dependent on the arrays with ``afterany`` (so it also runs when a
task failed or was cancelled, ``afterok`` would leave it pending forever),
writes the shard status (``slurm/<name>/status.csv``,
``reports/slurm/<name>.html``), re-runs ``06_summary`` per device and rebuilds
``reports/index.html``. ``submit --missing`` re-submits only the shards that
did not deliver, in one command.

State of a submission lives in ``slurm/<name>/`` (git-ignored): the manifest
of shards and job ids, the batch scripts, logs, and one marker per task
(written by the task itself when it starts and when the runner returns; a task
killed by ``scancel`` or the time limit never writes its end marker).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from rope_kernels.study.devices import REPO_ROOT
from rope_kernels.study.results import file_lock, read_table, write_atomic
from rope_kernels.study.parameters import ParameterError, select_notebooks, study_parameters
# What each notebook is split along (spec.shard) and the file whose rows say a
# shard delivered (spec.delivers) are in the notebook specs.
from rope_kernels.study.specs import SPECS, SUMMARY_NOTEBOOK
DEVICE_KINDS = ("cuda", "rocm", "cpu")
STATE_DIR = "slurm"


class SubmitError(RuntimeError):
    """sbatch/squeue failed, or a submission's state does not allow the request."""


# What may go into the job scripts. Values on '#SBATCH' lines are split by sbatch at
# whitespace (so 'a --output=/x' would be a second option) and a newline starts a new
# script line: both are refused, with quotes and shell syntax. Names become file names
# under slurm/<name>/: no '/' and no leading '.', so nothing lands outside it.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.:+,=@%/&|!*()\[\]-]+")
_SBATCH_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=[A-Za-z0-9_.:+,=@%/&|!*()\[\]-]+)?")
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (and no limit).
# ASCII digits only: a str pattern's \d also matches other scripts' digits ('٣٠').
_SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE",
                         re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# File names may hold 255 bytes; a name also gets suffixes (".sbatch", "-summary").
MAX_NAME_CHARS = 100


def check_name(option: str, value: str) -> str:
    """A partition, job or submission name: letters, digits, '_', '.', '+', '-', not
    starting with '.' or '-' (it becomes a file or folder name)."""
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value):
        raise ParameterError(f"{option} {value!r:.80}: use letters, digits, '_', '.', '+' or "
                             "'-', starting with a letter or digit")
    if len(value) > MAX_NAME_CHARS:
        raise ParameterError(f"{option} is {len(value)} characters long, more than the "
                             f"{MAX_NAME_CHARS} a name may have (it becomes a file name)")
    return value


def check_time(option: str, value: str) -> str:
    if not isinstance(value, str) or not _SLURM_TIME.fullmatch(value):
        raise ParameterError(f"{option} {value!r} is not a Slurm time (MINUTES, MM:SS, "
                             "HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    return value


def _check_sbatch_value(option: str, value: str) -> None:
    if value and not _SBATCH_VALUE.fullmatch(value):
        raise ParameterError(f"{option} {value!r}: a #SBATCH value may not hold spaces, "
                             "newlines, quotes or shell syntax")


def _check_one_line(option: str, value: str) -> None:
    if _CONTROL.search(value):
        raise ParameterError(f"{option} {value!r}: newlines and control characters are not "
                             "allowed (each value is one line of the job script)")


@dataclass(frozen=True)
class Partition:
    """A Slurm partition and the device profile its GPUs run (params/<kind>.yaml)."""

    name: str
    kind: str = "cuda"
    gpu_type: str = ""  # for --gres=gpu:<type>:<n>; empty: any GPU

    @classmethod
    def parse(cls, text: str, default_kind: str = "cuda") -> Partition:
        """'NAME[=KIND[:GPU_TYPE]]', e.g. 'h200', 'mi300x=rocm', 'gpu=cuda:h100'."""
        name, _, rest = text.partition("=")
        kind, _, gpu_type = (rest or default_kind).partition(":")
        if not name or any(c.isspace() or c in ",:" for c in name):
            raise ParameterError(f"--partition {text!r}: expected NAME[=KIND[:GPU_TYPE]]")
        return cls(name, kind, gpu_type)

    def __post_init__(self):
        check_name("--partition", self.name)
        if self.kind not in DEVICE_KINDS:
            raise ParameterError(f"--partition {self.name}={self.kind}: device kind must be "
                                 f"one of {', '.join(DEVICE_KINDS)}, got {self.kind!r}")
        if self.gpu_type:
            check_name(f"--partition {self.name}: GPU type", self.gpu_type)


@dataclass(frozen=True)
class SlurmOptions:
    """What goes into the #SBATCH lines and the environment set-up of every task."""

    partitions: tuple[Partition, ...]
    account: str = ""
    time_limit: str = "01:00:00"
    gpus_per_task: int = 1
    constraint: str = ""
    cpus_per_task: int = 4
    mem: str = ""
    max_running: int = 0  # array throttle (%N); 0: no limit
    summary_partition: str = ""  # default: the first partition
    summary_time_limit: str = "00:30:00"
    job_name: str = "rope-study"
    sbatch_lines: tuple[str, ...] = ()  # extra '#SBATCH ...' options, e.g. '--qos=short'
    venv: str = ""
    conda_env: str = ""
    modules: tuple[str, ...] = ()
    setup_lines: tuple[str, ...] = ()
    python: str = ""  # default: 'python' after an activation, else this interpreter

    def __post_init__(self):
        if not self.partitions:
            raise ParameterError("name at least one --partition")
        if len({p.name for p in self.partitions}) != len(self.partitions):
            raise ParameterError("a partition is named twice")
        if any(p.name == "summary" for p in self.partitions):
            raise ParameterError("--partition summary: its script would be the summary job's "
                                 "(summary.sbatch); Slurm partitions of that name are not "
                                 "supported")
        if self.gpus_per_task < 0 or self.cpus_per_task < 1 or self.max_running < 0:
            raise ParameterError("--gpus-per-task >= 0, --cpus-per-task >= 1, --max-running >= 0")
        check_time("--time", self.time_limit)
        check_time("summary time limit", self.summary_time_limit)
        check_name("--job-name", self.job_name)
        if self.summary_partition:
            check_name("--summary-partition", self.summary_partition)
        for option, value in (("--account", self.account), ("--constraint", self.constraint),
                              ("--mem", self.mem)):
            _check_sbatch_value(option, value)
        for line in self.sbatch_lines:
            if not _SBATCH_OPTION.fullmatch(line):
                raise ParameterError(f"--sbatch {line!r}: expected one option such as "
                                     "--qos=short (no spaces, newlines, quotes or shell syntax)")
        # Quoted into the script (shlex.quote): any text but a line break is safe there.
        for option, values in (("--venv", [self.venv]), ("--conda-env", [self.conda_env]),
                               ("--module", self.modules), ("--python", [self.python]),
                               ("--setup", self.setup_lines)):
            for value in values:
                _check_one_line(option, value)

    @property
    def interpreter(self) -> str:
        if self.python:
            return self.python
        return "python" if (self.venv or self.conda_env or self.modules) else sys.executable


@dataclass
class Shard:
    """One array task: a notebook with the runner arguments that select its slice."""

    index: int
    partition: str
    kind: str
    notebook: str
    label: str
    runner_args: list[str]
    output: str = ""  # CSV under data/<device>/ that the shard fills
    rows_filter: dict = field(default_factory=dict)  # column -> values of this slice


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def plan_shards(partitions: Sequence[Partition], *, only: Sequence[str] | None = None,
                params_file: Path | None = None, overrides: Sequence[str] = (),
                root: Path = REPO_ROOT) -> list[Shard]:
    """Resolve every partition's parameters as the runner will, then split them.

    The parameters are checked here, on the login node, so a typo fails the
    submission instead of every task."""
    root = Path(root)
    notebooks = [nb for nb in select_notebooks(only) if nb != SUMMARY_NOTEBOOK]
    if not notebooks:  # the summary alone: nothing for an array task to run
        raise ParameterError(f"--only {SUMMARY_NOTEBOOK} alone plans no shard: the summary "
                             "runs as every submission's last job, after the shards; name a "
                             "notebook that measures (--only 02), or run the summary with "
                             f"python -m rope_kernels run --only {SUMMARY_NOTEBOOK}")
    shards: list[Shard] = []
    for part in partitions:
        # Resolved for the partition's device kind, as its tasks' runner will resolve them.
        params = study_parameters(part.kind, root=root, notebooks=notebooks,
                                  params_file=params_file, overrides=overrides)
        base = ["run", "--device", part.kind]
        if params_file is not None:
            base += ["--params", str(Path(params_file).resolve())]
        for text in overrides:
            base += ["-p", text]
        for nb in notebooks:
            spec = SPECS[nb]
            split = spec.shard
            items = (_as_list(params[nb].get(split.parameter,
                                             spec.parameters[split.parameter].default))
                     if split else [])
            if not items:
                shards.append(Shard(len(shards), part.name, part.kind, nb, nb,
                                    base + ["--only", nb], spec.delivers))
                continue
            for i, item in enumerate(items):
                args = base + ["--only", nb, "-p", f"{nb}.{split.parameter}={json.dumps([item])}"]
                if i > 0:  # work done once (e.g. the launch-config sweep) runs with the first slice
                    for name, value in split.after_first.items():
                        args += ["-p", f"{nb}.{name}={json.dumps(value)}"]
                shards.append(Shard(len(shards), part.name, part.kind, nb,
                                    f"{nb} {split.parameter}[{i}]={json.dumps(item)}", args,
                                    spec.delivers, split.rows(item)))
    return shards


def _array_spec(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (sbatch --array syntax)."""
    indices = sorted(indices)
    runs, start = [], None
    for i, n in enumerate(indices):
        if start is None:
            start = n
        if i + 1 == len(indices) or indices[i + 1] != n + 1:
            runs.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ",".join(runs)


def _setup_lines(opts: SlurmOptions) -> list[str]:
    lines = [f"module load {shlex.quote(m)}" for m in opts.modules]
    if opts.conda_env:
        lines += ['eval "$(conda shell.bash hook)"', f"conda activate {shlex.quote(opts.conda_env)}"]
    if opts.venv:
        lines.append(f"source {shlex.quote(str(Path(opts.venv) / 'bin' / 'activate'))}")
    return lines + list(opts.setup_lines)


def _header(opts: SlurmOptions, job_name: str, partition: str, time_limit: str,
            log: str) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --partition={partition}",
             f"#SBATCH --time={time_limit}", f"#SBATCH --output={log}",
             "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={opts.cpus_per_task}"]
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    if opts.mem:
        lines.append(f"#SBATCH --mem={opts.mem}")
    return lines + [f"#SBATCH {line}" for line in opts.sbatch_lines]


def array_script(opts: SlurmOptions, part: Partition, shards: Sequence[Shard], state: Path,
                 root: Path) -> str:
    """The sbatch script of one partition's array: shard index -> runner call."""
    lines = _header(opts, opts.job_name, part.name, opts.time_limit,
                    str(state / "logs" / "%A_%a.out"))
    if opts.gpus_per_task:
        gres = f"gpu:{part.gpu_type}:{opts.gpus_per_task}" if part.gpu_type \
            else f"gpu:{opts.gpus_per_task}"
        lines.append(f"#SBATCH --gres={gres}")
    if opts.constraint:
        lines.append(f"#SBATCH --constraint={opts.constraint}")
    lines += ["# The array indices are given at submission (sbatch --array=...), so a",
              "# re-submission of missing shards reuses this script.",
              "set -euo pipefail", f"cd {shlex.quote(str(root))}", *_setup_lines(opts),
              'case "$SLURM_ARRAY_TASK_ID" in']
    for s in shards:
        lines.append(f"  {s.index}) RUN=({shlex.join(s.runner_args)}) ;;  # {s.label}")
    lines += ['  *) echo "no shard $SLURM_ARRAY_TASK_ID in this script" >&2; exit 2 ;;', "esac",
              # The wrapper marks the task started/ended around the runner call.
              f"exec {shlex.quote(opts.interpreter)} -m rope_kernels submit "
              f'--state {shlex.quote(str(state))} --task "$SLURM_ARRAY_TASK_ID" "${{RUN[@]}}"']
    return "\n".join(lines) + "\n"


def summary_script(opts: SlurmOptions, state: Path, root: Path) -> str:
    """The dependent job: shard status, 06_summary per device, reports/index.html."""
    partition = opts.summary_partition or opts.partitions[0].name
    lines = _header(opts, f"{opts.job_name}-summary", partition, opts.summary_time_limit,
                    str(state / "logs" / "summary-%j.out"))
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(root))}", *_setup_lines(opts),
              f"exec {shlex.quote(opts.interpreter)} -m rope_kernels submit "
              f"--state {shlex.quote(str(state))} --finish"]
    return "\n".join(lines) + "\n"


# --- state -------------------------------------------------------------------------

def _manifest_path(state: Path) -> Path:
    return Path(state) / "manifest.json"


def load_manifest(state: Path) -> dict:
    path = _manifest_path(state)
    if not path.exists():
        raise SubmitError(f"{state} is not a submission (no manifest.json)")
    manifest = _read_json(path, "manifest")
    shards = manifest.get("shards") if isinstance(manifest, dict) else None
    fields = {"index": int, "partition": str, "notebook": str, "label": str, "output": str,
              "rows_filter": dict}
    if (not isinstance(shards, list) or not isinstance(manifest.get("name"), str)
            or not isinstance(manifest.get("submissions", []), list)
            or not all(isinstance(s, dict) and all(isinstance(s.get(k), t)
                                                   for k, t in fields.items()) for s in shards)):
        raise SubmitError(f"{path}: not a submission manifest (its name, shards or "
                          "submissions are missing or malformed)")
    # Names become paths (reports/slurm/<name>.html, <partition>.sbatch): as at submission.
    for what, value in [("name", manifest["name"])] + [("partition", s["partition"])
                                                        for s in shards]:
        if not _SAFE_NAME.fullmatch(value):
            raise SubmitError(f"{path}: {what} {value!r} is not a safe name")
    return manifest


def _read_json(path: Path, what: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SubmitError(f"{path}: unreadable {what} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def _save_manifest(state: Path, manifest: dict) -> None:
    write_atomic(_manifest_path(state), json.dumps(manifest, indent=1) + "\n")


def latest_state(root: Path = REPO_ROOT) -> Path:
    """The most recent submission under slurm/."""
    found = sorted((Path(root) / STATE_DIR).glob("*/manifest.json"),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise SubmitError(f"no submissions under {Path(root) / STATE_DIR}")
    return found[-1].parent


def _marker(state: Path, index: int) -> Path:
    return Path(state) / "tasks" / f"{index}.json"


def run_task(state: Path, index: int, runner_argv: Sequence[str]) -> int:
    """Inside an array task: mark started, run the runner (``python -m rope_kernels
    run ...`` in a child process: the command line stays the top of the package, no
    import circle), mark ended with its status and its last error line."""
    from rope_kernels.study.devices import REPO_ROOT as repo, device_name, device_slug
    from rope_kernels.study.runner import resolve_device

    marker = _marker(state, index)
    kind = runner_argv[runner_argv.index("--device") + 1] if "--device" in runner_argv else "auto"
    record = {"index": index, "host": socket.gethostname(), "started": time.time(),
              "job": f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_"
                     f"{os.environ.get('SLURM_ARRAY_TASK_ID', index)}",
              "runner_argv": list(runner_argv)}
    try:
        record["device"] = device_slug(device_name(resolve_device(kind)))
    except Exception as exc:  # e.g. the node has no GPU of that kind: the runner says so
        record["device"] = ""
        record["device_error"] = str(exc)
    write_atomic(marker, json.dumps(record) + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    last = ""
    try:
        with subprocess.Popen([sys.executable, "-m", "rope_kernels", *runner_argv], env=env,
                              stderr=subprocess.PIPE, text=True, errors="replace") as proc:
            for line in proc.stderr:  # to the task's log as it comes; the last line kept
                sys.stderr.write(line)
                last = line.strip() or last
        rc = proc.returncode
    except OSError as exc:
        last, rc = f"{type(exc).__name__}: {exc}", 1
    if rc != 0:  # recorded, the task fails
        record["error"] = last[-300:] or f"exit status {rc}"
        print(f"rope-study: task {index}: {record['error']}", file=sys.stderr)
    record.update(ended=time.time(), rc=rc)
    write_atomic(marker, json.dumps(record) + "\n")
    return rc


def _count_rows(root: Path, shard: dict, marker: dict) -> int:
    """Rows of the shard's slice that its task wrote (timestamped after it started)."""
    path = Path(root) / "data" / marker.get("device", "") / shard["output"]
    if not shard["output"] or not marker.get("device") or not path.exists():
        return 0
    df = read_table(path)
    if df.empty or "timestamp" not in df:
        return 0
    keep = pd.to_datetime(df["timestamp"], utc=True) >= pd.Timestamp(
        int(marker["started"]), unit="s", tz="UTC")
    for col, values in shard["rows_filter"].items():
        keep &= df[col].isin(values)
    return int(keep.sum())


def shard_status(state: Path, root: Path = REPO_ROOT) -> pd.DataFrame:
    """One row per shard: ok, no rows, failed, unfinished (killed, timed out or still
    running) or not run (cancelled before it started, or never scheduled)."""
    manifest = load_manifest(state)
    rows = []
    for shard in manifest["shards"]:
        path = _marker(state, shard["index"])
        marker = _read_marker(path, shard["index"]) if path.exists() else None
        row = {k: shard[k] for k in ("index", "partition", "notebook", "label")}
        row.update(device="", job="", host="", seconds=float("nan"), rc=float("nan"), rows=0)
        if marker is None:
            row["status"] = "not run"
        else:
            row.update(device=marker.get("device", ""), job=marker.get("job", ""),
                       host=marker.get("host", ""))
            if "ended" not in marker:
                row["status"] = "unfinished"
            else:
                row.update(rc=marker["rc"], seconds=round(marker["ended"] - marker["started"], 1))
                if marker["rc"] != 0:
                    row["status"] = f"failed (exit {marker['rc']})"
                elif shard["output"]:
                    row["rows"] = _count_rows(root, shard, marker)
                    row["status"] = "ok" if row["rows"] else "no rows"
                else:
                    row["status"] = "ok"
        rows.append(row)
    return pd.DataFrame(rows)


def _read_marker(path: Path, index: int) -> dict:
    marker = _read_json(path, f"task marker of shard {index} (delete it to count the shard as "
                              "not run)")
    if not isinstance(marker, dict) or not isinstance(marker.get("started"), (int, float)) \
            or ("ended" in marker and not isinstance(marker.get("rc"), int)):
        raise SubmitError(f"{path}: not a task marker of shard {index} (delete it to count the "
                          "shard as not run)")
    return marker


def missing_shards(status: pd.DataFrame) -> pd.DataFrame:
    return status[status["status"] != "ok"]


def _status_html(manifest: dict, status: pd.DataFrame, state: Path) -> str:
    import html

    missing = missing_shards(status)
    verdict = (f"<p>All {len(status)} shards delivered rows.</p>" if missing.empty else
               f"<p><b>{len(missing)} of {len(status)} shards missing</b>: "
               f"{html.escape(', '.join(missing['label']))}. Re-submit them with "
               f"<code>python -m rope_kernels submit --missing --state "
               f"{html.escape(str(state))}</code>.</p>")
    jobs = "; ".join(f"{', '.join(f'{p} {j}' for p, j in s['jobs'].items())}, summary "
                     f"{s.get('summary_job', '-')} ({s['submitted']})"
                     for s in manifest.get("submissions", []))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>Slurm shards: {html.escape(manifest['name'])}</title></head><body>"
            f"<h1>Slurm submission {html.escape(manifest['name'])}</h1>"
            f"<p>Commit {html.escape(manifest['commit'])}; jobs: {html.escape(jobs)}</p>"
            + verdict + status.to_html(index=False, na_rep="-", border=1)
            + "</body></html>\n")


def finish(state: Path, root: Path = REPO_ROOT, log=print) -> pd.DataFrame:
    """The summary job: shard status, 06_summary for every device that ran, the index."""
    from rope_kernels.study.reports import build_index, notebook_to_html
    from rope_kernels.study.execution import execute_notebook

    root, state = Path(root), Path(state)
    manifest = load_manifest(state)
    status = shard_status(state, root)
    write_atomic(state / "status.csv", status.to_csv(index=False))
    write_atomic(root / "reports" / STATE_DIR / f"{manifest['name']}.html",
                 _status_html(manifest, status, state))
    log(status.to_string(index=False))
    for device in sorted(set(status.loc[status["status"] == "ok", "device"]) - {""}):
        report_dir = root / "reports" / device
        executed = execute_notebook(root / "notebooks" / f"{SUMMARY_NOTEBOOK}.ipynb",
                                    report_dir / f"{SUMMARY_NOTEBOOK}.ipynb",
                                    {"data_root": str(root / "data"), "device_folders": "all"},
                                    cwd=root / "notebooks")
        notebook_to_html(executed, report_dir / f"{SUMMARY_NOTEBOOK}.html")
        log(f"{SUMMARY_NOTEBOOK} -> {report_dir.relative_to(root)}")
    # A cluster's results are not committed yet: the index lists every device folder.
    log(f"index: {build_index(root, 'all').relative_to(root)}")
    missing = missing_shards(status)
    if len(missing):
        log(f"{len(missing)} shard(s) missing: {', '.join(missing['label'])}\n"
            f"re-submit them: python -m rope_kernels submit --missing --state {state}")
    return status


# --- submission ----------------------------------------------------------------------

def _slurm_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run a Slurm client; a missing or hanging one is a one-line SubmitError."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise SubmitError(f"{argv[0]} not found: run submit on a Slurm login node (or put "
                          "Slurm's commands on PATH)") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{argv[0]} did not answer within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise SubmitError(f"{argv[0]} could not run: {exc}") from None


def _sbatch(args: Sequence[str]) -> str:
    proc = _slurm_command(["sbatch", "--parsable", *args], 120)
    if proc.returncode != 0:
        raise SubmitError(f"sbatch {' '.join(args)} failed: "
                          f"{' '.join(proc.stderr.split()) or f'exit {proc.returncode}'}")
    job = proc.stdout.strip().split(";")[0]
    if not re.fullmatch(r"\d+", job):
        raise SubmitError(f"sbatch {' '.join(args)} printed {proc.stdout.strip()!r}, not a job id")
    return job


def _submit_jobs(manifest: dict, state: Path, indices: Sequence[int], opts: SlurmOptions,
                 after: Sequence[str] = ()) -> dict:
    """sbatch each partition's array for ``indices``, then the summary job after them
    (and after ``after``: earlier jobs still in the queue). Each job is written to the
    manifest as soon as sbatch accepts it: when a later sbatch fails, the jobs already
    queued are on record (``--missing`` then leaves them be)."""
    by_partition: dict[str, list[int]] = {}
    for shard in manifest["shards"]:
        if shard["index"] in indices:
            by_partition.setdefault(shard["partition"], []).append(shard["index"])
    record = {"jobs": {}, "indices": [], "partition_indices": {},
              "submitted": _dt.datetime.now().isoformat(timespec="seconds")}
    manifest.setdefault("submissions", []).append(record)
    for name, idx in by_partition.items():
        spec = _array_spec(idx) + (f"%{opts.max_running}" if opts.max_running else "")
        try:
            record["jobs"][name] = _sbatch([f"--array={spec}", str(state / f"{name}.sbatch")])
        except SubmitError as exc:
            queued = ", ".join(f"{p} {j}" for p, j in record["jobs"].items())
            raise SubmitError(f"{exc} ({'queued and recorded: ' + queued + '; ' if queued else ''}"
                              f"`submit --missing --state {state}` submits the rest)") from None
        record["partition_indices"][name] = sorted(idx)
        record["indices"] = sorted(record["indices"] + idx)
        _save_manifest(state, manifest)
    try:
        summary = _sbatch([f"--dependency=afterany:{':'.join([*record['jobs'].values(), *after])}",
                           str(state / "summary.sbatch")])
    except SubmitError as exc:
        raise SubmitError(f"{exc} (the arrays are queued and recorded; once they end, "
                          f"`submit --state {state} --finish` writes the summary)") from None
    record["summary_job"] = summary
    _save_manifest(state, manifest)
    return record


def submit(opts: SlurmOptions, *, only: Sequence[str] | None = None,
           params_file: Path | None = None, overrides: Sequence[str] = (),
           name: str | None = None, dry_run: bool = False, root: Path = REPO_ROOT,
           log=print) -> Path:
    """Write the scripts and manifest of a new submission, then sbatch them (unless
    ``dry_run``: then print the scripts). Returns the submission's state folder."""
    from rope_kernels.study.devices import git_commit

    root = Path(root)
    name = check_name("--name", name or time.strftime("%Y%m%d-%H%M%S"))
    for text in overrides:  # each becomes one quoted word of a job script line
        _check_one_line("-p", text)
    if params_file is not None:
        _check_one_line("--params", str(params_file))
    shards = plan_shards(opts.partitions, only=only, params_file=params_file,
                         overrides=overrides, root=root)
    state = root / STATE_DIR / name
    if _manifest_path(state).exists():
        raise SubmitError(f"submission {name!r} exists ({state}); pick another --name")
    scripts = {f"{p.name}.sbatch": array_script(opts, p, [s for s in shards if s.partition == p.name],
                                                state, root) for p in opts.partitions}
    scripts["summary.sbatch"] = summary_script(opts, state, root)
    if dry_run:
        for fname, text in scripts.items():
            log(f"# ---- {state / fname}\n{text}")
        log(f"# {len(shards)} shards; sbatch --array per partition, then the summary job "
            "with --dependency=afterany on them")
        return state
    (state / "logs").mkdir(parents=True, exist_ok=True)
    for fname, text in scripts.items():
        write_atomic(state / fname, text)
    manifest = {"name": name, "root": str(root), "commit": git_commit(),
                "created": _dt.datetime.now().isoformat(timespec="seconds"),
                "options": asdict(opts), "shards": [asdict(s) for s in shards]}
    _save_manifest(state, manifest)
    record = _submit_jobs(manifest, state, [s.index for s in shards], opts)
    log(f"submitted {len(shards)} shards as {record['jobs']} and summary job "
        f"{record['summary_job']}; state in {state}")
    return state


def _options_from_manifest(manifest: dict) -> SlurmOptions:
    try:
        raw = dict(manifest["options"])
        raw["partitions"] = tuple(Partition(**p) for p in raw["partitions"])
        for key in ("sbatch_lines", "modules", "setup_lines"):
            raw[key] = tuple(raw[key])
        return SlurmOptions(**raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise SubmitError(f"the manifest of {manifest.get('name')!r} holds unusable Slurm "
                          f"options ({type(exc).__name__}: {exc})") from None


def _active_jobs(job_ids: Sequence[str]) -> list[str]:
    """'JOBID STATE' of each of ``job_ids`` still in the queue, one line per array task
    ('123_4 RUNNING', '123_5 PENDING')."""
    if not job_ids:
        return []
    proc = _slurm_command(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(job_ids)], 60)
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise SubmitError(f"squeue failed: {' '.join(proc.stderr.split())}")
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def _queued_shards(manifest: dict, active: Sequence[str]) -> set[int]:
    """Shard indices whose array task is still pending or running (array task id =
    shard index). A whole array job listed without a task id counts every shard of it."""
    jobs = {}
    for sub in manifest.get("submissions", []):
        for partition, job in sub.get("jobs", {}).items():
            indices = sub.get("partition_indices", {}).get(partition)
            if indices is None:  # a record from before partition_indices: its partition's
                indices = [s["index"] for s in manifest["shards"]
                           if s["index"] in sub.get("indices", []) and s["partition"] == partition]
            jobs[str(job)] = set(indices)
    queued = set()
    for line in active:
        job, _, task = line.split()[0].partition("_")
        if job in jobs:
            queued |= {int(task)} if task.isdigit() else jobs[job]
    return queued


def resubmit_missing(state: Path, root: Path = REPO_ROOT, *, dry_run: bool = False,
                     log=print) -> list[int]:
    """sbatch again only the shards of ``state`` that are not ok and not still in the
    queue (squeue is asked first); returns their indices."""
    manifest = load_manifest(state)
    submissions = manifest.get("submissions", [])
    arrays = [str(j) for s in submissions for j in s.get("jobs", {}).values() if j]
    summaries = [str(s["summary_job"]) for s in submissions if s.get("summary_job")]
    active = _active_jobs(arrays + summaries)
    queued = _queued_shards(manifest, active)
    missing = missing_shards(shard_status(state, root))
    waiting = missing[missing["index"].isin(queued)]
    missing = missing[~missing["index"].isin(queued)]
    if len(waiting):
        log(f"{state.name}: {len(waiting)} shard(s) still queued or running, left alone: "
            f"{', '.join(waiting['label'])}")
    indices = [int(i) for i in missing["index"]]
    if not indices:
        log(f"{state.name}: no shard missing" + (" that is not in the queue" if len(waiting)
                                                  else ""))
        return []
    log(f"{state.name}: re-submitting {len(indices)} shard(s): {', '.join(missing['label'])}")
    if dry_run:
        return indices
    for i in indices:
        _marker(state, i).unlink(missing_ok=True)
    still_running = sorted({line.split()[0].partition("_")[0] for line in active} & set(arrays))
    with file_lock(_manifest_path(state)):
        record = _submit_jobs(load_manifest(state), state, indices,
                              _options_from_manifest(manifest), after=still_running)
    log(f"submitted as {record['jobs']}, summary job {record['summary_job']}")
    return indices
