"""Whether an optional package is here: one place for the kernels' "does it import" and
"which version is installed" questions (CuTe DSL, FlyDSL), torch-free."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version


def imports(*modules: str) -> bool:
    """Whether every one of ``modules`` imports here (any import failure: not here)."""
    try:
        for module in modules:
            importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


def installed_version(distribution: str) -> str:
    """The installed ``distribution``'s version, "" where it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return ""
