"""Timing: CUDA events around eager loops or CUDA-graph replays; wall clock on CPU.

Method (see notebooks/02_microbench): warm up first (compiles and caches),
then take many samples and report the median with p20/p80. Each sample times a
batch of calls that rotate over several input sets whose total size is at
least twice the L2 cache, so small shapes are not timed from cache. In
``cudagraph`` mode the whole batch is captured once and replayed, which removes
Python and launch-queue overhead: what remains is the GPU's own time per call,
launch gaps between kernels included. The timer is named in every result.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# cudagraph_warm replays calls on one input set: L2-resident when it fits, the
# way many published kernel tables are measured. Shown beside, never instead of,
# the cold (rotated) cudagraph numbers.
MODES = ("eager", "cudagraph", "cudagraph_warm")


@dataclass(frozen=True)
class Timing:
    timer: str  # cuda_events_eager | cuda_events_cudagraph | wall_clock_cpu
    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    calls_per_sample: int


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median_p20_p80(values: Sequence[float]) -> tuple[float, float, float]:
    """The median and the 20th / 80th percentiles (linear interpolation)."""
    if not values:
        raise ValueError("no samples")
    return statistics.median(values), _quantile(values, 0.2), _quantile(values, 0.8)


def summarize(per_call_us: Sequence[float], timer: str, calls: int) -> Timing:
    if not per_call_us:
        raise ValueError("no timing samples")
    return Timing(timer, *median_p20_p80(per_call_us), len(per_call_us), calls)


def l2_cache_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 32 * 2**20  # a typical last-level cache; rotation is cheap on the CPU anyway
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)


def rotation_count(bytes_per_set: int, device: torch.device, *, max_sets: int = 512) -> int:
    """How many distinct input sets cover twice the L2 cache (at least 2)."""
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    return max(2, min(max_sets, math.ceil(2 * l2_cache_bytes(device) / bytes_per_set)))


def time_fn(
    fn: Callable,
    arg_sets: Sequence[tuple],
    *,
    mode: str = "eager",
    calls_per_sample: int | None = None,
    samples: int = 50,
    warmup: int = 3,
) -> Timing:
    """Time ``fn(*args)`` rotating over ``arg_sets``; per-call microseconds."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not arg_sets:
        raise ValueError("arg_sets is empty")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    calls = calls_per_sample or len(arg_sets)
    device = _device_of(arg_sets[0])
    if device.type != "cuda":
        if mode != "eager":
            raise ValueError(f"{mode} mode needs a GPU")
        return _time_wall_clock(fn, arg_sets, calls, samples, warmup)
    if mode == "eager":
        return _time_eager_cuda(fn, arg_sets, calls, samples, warmup)
    if mode == "cudagraph_warm":
        t = _time_cudagraph(fn, arg_sets[:1], calls, samples, warmup)
        return Timing("cuda_events_cudagraph_warm_l2", t.median_us, t.p20_us, t.p80_us,
                      t.samples, t.calls_per_sample)
    return _time_cudagraph(fn, arg_sets, calls, samples, warmup)


def _device_of(args: tuple) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def _run_batch(fn, arg_sets, calls):
    n = len(arg_sets)
    for i in range(calls):
        fn(*arg_sets[i % n])


def _time_wall_clock(fn, arg_sets, calls, samples, warmup) -> Timing:
    for _ in range(warmup):
        _run_batch(fn, arg_sets, calls)
    per_call = []
    for _ in range(samples):
        start = time.perf_counter()
        _run_batch(fn, arg_sets, calls)
        per_call.append((time.perf_counter() - start) * 1e6 / calls)
    return summarize(per_call, "wall_clock_cpu", calls)


def _time_eager_cuda(fn, arg_sets, calls, samples, warmup) -> Timing:
    for _ in range(warmup):
        _run_batch(fn, arg_sets, calls)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(samples)]
    for start, end in events:
        start.record()
        _run_batch(fn, arg_sets, calls)
        end.record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) * 1e3 / calls for s, e in events]
    return summarize(per_call, "cuda_events_eager", calls)


def _time_cudagraph(fn, arg_sets, calls, samples, warmup) -> Timing:
    # Warm up on a side stream (compiles, autotunes, allocates) before capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            _run_batch(fn, arg_sets, len(arg_sets))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run_batch(fn, arg_sets, calls)
    for _ in range(max(1, warmup)):
        graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(samples)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) * 1e3 / calls for s, e in events]
    del graph
    return summarize(per_call, "cuda_events_cudagraph", calls)


def copy_bandwidth_gbps(device, *, nbytes: int = 2**30, samples: int = 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second / 1e9:
    the practical ceiling for a memory-bound kernel on this device."""
    device = torch.device(device)
    if device.type != "cuda":
        nbytes = min(nbytes, 256 * 2**20)
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    timing = time_fn(lambda s, d: d.copy_(s), [(src, dst)], mode="eager",
                     calls_per_sample=1, samples=samples, warmup=3)
    return 2 * n * 4 / (timing.median_us * 1e-6) / 1e9


def peak_memory_mb(fn: Callable, args: tuple) -> float:
    """Device memory one call allocates beyond its inputs (its outputs and
    temporaries at their peak), in MB (1e6 bytes). NaN on the CPU."""
    device = _device_of(args)
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn(*args)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return peak / 1e6
