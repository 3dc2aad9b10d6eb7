"""Sizes with bounds (issue 47 item 4): ``samples=10**18`` ran without end, and shapes,
family tokens and token counts of terabytes passed validation and failed allocating. A
sample count over ``MAX_SAMPLES`` is a parameter error; a run whose estimated working set
is over the device's memory is refused with the estimate, before any notebook runs."""

from pathlib import Path

import pytest

from rope_kernels.study import bounds, runner
from rope_kernels.study.parameters import ParameterError, study_parameters
from rope_kernels.study.runner import resolve_parameters
from rope_kernels.study.specs import MAX_SAMPLES, NOTEBOOKS, SPECS

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30


@pytest.mark.parametrize("nb,name", [("02_microbench", "samples"), ("04_ttft", "samples"),
                                     ("05_qkv_gemm", "samples"), ("05_qkv_gemm", "rounds")])
@pytest.mark.parametrize("value", [10**18, MAX_SAMPLES + 1, 0])
def test_a_sample_count_over_the_maximum_is_refused(nb, name, value):
    with pytest.raises(ParameterError, match=f"{nb}.{name} must be from 1 to {MAX_SAMPLES}"):
        resolve_parameters([nb], SPECS, [], [f"{nb}.{name}={value}"], "cpu")
    assert resolve_parameters([nb], SPECS, [], [f"{nb}.{name}={MAX_SAMPLES}"], "cpu")[nb][name] \
        == MAX_SAMPLES


class _Ran(Exception):
    """What the fake notebook raises: the run got past its checks."""


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """run_study on a CPU with 64 GiB of memory in a scratch checkout; a notebook that
    starts raises ``_Ran``."""
    root = tmp_path / "root"
    root.mkdir()
    for folder in ("notebooks", "params"):
        (root / folder).symlink_to(ROOT / folder)

    def ran(*args, **kw):
        raise _Ran

    monkeypatch.setattr(runner, "execute_notebook", ran)
    monkeypatch.setattr(bounds, "device_memory_bytes", lambda kind: (64 * GiB, "this machine's RAM"))

    def run(only, *overrides):
        runner.run_study(device="cpu", only=[only], overrides=list(overrides), root=root,
                         log=lambda *a: None)
    return run, root


@pytest.mark.parametrize("only,override,what,need", [
    ("01", "shapes=[[100000000, 16, 72]]", r"shape \[100000000, 16, 72\] in float32", "3,686.4 GB"),
    ("02", "families=[{tokens: [16, 1000000000000], heads: [2], head_dim: [8]}]",
     "family tokens 1000000000000 x heads 2 x head_dim 8", "160,000.0 GB"),
    ("02", "sweep_shapes=[[1000000000, 16, 72]]", None, None),  # no sweep asked for: fits
    ("03", "tokens=1000000000", "tokens 1000000000 x heads 4 x head_dim 72", "2,880.0 GB"),
    ("04", "resolutions=[1024x1024]", None, None),  # 5476 tokens of the small encoder: fits
    ("04", "04_ttft.encoder=kimi_k25", None, None),
    ("05", "qkv_tokens=[37, 100000000]", "qkv_tokens 100000000", "921.6 GB"),
])
def test_what_cannot_fit_is_refused_before_anything_runs(fake_run, only, override, what, need):
    run, root = fake_run
    if what is None:
        with pytest.raises(_Ran):
            run(only, override)
        return
    with pytest.raises(ParameterError, match=rf"{what} needs at least {need} at once \(estimated "
                                             r"from the parameters\), more than the 68.7 GB of "
                                             "this machine's RAM"):
        run(only, override)
    assert not (root / "data").exists() and not (root / "reports").exists()


def test_04_counts_the_buckets_it_runs():
    """Buckets over max_tokens are skipped by the notebook, so they do not count."""
    big = {"encoder": "kimi_k25", "resolutions": ["1024x1024"], "image_counts": [1, 10000],
           "max_tokens": 10**9}
    need, what = bounds.working_set("04_ttft", big)
    assert "10000 images" in what and need > 64 * GiB
    need, what = bounds.working_set("04_ttft", {**big, "max_tokens": 100000})
    assert "1 images" in what and need < GiB


@pytest.mark.parametrize("kind,memory", [("cpu", 1 * GiB), ("cuda", 78 * GiB), ("rocm", 64 * GiB)])
def test_the_committed_profiles_fit(kind, memory):
    """The check cannot refuse the study's own runs: each profile fits the smallest device
    it is run on (an H100's 78 GiB, an MI250X die's 64 GiB, a 1 GiB CPU box)."""
    params = study_parameters(kind, root=ROOT, notebooks=list(NOTEBOOKS))
    assert bounds.memory_problems(params, memory, "x") == []
    assert bounds.memory_problems(params, 1 << 10, "x")  # and it can fail


def test_this_machines_memory_is_known():
    memory, where = bounds.device_memory_bytes("cpu")
    assert memory > 100 * (1 << 20) and where == "this machine's RAM"
