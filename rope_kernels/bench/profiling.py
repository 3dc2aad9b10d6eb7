"""torch.profiler views: device kernels per call, device time per kernel, traces."""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rope_kernels.atomic_io import write_atomic


def _device_time_us(evt) -> float:
    for attr in ("device_time", "cuda_time"):
        value = getattr(evt, attr, None)
        if value is not None:
            return float(value)
    return 0.0


def _is_device_event(evt) -> bool:
    return str(getattr(evt, "device_type", "")).endswith(("CUDA", "PrivateUse1", "HIP"))


def device_kernels(prof, labels=("rope",)) -> pd.DataFrame:
    """One row per device operation (kernel, memcpy, memset) the profiler saw;
    the GPU-side ranges of ``record_function`` annotations are not operations."""
    rows = [{"kernel": e.name, "device_time_us": _device_time_us(e)}
            for e in prof.events()
            if _is_device_event(e) and e.name not in labels
            and not getattr(e, "is_user_annotation", False)]
    return pd.DataFrame(rows, columns=["kernel", "device_time_us"])


def profile_call(fn: Callable, args: tuple, *, warmup: int = 2, label: str = "rope",
                 trace_path: Path | None = None) -> pd.DataFrame:
    """Profile one call of ``fn(*args)`` on the GPU (after ``warmup`` calls).

    Returns the device operations it ran. With ``trace_path`` the Chrome trace
    is written there gzipped (``.json.gz``), atomically.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("profile_call needs a GPU: the profiler counts device kernels")
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(label):
            fn(*args)
        torch.cuda.synchronize()
    if trace_path is not None:
        save_trace(prof, Path(trace_path))
    return device_kernels(prof, labels=(label,))


def save_trace(prof, path: Path) -> Path:
    """Chrome trace, gzipped, replaced atomically."""
    path = Path(path)
    if not path.name.endswith(".json.gz"):
        raise ValueError(f"trace path must end with .json.gz, got {path.name}")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        packed = Path(tmp) / "trace.json.gz"
        with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        write_atomic(path, packed.read_bytes())
    return path


def kernel_summary(kernels: pd.DataFrame) -> pd.DataFrame:
    """Launches and device time per kernel name."""
    if kernels.empty:
        return pd.DataFrame(columns=["kernel", "launches", "device_time_us"])
    g = kernels.groupby("kernel", sort=False)["device_time_us"]
    return (pd.DataFrame({"launches": g.size(), "device_time_us": g.sum()})
            .reset_index().sort_values("device_time_us", ascending=False, ignore_index=True))
