"""The runner: parameters checked before anything runs; device detection (ROCm mocked)."""

import sys
from pathlib import Path

import pytest
import torch
import yaml

from rope_kernels import fused_launch_config
from rope_kernels.study import devices
from rope_kernels.__main__ import main
from rope_kernels.study.runner import (NOTEBOOKS, ParameterError, load_profile, notebook_parameters,
                                 parse_override, resolve_device, resolve_parameters,
                                 select_notebooks)

ROOT = Path(__file__).resolve().parent.parent
SPECS = {nb: notebook_parameters(ROOT / "notebooks" / f"{nb}.ipynb") for nb in NOTEBOOKS}


def test_every_notebook_has_its_parameters_cell_first():
    import nbformat

    for nb in NOTEBOOKS:
        cells = nbformat.read(str(ROOT / "notebooks" / f"{nb}.ipynb"), as_version=4).cells
        assert "parameters" in cells[0].metadata.get("tags", []), nb
        assert SPECS[nb], nb


@pytest.mark.parametrize("kind", ["cpu", "cuda", "rocm"])
def test_device_profiles_are_valid(kind):
    layer = load_profile(ROOT / "params" / f"{kind}.yaml")
    resolved = resolve_parameters(list(NOTEBOOKS), SPECS, [(kind, layer)], [])
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
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
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
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.version, "hip", "6.4.1", raising=False)
    monkeypatch.setattr(devices.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(devices.torch.cuda, "get_device_name", lambda i=0: "AMD Instinct MI300X")
    assert devices.device_kind() == "rocm"
    assert resolve_device("rocm") == "rocm" and resolve_device("auto") == "rocm"
    assert devices.device_slug(devices.device_name()) == "amd-instinct-mi300x"
    assert devices.torch_device("rocm") == torch.device("cuda")  # HIP devices answer to 'cuda'
    with pytest.raises(RuntimeError, match="rocm GPU"):
        resolve_device("cuda")


def test_cuda_is_not_mistaken_for_rocm(monkeypatch):
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.version, "hip", None, raising=False)
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
    from rope_kernels.study.wheelhouse import TOOLCHAIN, pip_download_command, platform_tags

    tags = platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    cmd = pip_download_command(tmp_path, "3.12", "manylinux_2_28_x86_64", TOOLCHAIN)
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in cmd
    assert {"papermill", "nbclient", "ipykernel", "nbconvert", "nbval"} <= set(cmd)
    assert "torch" not in cmd and "triton" not in cmd
    with pytest.raises(ValueError, match="--python"):
        pip_download_command(tmp_path, "python3", "manylinux_2_28_x86_64", TOOLCHAIN)
