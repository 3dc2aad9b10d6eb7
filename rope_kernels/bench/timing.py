"""Timing: CUDA events around eager loops or CUDA-graph replays; wall clock on CPU.

Method (see notebooks/02_microbench): warm up first (compiles and caches),
then take many samples and report the median with p20/p80. Each sample times a
batch of calls. Cold (``eager``, ``cudagraph``): the calls rotate over input
sets whose bytes read (what one call reads, not whole buffers it views into)
cover at least twice the L2 cache, and every call of a batch keeps its output
alive until the batch ends, so each call writes memory of its own rather than
the block the previous call just freed. In ``cudagraph`` mode the whole batch is
captured once and replayed, which removes Python and launch-queue overhead:
what remains is the GPU's own time per call, launch gaps included. Several
functions compared with each other are timed in rounds (``time_rounds``), each
round in a seeded shuffled order that is returned with the timings. The timer
is named in every result.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rope_kernels.percentiles import median_p20_p80

# cudagraph_warm replays calls on one input set, every output on one address
# (L2-resident when it fits), the way many published kernel tables are
# measured. Shown beside, never instead of, the cold cudagraph numbers.
MODES = ("eager", "cudagraph", "cudagraph_warm")


@dataclass(frozen=True)
class Timing:
    timer: str  # cuda_events_eager | cuda_events_cudagraph | wall_clock_cpu
    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    calls_per_sample: int


def summarize(per_call_us: Sequence[float], timer: str, calls: int) -> Timing:
    if not per_call_us:
        raise ValueError("no timing samples")
    return Timing(timer, *median_p20_p80(per_call_us), len(per_call_us), calls)


def l2_cache_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 32 * 2**20  # a typical last-level cache; rotation is cheap on the CPU anyway
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)


def rotation_count(read_bytes: int, device: torch.device, *, max_sets: int = 512) -> int:
    """How many distinct input sets, each read ``read_bytes`` by one call, cover
    twice the L2 cache (at least 2). Count only what a call reads (for RoPE: q, k,
    cos, sin; not v, although q and k are views into the packed qkv)."""
    if isinstance(read_bytes, bool) or not isinstance(read_bytes, int) or read_bytes <= 0:
        raise ValueError(f"read_bytes must be a positive int, got {read_bytes!r}")
    return max(2, min(max_sets, math.ceil(2 * l2_cache_bytes(device) / read_bytes)))


def cold_set_count(read_bytes: int, device, *, cpu_sets: int = 2) -> int:
    """Input sets to rotate over in cold mode: ``rotation_count`` on a GPU;
    ``cpu_sets`` on the CPU, whose wall-clock timings only exercise the plumbing
    (and whose Triton kernels run in the slow interpreter)."""
    device = torch.device(device)
    if device.type == "cuda":
        return rotation_count(read_bytes, device)
    if isinstance(read_bytes, bool) or not isinstance(read_bytes, int) or read_bytes <= 0:
        raise ValueError(f"read_bytes must be a positive int, got {read_bytes!r}")
    return cpu_sets


def shuffled_orders(names: Sequence[str], rounds: int, seed: int | str) -> list[tuple[str, ...]]:
    """One order of ``names`` per round, shuffled by ``random.Random(seed)`` (a str
    seed is hashed deterministically, so the same seed gives the same orders in
    every process)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"names must be distinct, got {list(names)}")
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(tuple(order))
    return orders


def round_positions(orders: Sequence[Sequence[str]], name: str) -> str:
    """Where ``name`` ran in each round (0 = first), ';'-separated: the order as a
    result row records it."""
    return ";".join(str(list(order).index(name)) for order in orders)


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
    timer, per_call, calls = sample_fn(fn, arg_sets, mode=mode, calls_per_sample=calls_per_sample,
                                       samples=samples, warmup=warmup)
    return summarize(per_call, timer, calls)


def sample_fn(
    fn: Callable,
    arg_sets: Sequence[tuple],
    *,
    mode: str = "eager",
    calls_per_sample: int | None = None,
    samples: int = 50,
    warmup: int = 3,
) -> tuple[str, list[float], int]:
    """(timer, per-call microseconds of each sample, calls per sample): ``time_fn``
    before the summary, for pooling samples taken in several rounds."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not arg_sets:
        raise ValueError("arg_sets is empty")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    calls = calls_per_sample or len(arg_sets)
    device = _device_of(arg_sets[0])
    if device.type != "cuda":
        if mode != "eager":
            raise ValueError(f"{mode} mode needs a GPU")
        return "wall_clock_cpu", _time_wall_clock(fn, arg_sets, calls, samples, warmup), calls
    if mode == "eager":
        return "cuda_events_eager", _time_eager_cuda(fn, arg_sets, calls, samples, warmup), calls
    if mode == "cudagraph_warm":
        return ("cuda_events_cudagraph_warm_l2",
                _time_cudagraph(fn, arg_sets[:1], calls, samples, warmup, keep_outputs=False), calls)
    return "cuda_events_cudagraph", _time_cudagraph(fn, arg_sets, calls, samples, warmup), calls


@dataclass(frozen=True)
class RoundTimings:
    """Functions timed in rounds: each one's samples pooled over the rounds, and
    the order they ran in per round."""

    timings: dict[str, Timing]
    orders: list[tuple[str, ...]]
    seed: int | str

    def positions(self, name: str) -> str:
        return round_positions(self.orders, name)


def time_rounds(
    fns: dict[str, tuple[Callable, Sequence[tuple]]],
    *,
    mode: str,
    calls_per_sample: int,
    samples: int,
    rounds: int,
    seed: int | str = 0,
    warmup: int = 3,
    rewarm: int = 1,
) -> RoundTimings:
    """Time every ``name -> (fn, arg_sets)`` the same way, in ``rounds`` rounds;
    each round runs all of them, in a seeded shuffled order, for its share of
    ``samples`` (so drift and position in the run hit every function alike).
    A function warms up for ``warmup`` batches before its first round and
    ``rewarm`` before each later one (a graph is re-captured every round)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    rounds = min(rounds, samples)
    orders = shuffled_orders(list(fns), rounds, seed)
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    timers: dict[str, str] = {}
    for r, order in enumerate(orders):
        share = samples // rounds + (r < samples % rounds)
        for name in order:
            fn, arg_sets = fns[name]
            timers[name], got, _ = sample_fn(fn, arg_sets, mode=mode, calls_per_sample=calls_per_sample,
                                             samples=share, warmup=warmup if r == 0 else rewarm)
            per_call[name] += got
    timings = {name: summarize(per_call[name], timers[name], calls_per_sample) for name in fns}
    return RoundTimings(timings, orders, seed)


def _device_of(args) -> torch.device:
    """The device of the first tensor among ``args``, looking into tuples, lists
    and dicts (an argument set may bundle its tensors); CPU when there is none."""
    items = list(args.values()) if isinstance(args, dict) else list(args)
    for a in items:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (tuple, list, dict)):
            found = _device_of(a)
            if found.type != "cpu":
                return found
    return torch.device("cpu")


def _run_batch(fn, arg_sets, calls, *, keep_outputs: bool = True) -> list:
    """``calls`` calls rotating over ``arg_sets``. With ``keep_outputs`` every
    call's output stays alive until the caller drops the returned list: the
    caching allocator (and a CUDA graph's memory pool) would otherwise hand each
    call the block its predecessor just freed, and every call would write one
    L2-resident address."""
    n = len(arg_sets)
    if not keep_outputs:
        for i in range(calls):
            fn(*arg_sets[i % n])  # unbound: freed before the next call
        return []
    return [fn(*arg_sets[i % n]) for i in range(calls)]


def _time_wall_clock(fn, arg_sets, calls, samples, warmup) -> list[float]:
    for _ in range(warmup):
        _run_batch(fn, arg_sets, calls)
    per_call = []
    for _ in range(samples):
        start = time.perf_counter()
        outs = _run_batch(fn, arg_sets, calls)
        per_call.append((time.perf_counter() - start) * 1e6 / calls)
        del outs
    return per_call


def _time_eager_cuda(fn, arg_sets, calls, samples, warmup) -> list[float]:
    for _ in range(warmup):
        _run_batch(fn, arg_sets, calls)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(samples)]
    for start, end in events:
        start.record()
        outs = _run_batch(fn, arg_sets, calls)
        end.record()
        del outs  # freed after the batch: the next batch reuses blocks a whole batch later
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 / calls for s, e in events]


def _time_cudagraph(fn, arg_sets, calls, samples, warmup, *, keep_outputs: bool = True) -> list[float]:
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
        # Outputs kept alive through capture own distinct blocks of the graph's
        # pool, so each replayed call writes its own memory.
        outs = _run_batch(fn, arg_sets, calls, keep_outputs=keep_outputs)
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
    # A destroyed graph's pool is only handed back by empty_cache (or an
    # allocation that fails and retries, which a later timed batch must not meet).
    del outs, graph
    torch.cuda.empty_cache()
    return per_call


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


def host_time_us(fn: Callable, arg_sets: Sequence[tuple], *, calls: int = 200, repeats: int = 5,
                 warmup: int = 3) -> Timing:
    """Host time of one eager call: ``time.perf_counter`` around a Python loop of ``calls``
    calls (rotating over ``arg_sets``) that never waits for the device, per call, median
    and p20/p80 over ``repeats`` loops. The device drains between loops (untimed), so the
    launch queue starts empty and the loop measures what the host spends per call: checks,
    allocation, the launch itself; the GPU is not the bottleneck while a call's host time
    exceeds its kernel time, or ``calls`` launches fit the queue (CUDA keeps about 1024).
    On the CPU the calls run where they are issued, so the figure includes the work."""
    for name, v in (("calls", calls), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not arg_sets:
        raise ValueError("host_time_us needs at least one argument set")
    device = _device_of(arg_sets[0])

    def drain():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n = len(arg_sets)
    for i in range(warmup):
        fn(*arg_sets[i % n])
    per_call = []
    for _ in range(repeats):
        drain()
        start = time.perf_counter()
        for i in range(calls):
            fn(*arg_sets[i % n])
        per_call.append((time.perf_counter() - start) * 1e6 / calls)
    drain()
    return summarize(per_call, "host_perf_counter", calls)
