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
``reports/slurm/<name>.html``), re-runs ``05_summary`` per device and rebuilds
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
from rope_kernels.study.results import file_lock, write_atomic
from rope_kernels.study.runner import (
    NOTEBOOKS,
    ParameterError,
    load_profile,
    notebook_parameters,
    resolve_parameters,
    select_notebooks,
)

# The list parameter a notebook is split along: one task per item.
SHARD_PARAMETER = {"02_microbench": "families", "04_ttft": "resolutions"}
# The CSV each notebook fills (a shard delivered when it wrote rows there).
NOTEBOOK_OUTPUT = {"01_kernels": "correctness.csv", "02_microbench": "microbench.csv",
                   "03_profile": "launches.csv", "04_ttft": "ttft.csv"}
SUMMARY_NOTEBOOK = "05_summary"
DEVICE_KINDS = ("cuda", "rocm", "cpu")
STATE_DIR = "slurm"


class SubmitError(RuntimeError):
    """sbatch/squeue failed, or a submission's state does not allow the request."""


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
        if kind not in DEVICE_KINDS:
            raise ParameterError(f"--partition {text!r}: device kind must be one of "
                                 f"{', '.join(DEVICE_KINDS)}, got {kind!r}")
        return cls(name, kind, gpu_type)


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
        if self.gpus_per_task < 0 or self.cpus_per_task < 1 or self.max_running < 0:
            raise ParameterError("--gpus-per-task >= 0, --cpus-per-task >= 1, --max-running >= 0")

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


def _rows_filter(notebook: str, item) -> dict:
    """Which rows of the notebook's CSV belong to one slice of its shard parameter."""
    if notebook == "02_microbench":
        return {col: _as_list(item[col]) for col in ("tokens", "heads", "head_dim") if col in item}
    if notebook == "04_ttft":
        return {"resolution": [item]}
    return {}


def plan_shards(partitions: Sequence[Partition], *, only: Sequence[str] | None = None,
                params_file: Path | None = None, overrides: Sequence[str] = (),
                root: Path = REPO_ROOT) -> list[Shard]:
    """Resolve every partition's parameters as the runner will, then split them.

    The parameters are checked here, on the login node, so a typo fails the
    submission instead of every task."""
    root = Path(root)
    notebooks = [nb for nb in select_notebooks(only) if nb != SUMMARY_NOTEBOOK]
    specs = {nb: notebook_parameters(root / "notebooks" / f"{nb}.ipynb") for nb in NOTEBOOKS}
    shards: list[Shard] = []
    for part in partitions:
        layers = [(f"params/{part.kind}.yaml", load_profile(root / "params" / f"{part.kind}.yaml"))]
        if params_file is not None:
            layers.append((str(params_file), load_profile(Path(params_file))))
        params = resolve_parameters(notebooks, specs, layers, overrides)
        base = ["run", "--device", part.kind]
        if params_file is not None:
            base += ["--params", str(Path(params_file).resolve())]
        for text in overrides:
            base += ["-p", text]
        for nb in notebooks:
            name = SHARD_PARAMETER.get(nb)
            items = _as_list(params[nb].get(name, specs[nb].get(name))) if name else []
            if not items:
                shards.append(Shard(len(shards), part.name, part.kind, nb, nb,
                                    base + ["--only", nb], NOTEBOOK_OUTPUT.get(nb, "")))
                continue
            for i, item in enumerate(items):
                args = base + ["--only", nb, "-p", f"{nb}.{name}={json.dumps([item])}"]
                # A config sweep runs once, with the first slice, not once per slice.
                if nb == "02_microbench" and i > 0:
                    args += ["-p", f"{nb}.config_sweep=false"]
                shards.append(Shard(len(shards), part.name, part.kind, nb,
                                    f"{nb} {name}[{i}]={json.dumps(item)}", args,
                                    NOTEBOOK_OUTPUT.get(nb, ""), _rows_filter(nb, item)))
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
    """The dependent job: shard status, 05_summary per device, reports/index.html."""
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
    return json.loads(path.read_text())


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
    """Inside an array task: mark started, run the runner, mark ended with its status."""
    from rope_kernels.__main__ import main as cli
    from rope_kernels.study.devices import device_name, device_slug
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
    try:
        rc = cli(list(runner_argv))
    except Exception as exc:  # a notebook cell raised: recorded, the task fails
        print(f"rope-study: task {index}: {type(exc).__name__}: {exc}", file=sys.stderr)
        record["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
        rc = 1
    record.update(ended=time.time(), rc=rc)
    write_atomic(marker, json.dumps(record) + "\n")
    return rc


def _count_rows(root: Path, shard: dict, marker: dict) -> int:
    """Rows of the shard's slice that its task wrote (timestamped after it started)."""
    path = Path(root) / "data" / marker.get("device", "") / shard["output"]
    if not shard["output"] or not marker.get("device") or not path.exists():
        return 0
    df = pd.read_csv(path)
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
        marker = json.loads(path.read_text()) if path.exists() else None
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
    """The summary job: shard status, 05_summary for every device that ran, the index."""
    from rope_kernels.study.reports import build_index, notebook_to_html
    from rope_kernels.study.runner import execute_notebook

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

def _sbatch(args: Sequence[str]) -> str:
    try:
        proc = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True,
                              timeout=120)
    except FileNotFoundError:
        raise SubmitError("sbatch not found: run submit on a Slurm login node") from None
    if proc.returncode != 0:
        raise SubmitError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def _submit_jobs(manifest: dict, state: Path, indices: Sequence[int], opts: SlurmOptions) -> dict:
    """sbatch each partition's array for ``indices``, then the summary job after them."""
    by_partition: dict[str, list[int]] = {}
    for shard in manifest["shards"]:
        if shard["index"] in indices:
            by_partition.setdefault(shard["partition"], []).append(shard["index"])
    jobs = {}
    for name, idx in by_partition.items():
        spec = _array_spec(idx) + (f"%{opts.max_running}" if opts.max_running else "")
        jobs[name] = _sbatch([f"--array={spec}", str(state / f"{name}.sbatch")])
    summary = _sbatch([f"--dependency=afterany:{':'.join(jobs.values())}",
                       str(state / "summary.sbatch")])
    record = {"jobs": jobs, "summary_job": summary, "indices": sorted(indices),
              "submitted": _dt.datetime.now().isoformat(timespec="seconds")}
    manifest.setdefault("submissions", []).append(record)
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
    shards = plan_shards(opts.partitions, only=only, params_file=params_file,
                         overrides=overrides, root=root)
    name = name or time.strftime("%Y%m%d-%H%M%S")
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
    raw = dict(manifest["options"])
    raw["partitions"] = tuple(Partition(**p) for p in raw["partitions"])
    for key in ("sbatch_lines", "modules", "setup_lines"):
        raw[key] = tuple(raw[key])
    return SlurmOptions(**raw)


def _active_jobs(job_ids: Sequence[str]) -> list[str]:
    if not job_ids:
        return []
    proc = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(job_ids)],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise SubmitError(f"squeue failed: {proc.stderr.strip()}")
    return [line for line in proc.stdout.splitlines() if line.strip()]


def resubmit_missing(state: Path, root: Path = REPO_ROOT, *, dry_run: bool = False,
                     log=print) -> list[int]:
    """sbatch again only the shards of ``state`` that are not ok; returns their indices."""
    manifest = load_manifest(state)
    job_ids = [j for s in manifest.get("submissions", []) for j in
               [*s["jobs"].values(), s.get("summary_job", "")] if j]
    active = _active_jobs(job_ids)
    if active:
        raise SubmitError(f"{state.name} still has jobs in the queue ({'; '.join(active)}): "
                          "wait for them or scancel them first")
    missing = missing_shards(shard_status(state, root))
    indices = [int(i) for i in missing["index"]]
    if not indices:
        log(f"{state.name}: no shard missing")
        return []
    log(f"{state.name}: re-submitting {len(indices)} shard(s): {', '.join(missing['label'])}")
    if dry_run:
        return indices
    for i in indices:
        _marker(state, i).unlink(missing_ok=True)
    with file_lock(_manifest_path(state)):
        record = _submit_jobs(load_manifest(state), state, indices,
                              _options_from_manifest(manifest))
    log(f"submitted as {record['jobs']}, summary job {record['summary_job']}")
    return indices
