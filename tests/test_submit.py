"""``submit`` refuses what would break a job script or land outside slurm/<name>/, keeps a
record of every job sbatch accepted, asks the queue before re-submitting, and answers a
broken state or a missing Slurm command with one line. Slurm's commands are stand-ins
here (tests/test_slurm.py runs the real thing)."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from rope_kernels.__main__ import main
from rope_kernels.infra import submit as sb
from rope_kernels.study.devices import REPO_ROOT
from rope_kernels.study.runner import ParameterError

FAKE_SBATCH = """#!/bin/sh
# sbatch stand-in: fails for a script whose path holds $FAKE_SBATCH_FAIL, else the next job id
for a; do last="$a"; done
echo "$@" >> "$FAKE_DIR/sbatch_calls"
if [ -n "$FAKE_SBATCH_FAIL" ]; then
  case "$last" in *"$FAKE_SBATCH_FAIL"*) echo "sbatch: error: invalid partition specified" >&2; exit 1;; esac
fi
n=$(cat "$FAKE_DIR/next_id" 2>/dev/null || echo 100)
echo $((n + 1)) > "$FAKE_DIR/next_id"
echo "$n"
"""
FAKE_SQUEUE = """#!/bin/sh
# squeue stand-in: prints the queue the test wrote
echo "$@" >> "$FAKE_DIR/squeue_calls"
cat "$FAKE_DIR/queue" 2>/dev/null
exit 0
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch and squeue stand-ins first on PATH; returns their folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("FAKE_DIR", str(bin_dir))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.fixture
def root(tmp_path):
    """A checkout stand-in: the real notebooks and profiles, its own slurm/."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("notebooks", "params"):
        (root / name).symlink_to(REPO_ROOT / name)
    return root


def _opts(*parts: str, **kw) -> sb.SlurmOptions:
    return sb.SlurmOptions(partitions=tuple(sb.Partition.parse(p) for p in parts), **kw)


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rope-study: error: ") and err.count("\n") == 1, err
    return err


# -- what goes into a job script --------------------------------------------------------
@pytest.mark.parametrize("field, value, named", [
    ("account", "proj\n#SBATCH --output=/etc/passwd", "--account"),
    ("account", "proj --output=/tmp/x", "--account"),
    ("constraint", "a100\nrm -rf ~", "--constraint"),
    ("mem", "64G;reboot", "--mem"),
    ("job_name", "study\necho pwned", "--job-name"),
    ("job_name", "../../x", "--job-name"),
    ("summary_partition", "../x", "--summary-partition"),
    ("time_limit", "banana", "not a Slurm time"),
    ("time_limit", "01:00:00\n#SBATCH --x", "not a Slurm time"),
    ("sbatch_lines", ("--qos=short\necho pwned",), "--sbatch"),
    ("sbatch_lines", ("--qos=short --output=/x",), "--sbatch"),
    ("sbatch_lines", ("--qos=$(reboot)",), "--sbatch"),
    ("venv", "/opt/venv\necho pwned", "--venv"),
    ("conda_env", "env\rx", "--conda-env"),
    ("modules", ("cuda/12\necho pwned",), "--module"),
    ("setup_lines", ("export A=1\necho pwned",), "--setup"),
    ("python", "python3\necho pwned", "--python"),
])
def test_string_options_that_would_inject_script_lines_are_refused(field, value, named):
    with pytest.raises(ParameterError, match=re.escape(named)):
        _opts("h200", **{field: value})


def test_ordinary_option_values_are_accepted():
    opts = _opts("h200=cuda:h100", "mi300x=rocm", account="proj-123_a", constraint="a100&nvlink",
                 mem="64G", time_limit="1-12:00:00", sbatch_lines=("--qos=short", "--exclusive"),
                 modules=("cuda/12.4",), setup_lines=('export HF_HOME="$SCRATCH/hf"',),
                 venv="~/venvs/rope study")
    assert [p.name for p in opts.partitions] == ["h200", "mi300x"]


@pytest.mark.parametrize("text", ["../../../x", "a/b", ".hidden", "-x", "x\ny", "summary"])
def test_partition_names_are_safe_file_names(text):
    with pytest.raises(ParameterError, match="--partition"):
        _opts(text)


@pytest.mark.parametrize("name", ["../../../x", "a/b", ".x", "x\ny", ""])
def test_submission_names_stay_inside_slurm(root, name, fake_slurm):
    with pytest.raises(ParameterError, match="--name"):
        sb.submit(_opts("h200"), only=["01"], name=name or " ", root=root, log=lambda *_: None)
    assert sorted(p.name for p in root.iterdir()) == ["notebooks", "params"]


def test_time_is_checked_in_a_dry_run(capsys):
    err = _one_line_error(capsys, ["submit", "--partition", "h200", "--time", "banana",
                                   "--dry-run"])
    assert "'banana' is not a Slurm time" in err
    err = _one_line_error(capsys, ["submit", "--partition", "h200", "--account", "a\nb",
                                   "--dry-run"])
    assert "--account" in err
    err = _one_line_error(capsys, ["submit", "--partition", "h200", "--only", "01", "-p",
                                   "samples=1\necho pwned", "--dry-run"])
    assert "-p 'samples=1" in err


# -- every job on record, the queue asked -----------------------------------------------
def test_a_failed_sbatch_keeps_the_jobs_already_queued_on_record(root, fake_slurm, monkeypatch):
    """sbatch accepts partition a's array and refuses b's: a's job id is in the manifest, and
    --missing leaves a's queued shards alone, submits b's, and the new summary job waits for
    a's array too."""
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "/b.sbatch")
    opts = _opts("a", "b", gpus_per_task=0)
    with pytest.raises(sb.SubmitError, match=r"invalid partition.*queued and recorded: a 100"):
        sb.submit(opts, only=["01"], name="t", root=root, log=lambda *_: None)
    state = root / "slurm" / "t"
    manifest = json.loads((state / "manifest.json").read_text())
    assert manifest["submissions"][0]["jobs"] == {"a": "100"}
    shard_of = {s["partition"]: s["index"] for s in manifest["shards"]}

    monkeypatch.setenv("FAKE_SBATCH_FAIL", "")
    (fake_slurm / "queue").write_text(f"100_{shard_of['a']} PENDING\n")
    lines = []
    assert sb.resubmit_missing(state, root, log=lines.append) == [shard_of["b"]]
    assert "still queued or running, left alone" in lines[0]
    assert "-r" in (fake_slurm / "squeue_calls").read_text().split()
    calls = (fake_slurm / "sbatch_calls").read_text().splitlines()
    assert calls[-2].startswith(f"--parsable --array={shard_of['b']} ")
    assert "--dependency=afterany:101:100 " in calls[-1]
    record = json.loads((state / "manifest.json").read_text())["submissions"][-1]
    assert record["jobs"] == {"b": "101"} and record["summary_job"] == "102"

    # Nothing missing that is not queued: nothing submitted.
    (fake_slurm / "queue").write_text(f"100_{shard_of['a']} RUNNING\n101_{shard_of['b']} PENDING\n")
    n_calls = len((fake_slurm / "sbatch_calls").read_text().splitlines())
    assert sb.resubmit_missing(state, root, log=lambda *_: None) == []
    assert len((fake_slurm / "sbatch_calls").read_text().splitlines()) == n_calls


# -- one-line errors ----------------------------------------------------------------
def _state(tmp_path) -> Path:
    state = tmp_path / "slurm" / "t"
    (state / "tasks").mkdir(parents=True)
    shard = {"index": 0, "partition": "a", "kind": "cpu", "notebook": "01_kernels",
             "label": "01_kernels", "runner_args": [], "output": "correctness.csv",
             "rows_filter": {}}
    (state / "manifest.json").write_text(json.dumps({"name": "t", "root": str(tmp_path),
                                                     "commit": "x", "shards": [shard],
                                                     "submissions": []}))
    return state


@pytest.mark.parametrize("damage", ["{not json", '{"name": "t"}', "[]", '{"name": "t", '
                                    '"shards": [{"index": "0"}]}', '{"name": "../../x", '
                                    '"shards": []}'])
def test_a_corrupt_manifest_is_one_line(tmp_path, capsys, damage):
    state = _state(tmp_path)
    (state / "manifest.json").write_text(damage)
    err = _one_line_error(capsys, ["submit", "--status", "--state", str(state)])
    assert "manifest.json" in err


@pytest.mark.parametrize("damage", ["{trunc", '{"index": 0}', '"x"'])
def test_a_corrupt_task_marker_is_one_line(tmp_path, capsys, damage):
    state = _state(tmp_path)
    (state / "tasks" / "0.json").write_text(damage)
    err = _one_line_error(capsys, ["submit", "--status", "--state", str(state)])
    assert "tasks/0.json" in err and "delete it" in err


def test_missing_slurm_commands_are_one_line(tmp_path, capsys, monkeypatch):
    state = _state(tmp_path)
    manifest = json.loads((state / "manifest.json").read_text())
    manifest["submissions"] = [{"jobs": {"a": "7"}, "summary_job": "8", "indices": [0]}]
    (state / "manifest.json").write_text(json.dumps(manifest))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    err = _one_line_error(capsys, ["submit", "--missing", "--state", str(state)])
    assert "squeue not found" in err
    with pytest.raises(sb.SubmitError, match="sbatch not found"):
        sb._sbatch(["x.sbatch"])
