"""The install routes list the same packages and resolve from the public index alone;
CI runs the README's command."""

import json
import os
import platform
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's
NOT_A_PACKAGE = {"python", "pip"}
PIP_ONLY_EXTRAS = {"gpu", "rocm-compile"}  # pip wheels, not in the conda environment: an
# NVIDIA node's peers; FlyDSL, whose compile also needs a system ld.lld (qkv_flydsl.py)
CONSTRAINT_FILES = ("constraints.txt", "constraints-cpu.txt", "constraints-gpu.txt")
INDEX = "https://pypi.org/simple/"


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[;]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirements(extras=None) -> list[str]:
    """pyproject's dependencies and those of ``extras`` (None: every extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        if extras is None or name in extras:
            specs += extra
    return specs


def pip_packages(skip_extras=()) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_name(s) for s in requirements(set(project["optional-dependencies"]) - set(skip_extras))}


def pins(path: Path) -> dict[str, str]:
    """name -> version of a constraints file, its nested ``-c`` files included."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-c "):
            out.update(pins(path.parent / line[3:].strip()))
        elif line:
            name, version = line.split("==")
            out[_name(name)] = version.strip()
    return out


def conda_packages() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            names |= {_name(s) for s in dep.get("pip", []) if not s.startswith("-")}
        else:
            names.add(CONDA_TO_PIP.get(_name(dep), _name(dep)))
    return names - NOT_A_PACKAGE


def test_environment_yml_matches_pyproject():
    assert conda_packages() == pip_packages(skip_extras=PIP_ONLY_EXTRAS)


@pytest.mark.parametrize("name", CONSTRAINT_FILES)
def test_constraints_pin_only_declared_packages(name):
    pinned = set(pins(ROOT / name))
    assert pinned <= pip_packages(), pinned - pip_packages()


def test_torch_is_pinned_with_the_triton_it_requires():
    """The pairs on the index (a Linux torch wheel there is the CUDA build, which
    requires one Triton); the resolver test below checks them against the index."""
    assert {k: v for k, v in pins(ROOT / "constraints-cpu.txt").items()
            if k in ("torch", "triton")} == {"torch": "2.13.0", "triton": "3.7.1"}
    # what the H200 measured: torch 2.11.0+cu130, Triton 3.6.0 (STUDY_FACTS)
    assert {k: v for k, v in pins(ROOT / "constraints-gpu.txt").items()
            if k in ("torch", "triton")} == {"torch": "2.11.0", "triton": "3.6.0"}
    assert not {"torch", "triton"} & set(pins(ROOT / "constraints.txt"))  # a ROCm node's own
    gpu = {_name(s): s.split("==")[1] for s in requirements({"gpu"}) if "==" in s}
    from rope_kernels.infra.carry import PEER_WHEELS  # the air-gapped flow's wheels

    carried = {_name(w.package): w.version for w in PEER_WHEELS}
    assert all(carried[n] == v for n, v in gpu.items() if n in carried), (gpu, carried)


# -- the install sets against the public index ------------------------------------------------
def _index_reachable() -> str:
    """'' when the public index answers, else why not."""
    try:
        with urllib.request.urlopen(INDEX + "pip/", timeout=20) as response:
            return "" if response.status == 200 else f"HTTP {response.status}"
    except OSError as exc:
        return str(exc)


@pytest.fixture(scope="module")
def index():
    if os.environ.get("ROPE_INDEX_CHECKED") == "1":  # .ci/run's second pass (another Triton)
        pytest.skip("the install sets were resolved against the index earlier in this CI run "
                    "(they do not depend on the Triton installed)")
    why = _index_reachable()
    if why:
        if os.environ.get("ROPE_REQUIRE_INDEX") == "1":  # CI: no network is a failure
            pytest.fail(f"the package index {INDEX} is not reachable: {why}")
        pytest.skip(f"the package index {INDEX} is not reachable: {why}")


def resolve(constraints: Path, *reqs: str, report: Path) -> subprocess.CompletedProcess:
    """What pip would install from the public index alone: ``--isolated`` drops every
    pip.conf and PIP_* setting (local wheel folders and extra indexes among them), and
    ``--ignore-installed`` resolves as in a fresh venv. Only metadata is downloaded.
    A CA bundle the machine names (PIP_CERT, a proxy's) is passed on: it is no package source."""
    cert = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
           "--disable-pip-version-check", "--quiet", "--index-url", INDEX, "--report", str(report),
           "-c", str(constraints), *(["--cert", cert] if cert else []), *reqs]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)


def _resolved(report: Path) -> dict[str, str]:
    return {_name(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}


INSTALL_SETS = {
    "cpu": ("constraints-cpu.txt", ("notebooks", "test", "peers")),
    "nvidia": ("constraints-gpu.txt", ("notebooks", "test", "peers", "gpu")),
}


@pytest.mark.slow
@pytest.mark.parametrize("stack", list(INSTALL_SETS))
def test_install_set_resolves_from_the_public_index(stack, index, tmp_path):
    """The Makefile's install (torch first, then the project with its extras) as one
    resolution: every pin of the constraints files is what gets installed."""
    if stack == "nvidia" and (sys.platform != "linux" or platform.machine() != "x86_64"):
        pytest.skip("the NVIDIA set (CUDA wheels) resolves for Linux x86_64 only")
    constraints, extras = INSTALL_SETS[stack]
    report = tmp_path / "report.json"
    result = resolve(ROOT / constraints, *requirements(set(extras)), report=report)
    assert result.returncode == 0, result.stderr[-3000:]
    got = _resolved(report)
    wanted = pins(ROOT / constraints)
    assert {n: got.get(n) for n in wanted if n in got} == {n: wanted[n] for n in wanted if n in got}
    assert got["torch"] == wanted["torch"] and got["triton"] == wanted["triton"]


@pytest.mark.slow
def test_resolver_check_fails_on_a_conflicting_pin(index, tmp_path):
    """The check above can fail: torch 2.13.0 with the Triton pinned before this file
    existed (3.6.0; torch 2.13.0 on the index requires 3.7.1) cannot be resolved."""
    bad = tmp_path / "constraints-conflicting.txt"
    bad.write_text(f"-c {ROOT / 'constraints.txt'}\ntorch==2.13.0\ntriton==3.6.0\n")
    result = resolve(bad, "torch==2.13.0", *requirements(set()), report=tmp_path / "report.json")
    assert result.returncode != 0
    assert "ResolutionImpossible" in result.stderr, result.stderr[-3000:]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "set -euo pipefail" in ci and "make test" in ci
    assert "make test" in readme and "make study" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:", makefile, re.M) and re.search(r"^study:", makefile, re.M)


# What an enclosing make hands its recipes' environment: its flags and its command-line
# variables, among them every one the Makefile sets with ``?=`` (read from it here).
MAKE_INHERITED = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"} | set(
    re.findall(r"^([A-Z_]+)\s*\?=", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("stack, constraints, torch_spec, extras", [
    ("cpu", "constraints-cpu.txt", "torch==2.13.0", "notebooks,test,peers"),
    ("nvidia", "constraints-gpu.txt", "torch==2.11.0", "notebooks,test,peers,gpu"),
    ("node", "constraints.txt", None, "notebooks,test,peers"),
])
def test_makefile_installs_each_stack_with_its_pins(tmp_path, stack, constraints, torch_spec, extras):
    """``make -n``: the commands the install would run, nothing run. The make that runs
    these tests (``make test-newest`` sets CONSTRAINTS and TORCH_SPEC on its command line)
    must not hand its variables down: a command-line variable reaches the tests' environment
    and would win over the Makefile's ``?=`` defaults, so those and MAKEFLAGS are left out."""
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in MAKE_INHERITED}
    out = subprocess.run(["make", "-n", f"{venv}/.installed", f"VENV={venv}", f"STACK={stack}"],
                         cwd=ROOT, capture_output=True, text=True, check=True, env=env).stdout
    pip = [line for line in out.splitlines() if " -m pip install" in line]
    assert all(f"-c {constraints} " in line for line in pip), pip
    assert (torch_spec is None) == (len(pip) == 1)
    if torch_spec:
        assert f'"{torch_spec}"' in pip[0]
    assert pip[-1].endswith(f'-e ".[{extras}]"')
    if stack == "node":
        assert "--system-site-packages" in out  # the node's own PyTorch and Triton
    index = subprocess.run(["make", "-n", f"{venv}/.installed", f"VENV={venv}",
                            "TORCH_INDEX=https://download.pytorch.org/whl/cpu"],
                           cwd=ROOT, capture_output=True, text=True, check=True, env=env).stdout
    assert "--index-url https://download.pytorch.org/whl/cpu \"torch==2.13.0\"" in index
    bad = subprocess.run(["make", "-n", "study", "STACK=cuda"], cwd=ROOT, capture_output=True,
                         text=True, env=env)
    assert bad.returncode != 0 and "STACK must be cpu, nvidia or node" in bad.stderr
