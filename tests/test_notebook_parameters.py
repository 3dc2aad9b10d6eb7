"""Plain papermill gets the runner's parameter checks: each notebook's first code cell
judges its parameters with the rules and messages of ``run -p`` (issue 48)."""

import pytest

from rope_kernels.study.notebooks import NOTEBOOK_DIR, PAPERMILL_ORIGIN, code_cells
from rope_kernels.study.parameters import ParameterError, resolve_parameters
from rope_kernels.study.runner import NOTEBOOKS

pytest.importorskip("jupytext")


def _cells(stem):
    return code_cells(NOTEBOOK_DIR / f"{stem}.py")


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_the_first_code_cell_after_the_parameters_checks_them(stem):
    cells = _cells(stem)
    assert cells[0].lstrip().startswith("# Parameters") or "device" in cells[0] or "data_root" in cells[0]
    assert f'check_parameters("{stem}", globals()' in cells[1], stem


def _runner_message(stem, override):
    with pytest.raises(ParameterError) as exc:
        resolve_parameters([stem], None, [], [override], "cpu")
    origin = f"-p {override}: "
    assert str(exc.value).startswith(origin)
    return str(exc.value)[len(origin):]


@pytest.mark.parametrize("stem, name, value, override", [
    ("03_profile", "tokens", -5, "tokens=-5"),
    ("03_profile", "dtype", "float8", "dtype=float8"),
    ("06_summary", "data_root", 5, "data_root=5"),
])
def test_papermill_gets_the_runners_message(stem, name, value, override):
    """As papermill runs it: the parameters cell, the injected value, the first code cell."""
    namespace = {}
    cells = _cells(stem)
    exec(compile(cells[0], f"{stem}[parameters]", "exec"), namespace)
    namespace[name] = value  # papermill's injected-parameters cell
    with pytest.raises(ParameterError) as exc:
        exec(compile(cells[1], f"{stem}[1]", "exec"), namespace)
    assert str(exc.value) == f"{PAPERMILL_ORIGIN}: {_runner_message(stem, override)}"


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_the_defaults_pass(stem):
    """nbval runs every notebook with its defaults on a CPU: they must pass the check."""
    from rope_kernels.study.notebooks import check_parameters

    namespace = {}
    exec(compile(_cells(stem)[0], f"{stem}[parameters]", "exec"), namespace)
    check_parameters(stem, namespace, None if stem == "06_summary" else "cpu")  # no error


def test_only_the_selected_notebooks_values_are_judged():
    """--only 04 -p samples=abc: samples is declared by 02, 04 and 05; only 04 runs."""
    with pytest.raises(ParameterError) as exc:
        resolve_parameters(["04_ttft"], None, [], ["samples=abc"], "cpu")
    assert str(exc.value) == "-p samples=abc: 04_ttft.samples must be int, got str 'abc'"
    with pytest.raises(ParameterError, match="has a parameter 'sampels'"):  # a name no notebook has
        resolve_parameters(["04_ttft"], None, [], ["sampels=3"], "cpu")
