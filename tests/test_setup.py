"""The two install routes list the same packages; CI runs the README's command."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's
NOT_A_PACKAGE = {"python", "pip"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[;]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pip_packages() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    return {_name(s) for s in specs}


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
    assert conda_packages() == pip_packages()


def test_constraints_pin_only_declared_packages():
    pinned = {_name(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert pinned <= pip_packages(), pinned - pip_packages()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "set -euo pipefail" in ci and "make test" in ci
    assert "make test" in readme and "make study" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:", makefile, re.M) and re.search(r"^study:", makefile, re.M)
