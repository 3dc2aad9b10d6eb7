"""The runner: parameters checked before anything runs; device detection (ROCm mocked)."""

import sys
from pathlib import Path

import pytest
import torch
import yaml

from rope_kernels import fused_launch_config
from rope_kernels.study import devices
from rope_kernels.__main__ import main
from rope_kernels.study.runner import (NOTEBOOKS, ParameterError, load_profile, parse_override,
                                       resolve_device, resolve_parameters, select_notebooks)
from rope_kernels.study.specs import SPECS

ROOT = Path(__file__).resolve().parent.parent


def test_every_notebook_has_its_parameters_cell_first():
    import nbformat

    for nb in NOTEBOOKS:
        cells = nbformat.read(str(ROOT / "notebooks" / f"{nb}.ipynb"), as_version=4).cells
        assert "parameters" in cells[0].metadata.get("tags", []), nb
        assert SPECS[nb], nb


@pytest.mark.parametrize("kind", ["cpu", "cuda", "rocm"])
def test_device_profiles_are_valid(kind):
    layer = load_profile(ROOT / "params" / f"{kind}.yaml")
    resolved = resolve_parameters(list(NOTEBOOKS), SPECS, [(kind, layer)], [], kind)
    assert set(resolved) == set(NOTEBOOKS)


def test_unknown_parameter_is_an_error_naming_it():
    with pytest.raises(ParameterError, match="sampels"):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], ["sampels=3"])
    with pytest.raises(ParameterError, match="03_profile has no parameter 'samples'"):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], ["03_profile.samples=3"])
    with pytest.raises(ParameterError, match="unknown notebook"):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], ["99_nope.samples=3"])


def test_wrong_type_is_an_error_naming_it():
    with pytest.raises(ParameterError, match=r"02_microbench.samples must be int, got str"):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], ["02_microbench.samples=many"])
    with pytest.raises(ParameterError, match="config_sweep must be bool"):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], ["config_sweep=3"])
    with pytest.raises(ParameterError, match="modes must be list"):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], ["modes=eager"])


def test_runner_owned_parameters_cannot_be_set():
    with pytest.raises(ParameterError, match="set by the runner"):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], ["data_dir=/tmp/x"])


def test_overrides_apply_to_every_notebook_that_declares_them():
    r = resolve_parameters(list(NOTEBOOKS), SPECS, [], ["samples=7", "04_ttft.modes=[eager]"])
    assert r["02_microbench"]["samples"] == 7 and r["04_ttft"]["samples"] == 7
    assert r["04_ttft"]["modes"] == ["eager"] and "modes" not in r["01_kernels"]
    assert parse_override("02_microbench.families=[{tokens: [8], heads: [1], head_dim: 8}]")[2] == \
        [{"tokens": [8], "heads": [1], "head_dim": 8}]


def test_bad_cli_input_exits_nonzero_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = sorted(p for p in (ROOT / "reports").rglob("*")) if (ROOT / "reports").exists() else []
    assert main(["run", "--device", "cpu", "-p", "sampels=3"]) == 2
    assert "sampels" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"02_microbench": {"samples": "three"}}))
    assert main(["run", "--device", "cpu", "--params", str(bad)]) == 2
    assert "02_microbench.samples must be int" in capsys.readouterr().err
    assert main(["run", "--device", "cpu", "--only", "07"]) == 2
    after = sorted(p for p in (ROOT / "reports").rglob("*")) if (ROOT / "reports").exists() else []
    assert before == after


def test_missing_gpu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="--device cuda was asked for, but this machine has no GPU"):
        resolve_device("cuda")
    assert main(["run", "--device", "rocm"]) == 2
    assert "no GPU" in capsys.readouterr().err


def test_select_notebooks():
    assert select_notebooks(["02"]) == ["02_microbench"]
    assert select_notebooks(["notebooks/04_ttft.ipynb", "01_kernels"]) == ["01_kernels", "04_ttft"]
    with pytest.raises(ParameterError, match="matches"):
        select_notebooks(["0"])


def test_rocm_is_detected_through_torch_version_hip(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.4.1", raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "AMD Instinct MI300X")
    assert devices.device_kind() == "rocm"
    assert resolve_device("rocm") == "rocm" and resolve_device("auto") == "rocm"
    assert devices.device_slug(devices.device_name()) == "amd-instinct-mi300x"
    assert devices.torch_device("rocm") == torch.device("cuda")  # HIP devices answer to 'cuda'
    with pytest.raises(RuntimeError, match="rocm GPU"):
        resolve_device("cuda")


def test_cuda_is_not_mistaken_for_rocm(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert devices.device_kind() == "cuda"


def test_launch_settings_fit_64_wide_wavefronts():
    """AMD runs 64 threads per warp: num_warps * 64 must stay within 1024 threads."""
    for heads in (1, 2, 3, 4, 6, 12, 16):
        for head_dim in (8, 72, 80, 128, 256):
            for size in (2, 4):
                cfg = fused_launch_config(heads, head_dim, size)
                assert cfg.num_warps * 64 <= 1024


def test_device_slug():
    assert devices.device_slug("NVIDIA H200") == "nvidia-h200"
    assert devices.device_slug("NVIDIA GeForce RTX 4090 (24GB)") == "nvidia-geforce-rtx-4090-24gb"
    with pytest.raises(ValueError):
        devices.device_slug("  ")


def test_rocm_path_has_no_cuda_only_calls():
    """The library's device code goes through torch.cuda (HIP-backed on ROCm) and
    Triton; nothing calls NVIDIA-only APIs (pynvml, cupy, nvcc, cuDNN flags) on it."""
    src = "\n".join(p.read_text() for p in (ROOT / "rope_kernels").rglob("*.py"))
    for needle in ("pynvml", "cupy", "nvidia-smi", "torch.backends.cudnn", "nvcc"):
        assert needle not in src, needle


def test_python_m_entry_point():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "rope_kernels", "--help"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0 and "wheelhouse" in out.stdout and "run" in out.stdout


def test_wheelhouse_command_expands_manylinux_tags(tmp_path):
    from rope_kernels.infra.wheelhouse import TOOLCHAIN, pip_download_command, platform_tags

    tags = platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    cmd = pip_download_command(tmp_path, "3.12", "manylinux_2_28_x86_64", TOOLCHAIN)
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in cmd
    assert {"papermill", "nbclient", "ipykernel", "nbconvert", "nbval"} <= set(cmd)
    assert "torch" not in cmd and "triton" not in cmd
    with pytest.raises(ValueError, match="--python"):
        pip_download_command(tmp_path, "python3", "manylinux_2_28_x86_64", TOOLCHAIN)
    # pure-Python pins (FlashInfer's wheel) are fetched with the platform tag "any"
    cmd = pip_download_command(tmp_path, "3.12", "any", ["flashinfer-python==0.7.4"], no_deps=True)
    assert cmd.count("--platform") == 1 and cmd[cmd.index("--platform") + 1] == "any"


# Values are checked before anything runs, with the typo check's exit code and one line --

@pytest.mark.parametrize("override, match", [
    ("samples=0", "02_microbench.samples must be from 1 to 1000 .*, got 0"),
    ("02_microbench.modes=[]", "modes must not be empty"),
    ("dtypes=[]", "01_kernels.dtypes must not be empty"),
    ("families=[]", "families must not be empty"),
    ("image_counts=[]", "image_counts must not be empty"),
    ("shapes=[]", "shapes must not be empty"),
    ("04_ttft.resolutions=[]", "resolutions must not be empty"),
    ("03_profile.layers=-1", "03_profile.layers must be >= 1, got -1"),
    ("04_ttft.layers=-1", "04_ttft.layers must be >= 0"),
    ("03_profile.head_dim=7", "positive even"),
    ("shapes=[[4, 2, 9]]", "positive even"),
    ("shapes=[[0, 2, 8]]", "tokens and heads must be >= 1"),
    ("families=[{tokens: [8], heads: [0], head_dim: 8}]", "heads must hold ints >= 1"),
    ("families=[{tokens: [8], heads: [2]}]", "each family must be"),
    ("02_microbench.modes=[graph]", "unknown mode 'graph'"),
    ("04_ttft.modes=[cudagraph_warm]", "unknown mode 'cudagraph_warm'"),
    ("dtypes=[float64]", "unknown dtype 'float64'"),
    ("03_profile.dtype=int8", "must be one of float32"),
    ("04_ttft.resolutions=['100']", "1024x1024"),
    ("image_counts=[0]", "must hold ints >= 1"),
    ("encoder=huge", "must be one of small, kimi_k25"),
    ("attention=flash3", "must be one of auto"),
    ("prefill_tokens_per_s=-1.0", "tokens_per_s must be >= 0"),
    ("04_ttft.llm_mfu=[0.5, 0.3, 0.6]", "low <= central <= high"),
    ("04_ttft.llm_mfu=[0.3, 0.6]", "three numbers"),
    ("04_ttft.llm_gpus=0", "gpus must be a positive int"),
    ("04_ttft.llm_peak_tflops=-1.0", "peak_tflops must be a positive number"),
    ("04_ttft.llm_active_params_b=0.0", "active_params must be a positive number"),
    ("04_ttft.text_tokens=-3", "token counts must be >= 0"),
])
def test_bad_values_are_refused_before_anything_runs(override, match):
    with pytest.raises(ParameterError, match=match):
        resolve_parameters(list(NOTEBOOKS), SPECS, [], [override], "cuda")


def test_gpu_only_modes_are_refused_on_a_cpu():
    with pytest.raises(ParameterError, match="cudagraph needs a GPU"):
        resolve_parameters(["02_microbench"], SPECS, [], ["02_microbench.modes=[cudagraph]"], "cpu")
    with pytest.raises(ParameterError, match="cudagraph needs a GPU"):
        resolve_parameters(["04_ttft"], SPECS, [], ["modes=[eager, cudagraph]"], "cpu")
    ok = resolve_parameters(["02_microbench"], SPECS, [], ["modes=[cudagraph]"], "cuda")
    assert ok["02_microbench"]["modes"] == ["cudagraph"]


def test_a_later_layer_replaces_a_bad_value():
    layer = {"02_microbench": {"modes": ["cudagraph"]}}
    r = resolve_parameters(["02_microbench"], SPECS, [("gpu.yaml", layer)], ["modes=[eager]"], "cpu")
    assert r["02_microbench"]["modes"] == ["eager"]


def _one_error_line(capsys):
    err = capsys.readouterr().err
    assert err.startswith("rope-study: error: ") and "Traceback" not in err, err
    return err


def test_readme_cudagraph_example_on_a_cpu_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = _tree_snapshot()
    assert main(["run", "--only", "02", "-p", "samples=50",
                 "-p", "02_microbench.modes=[cudagraph]"]) == 2
    err = _one_error_line(capsys)
    assert err.count("\n") == 1 and "cudagraph needs a GPU" in err
    assert main(["run", "--device", "cpu", "-p", "02_microbench.samples=0"]) == 2
    assert _one_error_line(capsys).count("\n") == 1
    assert _tree_snapshot() == before


def _tree_snapshot():
    return sorted((p, p.stat().st_mtime_ns) for d in ("reports", "data")
                  for p in (ROOT / d).rglob("*") if p.is_file())


@pytest.mark.parametrize("content, match", [
    (b"02_microbench: {samples: 3\n", "not valid YAML"),
    (b"02_microbench:\n\tsamples: 3\n", "not valid YAML.*\\\\t"),
    (b"\xff\xfe02_microbench: {}\n", "not UTF-8"),
    (b"common: !!python/object/apply:os.system [echo hi]\n", "not valid YAML.*python"),
    (b"[1, 2]\n", "expected a mapping"),
    (None, "is not a file"),
])
def test_params_file_errors_are_one_line(tmp_path, capsys, content, match):
    path = tmp_path / "p.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["run", "--device", "cpu", "--params", str(path)]) == 2
    err = _one_error_line(capsys)
    assert err.count("\n") == 1, err
    import re
    assert re.search(match, err), err


def test_refresh_notebooks_with_an_unknown_name_is_an_error(capsys):
    assert main(["refresh-notebooks", "--only", "07_typo"]) == 2
    assert "07_typo" in _one_error_line(capsys)


def test_help_lists_notebooks_parameters_defaults_and_outputs(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "``" not in top and "run --help" in top
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for nb in NOTEBOOKS:
        assert nb in text
    assert "samples = 3" in text and "modes = ['eager']" in text
    assert "data/<device>/" in text and "reports/<device>/" in text and "--verbose" in text


# Terminal output: one line per notebook, a live progress bar on a terminal -------------

class FakeTerminal:
    def __init__(self, tty):
        self.text, self.tty = "", tty

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_line_shows_only_the_latest_bar_on_a_terminal():
    from rope_kernels.study.runner import ProgressLine

    term = FakeTerminal(tty=True)
    with ProgressLine("[2/5] 02_microbench", stream=term) as line:
        line.write("\rmicrobench:  50%|#####     | 2/4 [00:01<00:01]")
        line.write("/tmp/x.py:3: UserWarning: something noisy\n")
        line.write("STAGE:2026-01-01 profiler noise\n")
        line.write("\rmicrobench: 100%|##########| 4/4 [00:02<00:00]")
    assert "UserWarning" not in term.text and "profiler" not in term.text
    frames = term.text.split("\r")
    assert any(f.endswith("[2/5] 02_microbench  microbench:  50%|#####     | 2/4 [00:01<00:01]")
               for f in frames)
    assert "100%" in term.text and "\n" not in term.text  # redrawn in place


def test_progress_line_to_a_file_prints_one_line_and_verbose_everything():
    from rope_kernels.study.runner import ProgressLine

    log = FakeTerminal(tty=False)
    with ProgressLine("[1/5] 01_kernels", stream=log) as line:
        line.write("\rmicrobench:  50%|#####     | 2/4")
        line.write("warning\n")
    assert log.text == "[1/5] 01_kernels ...\n"
    log = FakeTerminal(tty=True)
    with ProgressLine("[1/5] 01_kernels", stream=log, verbose=True) as line:
        line.write("cell output\n")
    assert "cell output" in log.text


def test_execute_notebook_keeps_cell_logs_off_the_terminal(tmp_path, monkeypatch):
    import papermill

    from rope_kernels.study import runner

    seen = {}

    def fake_execute(src, out, **kw):
        seen.update(kw)
        Path(out).write_text("{}")

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    runner.execute_notebook(tmp_path / "a.ipynb", tmp_path / "r" / "a.ipynb", {}, cwd=tmp_path)
    assert seen["log_output"] is False and seen["progress_bar"] is False
    assert "kernel_manager_class" in seen  # the kernel's own stderr is dropped
    seen.clear()
    runner.execute_notebook(tmp_path / "a.ipynb", tmp_path / "r" / "a.ipynb", {}, cwd=tmp_path,
                            verbose=True)
    assert "kernel_manager_class" not in seen
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["a.ipynb"]


def test_batch_runs_need_no_registered_kernelspec(tmp_path, monkeypatch):
    """The notebooks name the study's JupyterLab kernel; a batch run on a node
    without that registration (the H200 failed with NoSuchKernel) runs them with
    this interpreter's kernel, "python3", unless a kernel is asked for."""
    import papermill

    from rope_kernels.study.runner import execute_notebook

    seen = []

    def fake_execute(src, out, **kw):
        seen.append(kw["kernel_name"])
        Path(out).write_text(Path(src).read_text())

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    src = ROOT / "notebooks" / "06_summary.ipynb"
    execute_notebook(src, tmp_path / "a.ipynb", {}, cwd=tmp_path)
    execute_notebook(src, tmp_path / "b.ipynb", {}, cwd=tmp_path, kernel_name="rope-study")
    assert seen == ["python3", "rope-study"]


def test_a_failed_cell_stops_the_run_with_one_line_naming_it(tmp_path, monkeypatch):
    """papermill's own exception class (not a class-name string) becomes NotebookError;
    anything else a notebook run raises propagates as itself."""
    from papermill.exceptions import PapermillExecutionError

    from rope_kernels.study import runner

    root = tmp_path / "root"
    root.mkdir()
    for name in ("notebooks", "params"):
        (root / name).symlink_to(ROOT / name)
    failure = PapermillExecutionError(cell_index=3, exec_count=3, source="x", ename="ValueError",
                                      evalue="first\nbad shape", traceback=[])

    def failing(src, dest, params, **kw):
        raise failure

    monkeypatch.setattr(runner, "execute_notebook", failing)
    with pytest.raises(runner.NotebookError, match=r"^01_kernels failed: ValueError: bad shape "):
        runner.run_study(device="cpu", only=["01"], root=root, log=lambda *a: None)
    failure = KeyError("not a cell")
    with pytest.raises(KeyError):
        runner.run_study(device="cpu", only=["01"], root=root, log=lambda *a: None)


def test_a_successful_run_removes_an_earlier_failures_notebook(tmp_path, monkeypatch):
    """Issue 47 item 6: a stale 04_ttft.failed.ipynb stayed beside the new report; a
    failing run still leaves its own, and never touches the last good report."""
    import papermill

    from rope_kernels.study.runner import execute_notebook

    outcome = {"fail": True}

    def fake_execute(src, out, **kw):
        Path(out).write_text('{"ran": true}')
        if outcome["fail"]:
            raise RuntimeError("a cell raised")

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    report = tmp_path / "r" / "04_ttft.ipynb"
    failed = tmp_path / "r" / "04_ttft.failed.ipynb"
    with pytest.raises(RuntimeError):
        execute_notebook(tmp_path / "a.ipynb", report, {}, cwd=tmp_path)
    assert failed.exists() and not report.exists()
    outcome["fail"] = False
    execute_notebook(tmp_path / "a.ipynb", report, {}, cwd=tmp_path)
    assert report.exists() and not failed.exists()
    assert sorted(p.name for p in report.parent.iterdir()) == ["04_ttft.ipynb"]
    outcome["fail"] = True
    with pytest.raises(RuntimeError):
        execute_notebook(tmp_path / "a.ipynb", report, {}, cwd=tmp_path)
    assert failed.exists() and report.read_text() == '{"ran": true}'


def test_one_device_rule_for_the_runner_and_the_notebooks(monkeypatch):
    """The runner and notebook_setup use the one resolve_device: on a ROCm box 'cuda' is
    refused by both (notebook_setup took it before and returned a 'cuda' kind), and
    notebook_setup returns the torch device of the kind."""
    from rope_kernels.study import notebooks, runner

    assert runner.resolve_device is devices.resolve_device is notebooks.resolve_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.4.1", raising=False)
    monkeypatch.setattr(notebooks, "report_display", lambda: None)
    with pytest.raises(RuntimeError, match="device cuda was asked for, but this machine has a rocm GPU"):
        notebooks.notebook_setup("cuda")
    assert notebooks.notebook_setup("auto") == ("rocm", torch.device("cuda"))
    assert notebooks.notebook_setup("cpu") == ("cpu", torch.device("cpu"))
    with pytest.raises(ParameterError, match="device must be auto, cpu, cuda or rocm"):
        notebooks.notebook_setup("tpu")
