"""Notebooks are jupytext pairs: the percent-format .py is the code, the .ipynb holds outputs."""

import shutil
from pathlib import Path

import nbformat
import pytest

from rope_kernels.study.notebooks import notebook_paths, sync_notebooks, unsynced_pairs
from rope_kernels.study.runner import NOTEBOOKS

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("jupytext")


def test_every_notebook_has_its_percent_script():
    assert [p.stem for p in notebook_paths()] == list(NOTEBOOKS)
    for path in notebook_paths():
        script = path.with_suffix(".py").read_text()
        assert "formats: ipynb,py:percent" in script, path.name
        assert '# %% tags=["parameters"]' in script, path.name


def test_py_and_ipynb_hold_the_same_code():
    assert unsynced_pairs() == []


def test_editing_one_side_only_is_caught(tmp_path):
    for suffix in (".ipynb", ".py"):
        shutil.copy(ROOT / "notebooks" / f"06_summary{suffix}", tmp_path)
    pair = tmp_path / "06_summary.ipynb"
    assert unsynced_pairs([pair]) == []
    script = pair.with_suffix(".py")
    script.write_text(script.read_text().replace('data_root = "../data"', 'data_root = "data"'))
    assert unsynced_pairs([pair]) == ["06_summary.ipynb and 06_summary.py differ: run jupytext --sync"]
    sync_notebooks([pair])  # the edited (newer) .py wins and updates the .ipynb
    assert unsynced_pairs([pair]) == []
    assert 'data_root = "data"' in nbformat.read(str(pair), as_version=4).cells[0].source
    script.unlink()
    assert unsynced_pairs([pair]) == ["06_summary.ipynb: no paired 06_summary.py"]


def test_notebooks_use_the_study_kernel():
    for path in notebook_paths():
        meta = nbformat.read(str(path), as_version=4).metadata
        assert meta.kernelspec.name == "rope-study", path.name
        assert meta.kernelspec.display_name == "Python (rope-study)", path.name
        assert meta.jupytext.formats == "ipynb,py:percent", path.name
