"""papermill reads every notebook's parameters cell cleanly (issue 47 item 8): its
translator warned ``Unable to parse line 25 'llm_moe_ep = 8  # ... (MoE TP = ...)'`` on
every 04 run (it splits a cell at lines holding '=', and a second '=' in a comment
makes it give up on the line). Checked on the ``.py`` sources the ``.ipynb`` files are
synced from: every parameter is found, with its spec's default, and nothing is warned."""

import ast
import logging

import jupytext
import pytest
from papermill.translators import PythonTranslator

from rope_kernels.study.notebooks import NOTEBOOK_DIR
from rope_kernels.study.specs import NOTEBOOKS, SPECS


def parameters_cell(name: str):
    cells = [c for c in jupytext.read(str(NOTEBOOK_DIR / f"{name}.py")).cells
             if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{name}: {len(cells)} cells tagged parameters"
    return cells[0]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_papermill_infers_every_parameter_without_a_warning(name, caplog):
    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = PythonTranslator.inspect(parameters_cell(name))
    assert [r.getMessage() for r in caplog.records] == []
    assert {p.name: ast.literal_eval(p.default) for p in found} == SPECS[name].defaults


def test_the_check_sees_a_second_equals_sign_in_a_comment(caplog):
    """The check can fail: the line 04 had."""
    cell = parameters_cell("04_ttft")
    cell.source = cell.source.replace("(MoE TP: llm_tp", "(MoE TP = llm_tp")
    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = PythonTranslator.inspect(cell)
    assert any("Unable to parse line" in r.getMessage() for r in caplog.records)
    assert "llm_moe_ep" not in {p.name for p in found}
