"""``submit`` against a real Slurm: munged, slurmctld and slurmd for one node on
loopback, started here (Debian's slurm-wlm and munge: never installed here; absent, the
test skips saying what to install, or fails under ROPE_REQUIRE_SLURM=1, which .ci/run sets
after installing them) and stopped at the end whatever happens.

A CPU-profile study goes in as a 4-task array (02 in two shape families, 04 in
two resolutions) plus the summary job; one task is killed with scancel while
it runs. Then: the merged CSVs hold every surviving shard's rows exactly once,
the killed shard is reported missing (status page linked from the index), and
``submit --missing`` re-submits only that shard, which then fills in.

The study runs in a copy of the checkout (its data/ and reports/ are the
copy's), so the real tree is never written.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from rope_kernels.study.devices import REPO_ROOT
from rope_kernels.study.results import ENCODER_LATENCY_KEY, MICROBENCH_KEY

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/mungekey", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
           "/usr/bin/sbatch")  # mungekey: the fixture makes its key with it
# What a task needs of the checkout (data/ and reports/ start empty but for the reference data).
COPIED = ("rope_kernels", "notebooks", "params", "data/reference", "pyproject.toml")
# Tiny shards: each task is seconds of work under the Triton interpreter (plus the start-up
# of Python, torch and a notebook kernel).
OVERRIDES = (
    "progress=false",
    '02_microbench.families=[{tokens: [16], heads: [2], head_dim: [8]},'
    ' {tokens: [33], heads: [2], head_dim: [8]}]',
    "02_microbench.samples=1",
    "04_ttft.resolutions=[56x56, 28x28]", "04_ttft.image_counts=[1]",
    "04_ttft.variants=[native, fused]", "04_ttft.samples=1", "04_ttft.layers=1",
)
KILLED = 3  # shard index of 04_ttft's second resolution (28x28): scancel'd while it runs
DEADLINE_S = 1500


def _slurm_missing() -> str | None:
    """None when Slurm's daemons and munge are installed, else why the test cannot run.
    A test installs nothing: ``.ci/run`` installs Debian's slurm-wlm and munge (and sets
    ROPE_REQUIRE_SLURM=1, which turns this skip into a failure there)."""
    missing = [p for p in DAEMONS if not Path(p).exists()]
    if not missing:
        return None
    why = (f"Slurm is not installed here ({', '.join(missing)} missing): install slurm-wlm "
           "and munge (apt-get install slurm-wlm munge; .ci/run does)")
    if os.environ.get("ROPE_REQUIRE_SLURM") == "1":
        pytest.fail(why)
    return why


def test_absent_slurm_skips_saying_what_to_install_or_fails_where_required(monkeypatch):
    """Nothing is installed: an absent tool is a skip naming the packages, or a failure
    under ROPE_REQUIRE_SLURM=1 (.ci/run sets it where apt-get could install them)."""
    monkeypatch.setattr(sys.modules[__name__], "DAEMONS", ("/nonexistent/slurmd",))
    monkeypatch.delenv("ROPE_REQUIRE_SLURM", raising=False)
    why = _slurm_missing()
    assert "/nonexistent/slurmd" in why and "slurm-wlm" in why
    monkeypatch.setenv("ROPE_REQUIRE_SLURM", "1")
    with pytest.raises(pytest.fail.Exception, match="slurm-wlm"):
        _slurm_missing()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout_s: float, what: str, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm on loopback; yields the environment its clients need."""
    why_not = _slurm_missing()
    if why_not:
        pytest.skip(why_not)
    if os.geteuid() != 0:
        pytest.skip("a loopback Slurm with SlurmUser=root needs root")
    tmp = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "log", "munge"):
        (tmp / sub).mkdir()
    os.chmod(tmp / "munge", 0o755)  # clients reach the socket; the key file itself is 0600
    key, sock = tmp / "munge" / "munge.key", tmp / "munge" / "munge.sock"
    subprocess.run(["/usr/sbin/mungekey", "--create", f"--keyfile={key}"], check=True,
                   capture_output=True)
    node = subprocess.run(["/usr/sbin/slurmd", "-C"], capture_output=True, text=True,
                          check=True).stdout.splitlines()[0]
    # Exactly what this machine has, under the name slurmd is started with (-N localhost).
    node = "NodeName=localhost " + node.split(" ", 1)[1]
    conf = tmp / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=ropetest", "SlurmctldHost=localhost", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
        f"StateSaveLocation={tmp / 'state'}", f"SlurmdSpoolDir={tmp / 'spool'}",
        f"SlurmctldPidFile={tmp / 'slurmctld.pid'}", f"SlurmdPidFile={tmp / 'slurmd.pid'}",
        f"SlurmctldLogFile={tmp / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={tmp / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "ReturnToService=2", "MpiDefault=none",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none", "KillWait=5", "InactiveLimit=0", "MinJobAge=600",
        node + " State=UNKNOWN",
        "PartitionName=study Nodes=localhost Default=YES MaxTime=INFINITE State=UP", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    try:
        # Foreground (-F / -D) so each is a child of this test, stopped by its pid.
        procs.append(subprocess.Popen(
            ["/usr/sbin/munged", "-F", "--force", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={tmp / 'munge' / 'munged.pid'}", f"--seed-file={tmp / 'munge' / 'seed'}",
             f"--log-file={tmp / 'log' / 'munged.log'}"], env=env))
        _wait(sock.exists, 30, "munged's socket")
        procs.append(subprocess.Popen(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(["/usr/sbin/slurmd", "-D", "-N", "localhost", "-f", str(conf)],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))

        def node_idle():
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True,
                                 text=True).stdout.strip()
            return out == "idle"

        try:
            _wait(node_idle, 90, "the node to come up idle")
        except TimeoutError:
            logs = "\n".join(p.read_text()[-1500:] for p in (tmp / "log").glob("*.log"))
            pytest.fail(f"loopback Slurm did not come up:\n{logs}")
        yield env
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout")
    for rel in COPIED:
        src = REPO_ROOT / rel
        if src.is_dir():
            shutil.copytree(src, root / rel, ignore=shutil.ignore_patterns(
                "__pycache__", ".ipynb_checkpoints", "*.failed.ipynb"))
        else:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    return root


def _cli(args, root: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "rope_kernels", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"rope_kernels {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _queue(env) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def _logs(state: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(
        (state / "logs").glob("*.out")))


def _wait_for_queue_to_drain(env, state: Path):
    try:
        _wait(lambda: not _queue(env), DEADLINE_S, "the jobs to finish", poll_s=3)
    except TimeoutError:
        pytest.fail(f"jobs still queued: {_queue(env)}\n{_logs(state)}")


def test_job_array_through_slurm(slurm, checkout):
    env = {**slurm, "ROPE_STUDY_COMMIT": "slurmtest", "PYTHONPATH": str(checkout)}
    args = ["submit", "--partition", "study=cpu", "--gpus-per-task", "0", "--cpus-per-task", "1",
            "--time", "00:30:00", "--name", "t", "--only", "02", "--only", "04"]
    for o in OVERRIDES:
        args += ["-p", o]
    dry = _cli(args + ["--dry-run"], checkout, env).stdout
    runs = [line for line in dry.splitlines() if "RUN=(run --device cpu" in line]
    assert len(runs) == 4 and "--only 04_ttft" in runs[-1] and "afterany" in dry
    assert not (checkout / "slurm" / "t").exists(), "--dry-run wrote state"

    print(_cli(args, checkout, env).stdout)
    state = checkout / "slurm" / "t"
    manifest = json.loads((state / "manifest.json").read_text())
    shards = manifest["shards"]
    assert [s["notebook"] for s in shards] == ["02_microbench", "02_microbench", "04_ttft",
                                               "04_ttft"]
    assert shards[KILLED]["rows_filter"] == {"resolution": ["28x28"]}
    array_job = manifest["submissions"][0]["jobs"]["study"]

    # Kill the 28x28 shard while it runs (its start marker is there, its end marker not).
    marker = state / "tasks" / f"{KILLED}.json"
    try:
        _wait(marker.exists, DEADLINE_S, f"shard {KILLED} to start", poll_s=0.5)
    except TimeoutError:
        pytest.fail(f"shard {KILLED} never started: {_queue(slurm)}\n{_logs(state)}")
    subprocess.run(["scancel", f"{array_job}_{KILLED}"], env=slurm, check=True)
    _wait_for_queue_to_drain(slurm, state)

    status = pd.read_csv(state / "status.csv")
    print(status.to_string())
    by_index = status.set_index("index")["status"]
    assert by_index[KILLED] in ("unfinished", "not run"), _logs(state)
    assert (by_index.drop(KILLED) == "ok").all(), f"{by_index}\n{_logs(state)}"
    assert "ended" not in json.loads(marker.read_text())

    data = checkout / "data" / "cpu"
    micro = pd.read_csv(data / "microbench.csv")
    assert not micro.duplicated(list(MICROBENCH_KEY)).any()
    per_shape = micro.groupby(["tokens", "heads", "head_dim"]).size()
    # Both families' rows, written by two tasks through the lock, none lost.
    assert set(per_shape.index) == {(16, 2, 8), (33, 2, 8)}
    assert per_shape.nunique() == 1 and per_shape.iloc[0] == len(set(micro["variant"])) * len(
        set(micro["mode"])) * len(set(micro["dtype"]))
    ttft = pd.read_csv(data / "encoder_latency.csv")
    assert not ttft.duplicated(list(ENCODER_LATENCY_KEY)).any()
    assert set(ttft["resolution"]) == {"56x56"}, "the killed shard left rows"
    assert set(ttft["variant"]) == {"native", "fused"}

    index = (checkout / "reports" / "index.html").read_text()
    assert "slurm/t.html" in index and "06_summary" in index
    page = (checkout / "reports" / "slurm" / "t.html").read_text()
    assert "1 of 4 shards missing" in page and "28x28" in page

    # One command re-submits just the missing shard; the summary then finds none missing.
    out = _cli(["submit", "--missing", "--state", str(state)], checkout, env).stdout
    assert "re-submitting 1 shard(s)" in out, out
    _wait_for_queue_to_drain(slurm, state)
    manifest = json.loads((state / "manifest.json").read_text())
    assert manifest["submissions"][-1]["indices"] == [KILLED]
    status = pd.read_csv(state / "status.csv")
    assert (status["status"] == "ok").all(), f"{status}\n{_logs(state)}"
    ttft = pd.read_csv(data / "encoder_latency.csv")
    assert set(ttft["resolution"]) == {"56x56", "28x28"}
    assert not ttft.duplicated(list(ENCODER_LATENCY_KEY)).any()
    assert "All 4 shards delivered rows" in (checkout / "reports" / "slurm" / "t.html").read_text()
