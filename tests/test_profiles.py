"""The device profiles: the CUDA and ROCm ones time the same Kimi shapes, and a variant
a profile names that cannot load on the machine is skipped with its reason (in the
run's output and in the report) while one the user names is refused before anything
runs."""

from pathlib import Path

import pytest

from rope_kernels import variants
from rope_kernels.study import runner
from rope_kernels.study.parameters import (ParameterError, check_variants_run_here, load_profile,
                                           resolve_parameters, without_skipped)

ROOT = Path(__file__).resolve().parent.parent
# Kimi-K2.5's vision tokens: one 448x448 image, then 1, 4, 8 and 16 images of 1024x1024
KIMI_TOKENS = [1024, 5476, 21904, 43808, 87616]
KIMI_HEADS = [2, 4, 16]  # 16 heads at TP 1, 4 at TP 4, 2 at TP 8


def _kimi_family(kind: str) -> dict:
    families = load_profile(ROOT / "params" / f"{kind}.yaml")["02_microbench"]["families"]
    # the hand-written Kimi family (the towers' families, {tower: ...}, name no head_dim)
    (family,) = [f for f in families if f.get("head_dim") == 72]
    return family


@pytest.mark.parametrize("kind", ["cuda", "rocm"])
def test_gpu_profiles_time_kimis_token_counts(kind):
    family = _kimi_family(kind)
    assert family["tokens"] == KIMI_TOKENS
    assert sorted(family["heads"]) == KIMI_HEADS
    sweep = load_profile(ROOT / "params" / f"{kind}.yaml")["02_microbench"]["sweep_shapes"]
    assert all(t in KIMI_TOKENS for t, h, d in sweep if d == 72), sweep


def test_cuda_and_rocm_profiles_share_their_shapes():
    cuda, rocm = (load_profile(ROOT / "params" / f"{k}.yaml")["02_microbench"] for k in ("cuda", "rocm"))
    assert cuda["families"] == rocm["families"]
    assert cuda["sweep_shapes"] == rocm["sweep_shapes"]


@pytest.fixture
def absent_here(monkeypatch):
    """Which variants cannot load is made up here, so the test reads the same on a
    CPU machine and on a GPU node with every peer."""
    gone = {"sglang_kimi_k25": "tvm_ffi is not installed (pip install apache-tvm-ffi)",
            "gemm_epilogue_cute": "nvidia-cutlass-dsl is not installed"}
    monkeypatch.setattr(variants, "absent_reason", lambda name: gone.get(name, ""))
    monkeypatch.setattr(variants, "encoder_only_absent",
                        lambda: {k: v for k, v in gone.items() if k == "gemm_epilogue_cute"})
    return gone


PROFILE = {"04_ttft": {"variants": ["native", "fused", "sglang_kimi_k25", "gemm_epilogue_cute",
                                    "none"]}}


def test_profile_variants_that_cannot_load_are_skipped_with_their_reason(absent_here):
    origins = {}
    params = resolve_parameters(["04_ttft"], None, [("params/cuda.yaml", PROFILE)], [], "cuda",
                                origins=origins)
    assert origins[("04_ttft", "variants")] == "params/cuda.yaml"
    skipped = check_variants_run_here(params, from_profile={("04_ttft", "variants")})
    assert skipped == {"04_ttft": absent_here}
    assert without_skipped(params, skipped)["04_ttft"]["variants"] == ["native", "fused", "none"]
    # without the profile's leniency the same value is refused, both names with their reasons
    with pytest.raises(ParameterError, match="2 variants do not run here") as err:
        check_variants_run_here(params)
    assert all(f"{v} does not run here: {why}" in str(err.value) for v, why in absent_here.items())


def test_a_variant_the_user_names_is_still_refused(absent_here):
    origins = {}
    params = resolve_parameters(["04_ttft"], None, [("params/cuda.yaml", PROFILE)],
                                ["04_ttft.variants=[native, sglang_kimi_k25]"], "cuda",
                                origins=origins)
    from_profile = {k for k, o in origins.items() if o == "params/cuda.yaml"}
    assert ("04_ttft", "variants") not in from_profile
    with pytest.raises(ParameterError, match="sglang_kimi_k25 does not run here: tvm_ffi"):
        check_variants_run_here(params, from_profile=from_profile)


def test_a_profile_list_left_empty_is_an_error(absent_here):
    params = {"02_microbench": {"variants": ["sglang_kimi_k25"]}}
    skipped = check_variants_run_here(params, from_profile={("02_microbench", "variants")})
    # an empty list would mean "every variant" to notebook 02: not what the profile said
    with pytest.raises(ParameterError, match="none of the profile's variants runs here"):
        without_skipped(params, skipped)


def _fake_root(tmp_path: Path, profile: str) -> Path:
    root = tmp_path / "root"
    (root / "params").mkdir(parents=True)
    (root / "notebooks").symlink_to(ROOT / "notebooks")
    (root / "params" / "cpu.yaml").write_text(profile)
    return root


def _fake_execute(calls):
    """The runner's execute_notebook with papermill replaced: the notebook is copied
    unexecuted (the note is added by the real code path)."""
    import papermill

    from rope_kernels.study import execution

    def fake_papermill(src, out, parameters, **kw):
        calls.append(parameters)
        Path(out).write_text(Path(src).read_text())

    def execute(src, dest, params, **kw):
        real = papermill.execute_notebook
        papermill.execute_notebook = fake_papermill
        try:
            return execution.execute_notebook(src, dest, params, **kw)
        finally:
            papermill.execute_notebook = real
    return execute


def test_run_skips_profile_variants_and_says_so_in_output_and_report(tmp_path, monkeypatch,
                                                                       absent_here):
    root = _fake_root(tmp_path, "04_ttft:\n  variants: [native, sglang_kimi_k25, "
                                "gemm_epilogue_cute, none]\n")
    calls, lines = [], []
    monkeypatch.setattr(runner, "execute_notebook", _fake_execute(calls))
    import rope_kernels.study.reports as reports

    monkeypatch.setattr(reports, "build_index", lambda root: Path(root) / "reports" / "index.html")
    written = runner.run_study(device="cpu", only=["04"], root=root, log=lines.append)
    assert calls[0]["variants"] == ["native", "none"]
    for variant, why in absent_here.items():
        said = [line for line in lines if variant in line]
        # once before the notebooks run, once at the end, with the reason each time
        assert len(said) == 2 and all(why in line and "params/cpu.yaml" in line for line in said)
    page = written[0].read_text()
    assert "Skipped by this run" in page
    assert all(why in page for why in absent_here.values())


def test_run_refuses_a_named_variant_before_anything_runs(tmp_path, monkeypatch, absent_here):
    root = _fake_root(tmp_path, "04_ttft:\n  variants: [native, none]\n")
    calls = []
    monkeypatch.setattr(runner, "execute_notebook", _fake_execute(calls))
    with pytest.raises(ParameterError, match="sglang_kimi_k25 does not run here"):
        runner.run_study(device="cpu", only=["04"], root=root, log=lambda *a: None,
                         overrides=["04_ttft.variants=[native, sglang_kimi_k25]"])
    assert calls == [] and not (root / "reports").exists()
