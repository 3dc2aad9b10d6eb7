"""A run that times one variant (issue 47 item 2): 04 with ``variants=[native]`` failed at
the end ("No objects to concatenate"), ``[fused]`` with ``KeyError: 'native'``, after
writing its rows. Now each gives its latency curve and TTFT rows, and says that there is
no saving over native to show.

The notebook's code cells run here in this process (its ``.py``, as jupytext reads it),
the parameters cell followed by the test's values: the smallest encoder (one layer), one
bucket, one round, the hand prefill model."""

import matplotlib
import pandas as pd
import pytest

from rope_kernels.study.notebooks import NOTEBOOK_DIR, code_cells
from rope_kernels.study.specs import ENCODER_LATENCY_CSV, TIME_TO_FIRST_TOKEN_CSV

pytestmark = pytest.mark.slow  # about 20 s each on a shared CPU


def run_cells(name: str, values: dict, monkeypatch) -> tuple[str, dict]:
    """Every code cell of ``notebooks/<name>.py`` in order, ``values`` assigned right after
    the parameters cell (as papermill injects them); returns what the cells printed and
    the notebook's variables."""
    import contextlib
    import io

    from IPython.display import display

    matplotlib.use("Agg")
    monkeypatch.chdir(NOTEBOOK_DIR)
    namespace = {"display": display, "__name__": "__main__"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for i, source in enumerate(code_cells(NOTEBOOK_DIR / f"{name}.py")):
            exec(compile(source, f"{name} cell {i}", "exec"), namespace)
            if i == 0:
                namespace.update(values)
    import matplotlib.pyplot as plt

    plt.close("all")
    return printed.getvalue(), namespace


@pytest.mark.parametrize("variant", ["native", "fused"])
def test_04_runs_with_a_single_variant(variant, tmp_path, monkeypatch):
    printed, _ = run_cells("04_ttft", {
        "variants": [variant], "resolutions": ["56x56"], "image_counts": [1], "samples": 1,
        "layers": 1, "prefill": "hand", "progress": False, "data_dir": str(tmp_path)},
        monkeypatch)
    assert f"no saving over native to show: this run timed {variant}" in printed
    latency = pd.read_csv(tmp_path / ENCODER_LATENCY_CSV)
    ttft = pd.read_csv(tmp_path / TIME_TO_FIRST_TOKEN_CSV)
    assert set(latency.variant) == {variant} == set(ttft.variant)
    assert (latency.median_ms > 0).all() and (ttft.ttft_ms > latency.median_ms.min()).all()


@pytest.mark.parametrize("variant", ["native", "fused"])
@pytest.mark.parametrize("name,values", [
    ("02_microbench", {"families": [{"tokens": [4], "heads": [1], "head_dim": [8]}],
                       "dtypes": ["float32"], "samples": 1, "progress": False}),
    ("03_profile", {"tokens": 4, "heads": 1, "head_dim": 8, "layers": 1}),
])
def test_02_and_03_run_with_a_single_variant(name, values, variant, monkeypatch):
    """The other notebooks' variants lists, checked the same way (these already worked; 01's
    own kernel cell needs a real kernel's source lookup, so 01 is run by nbval only)."""
    _, notebook = run_cells(name, {**values, "variants": [variant]}, monkeypatch)
    assert notebook["names"] == [variant]
