"""Vision-encoder latency per RoPE variant, for a bucket of equal-size images.

All variants of a bucket are timed in rounds (one forward of each per round,
in a seeded shuffled order recorded with the rows), so slow drift of clocks or
temperature and the position in a round hit them alike; the floor is the same
encoder with RoPE skipped ("none"). In ``cudagraph`` mode the whole encoder
forward is captured once per (variant, bucket) and replayed. Columns measured
on one profiled forward, not the timed rounds, carry a ``profiled_`` prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
import copy
from dataclasses import dataclass, replace
from math import nan

import torch
from torch.profiler import ProfilerActivity, profile

from rope_kernels.kernels.freqs import grid_tokens, image_patch_grid, parse_resolution
from rope_kernels.vocabulary import resolution_text
from rope_kernels.roofline import minimal_bytes, rope_minimal_ms  # noqa: F401
from rope_kernels.bench.timing import (median_p20_p80, round_positions, shuffled_orders,
                                       summarize)
from rope_kernels.model.vit import EncoderInputs, MoonViTEncoder, encoder_inputs
from rope_kernels.variants import VARIANTS, peer_columns, rope_triton_kernels
from rope_kernels.vocabulary import ROPE_FREE_FLOORS


@dataclass(frozen=True)
class Bucket:
    resolution: str
    images: int
    grids: tuple

    @property
    def vit_tokens(self) -> int:
        return grid_tokens(self.grids)

    @property
    def llm_tokens(self) -> int:
        return self.vit_tokens // 4


def make_bucket(resolution: str, images: int, *, merge: int = 2, tower: str = "") -> Bucket:
    """``images`` images of ``resolution``, by Kimi's image rule or by ``tower``'s
    (``towers.py``: e.g. Qwen's smart_resize with 16-pixel patches for qwen3_vl)."""
    if isinstance(images, bool) or not isinstance(images, int) or images < 1:
        raise ValueError(f"image count must be a positive int, got {images!r}")
    w, h = parse_resolution(resolution)
    if tower:
        from rope_kernels.towers import get_tower

        grid = get_tower(tower).patch_grid(w, h)
    else:
        grid = image_patch_grid(w, h, merge_size=merge)
    return Bucket(resolution_text(resolution), images, (grid,) * images)


def _forward(model: MoonViTEncoder, inp: EncoderInputs, rope: str, attention: str):
    return model(inp.patches, inp.grids, rope=rope, attention=attention,
                 cu_seqlens=inp.cu_seqlens, max_seqlen=inp.max_seqlen)


@dataclass(frozen=True)
class BucketRounds:
    """One bucket's timed rounds: per variant one forward time (microseconds)
    per round, ``times[a][i]`` and ``times[b][i]`` from the same round ``i``, and
    the order the variants ran in, per round."""

    timer: str
    times: dict[str, list[float]]
    orders: list[tuple[str, ...]]
    seed: int | str

    def positions(self, variant: str) -> str:
        return round_positions(self.orders, variant)


def bucket_rounds(model: MoonViTEncoder, inp: EncoderInputs, variants: Sequence[str], mode: str,
                  attention: str, *, samples: int = 5, warmup: int = 1,
                  seed: int | str = 0) -> BucketRounds:
    """Time ``samples`` rounds of one forward per variant, each round in the order
    ``shuffled_orders(variants, samples, seed)`` gives."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    cuda = inp.patches.device.type == "cuda"
    if mode not in ("eager", "cudagraph"):
        raise ValueError(f"mode must be 'eager' or 'cudagraph', got {mode!r}")
    if mode == "cudagraph" and not cuda:
        raise ValueError("cudagraph mode needs a GPU")
    orders = shuffled_orders(list(variants), samples, seed)
    runners = {}
    for v in variants:
        for _ in range(max(1, warmup)):
            _forward(model, inp, v, attention)
        if mode == "cudagraph":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _forward(model, inp, v, attention)
            graph.replay()
            runners[v] = graph.replay
        else:
            runners[v] = lambda v=v: _forward(model, inp, v, attention)
    times: dict[str, list[float]] = {v: [] for v in variants}
    if cuda:
        torch.cuda.synchronize()
        for order in orders:
            for v in order:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                runners[v]()
                end.record()
                end.synchronize()
                times[v].append(start.elapsed_time(end) * 1e3)
        timer = f"cuda_events_{mode}"
    else:
        import time as _time

        for order in orders:
            for v in order:
                t0 = _time.perf_counter()
                runners[v]()
                times[v].append((_time.perf_counter() - t0) * 1e6)
        timer = "wall_clock_cpu"
    runners.clear()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return BucketRounds(timer, times, orders, seed)


def paired_stats(times: dict[str, list[float]], variant: str) -> dict[str, float]:
    """Per-round comparisons of ``variant`` with native and with the floor ("none"),
    summarised over rounds (median, p20, p80). Pairing each round cancels the drift
    that moves all variants of a round together, which medians taken apart keep.

    ``saving_pct``: 100 (native_i - variant_i) / native_i; ``rope_cost_ms``:
    (variant_i - none_i) / 1e3. A comparison is NaN where its partner was not timed.
    """
    if variant not in times:
        raise ValueError(f"{variant!r} was not timed; timed: {sorted(times)}")
    mine = times[variant]
    out = {}
    for name, partner, f in (("saving_pct", "native", lambda m, p: 100 * (p - m) / p),
                             ("rope_cost_ms", "none", lambda m, p: (m - p) / 1e3)):
        if partner not in times or len(times[partner]) != len(mine):
            out.update({name: nan, f"{name}_p20": nan, f"{name}_p80": nan})
            continue
        mid, lo, hi = median_p20_p80([f(m, p) for m, p in zip(mine, times[partner])])
        out.update({name: mid, f"{name}_p20": lo, f"{name}_p80": hi})
    return out


def paired_gain_pct(times: dict[str, list[float]], variant: str, against: str) -> tuple[float, float, float]:
    """How much faster ``variant`` ran than ``against`` in the same rounds:
    100 (against_i - variant_i) / against_i per round, as (median, p20, p80)."""
    for name in (variant, against):
        if name not in times:
            raise ValueError(f"{name!r} was not timed; timed: {sorted(times)}")
    if len(times[variant]) != len(times[against]):
        raise ValueError(f"{variant!r} and {against!r} have different round counts")
    return median_p20_p80([100 * (a - v) / a for v, a in zip(times[variant], times[against])])


def encoder_not_run(variants: Sequence[str], head_dim: int, dtype: torch.dtype,
                    rotation: str = "pairs") -> dict[str, str]:
    """The encoder RoPE modes among ``variants`` that do not run in this encoder -> why:
    peers absent on this machine (``peer_status``), encoder-only modes absent
    (``encoder_only_absent``), and variants that do not take its head_dim or dtype
    (``Variant.unsupported``, e.g. FlashInfer at Kimi's head_dim 72) or its ``rotation``
    (Qwen's rotate-half: the QKV-GEMM epilogues rotate pairs only)."""
    from rope_kernels.variants import encoder_only_absent, peer_status

    absent = {s["name"]: s["reason"] for s in peer_status() if not s["available"]}
    absent.update(encoder_only_absent())
    out = {}
    for v in variants:
        if v in absent:
            out[v] = absent[v]
        elif v in VARIANTS and (why := VARIANTS[v].unsupported(dtype, head_dim=head_dim,
                                                                   rotation=rotation)):
            out[v] = why
        elif rotation != "pairs" and v not in VARIANTS and v not in ROPE_FREE_FLOORS:
            out[v] = f"{v} rotates Kimi's interleaved pairs only, not {rotation}"
    return out


def rope_in_place(rope: str) -> bool:
    """Whether the encoder's RoPE ``rope`` writes into the packed qkv (the registry's
    ``Variant.inplace``); False for ``none`` (no RoPE) and ``gemm_epilogue`` (q and k
    rotated as the QKV GEMM writes them: no separate call)."""
    return VARIANTS[rope].inplace if rope in VARIANTS else False


def bucket_rows(bucket: Bucket, mode: str, attention: str, rounds: BucketRounds, *,
                profiled: dict[str, tuple[float, float]], peaks: dict[str, float],
                agreement: dict[str, dict[str, float]], copy_gbps: float,
                **fields) -> list[dict]:
    """One encoder-latency row per variant of a timed bucket: median/p20/p80 of its
    forward over the rounds (ms), per-round paired statistics (``paired_stats``),
    where it ran in each round, its per-round times (``round_ms``, ";"-joined, so
    any two variants can be compared round by round from the file), its output
    against native's on this bucket (``agreement[v]`` from ``native_agreement``),
    and, prefixed ``profiled_``, RoPE's share and device time (``profiled[v]`` =
    ``rope_profile``'s (RoPE ms, all ms)) and peak memory of one profiled forward.
    ``fields`` (e.g. layers, encoder) go into every row."""
    missing = [v for v in rounds.times if v not in agreement]
    if missing:
        raise ValueError(f"no agreement with native for timed variant(s) {missing}")
    rows = []
    for v, ts in rounds.times.items():
        t = summarize(ts, rounds.timer, 1)
        rope_ms, all_ms = profiled[v]
        rows.append({"variant": v, "in_place": rope_in_place(v), "resolution": bucket.resolution,
                     "images": bucket.images,
                     "vit_tokens": bucket.vit_tokens, "llm_tokens": bucket.llm_tokens, "mode": mode,
                     "attention_kernel": attention, "timer": t.timer, "median_ms": t.median_us / 1e3,
                     "p20_ms": t.p20_us / 1e3, "p80_ms": t.p80_us / 1e3, "samples": t.samples,
                     "round_positions": rounds.positions(v), "order_seed": str(rounds.seed),
                     "round_ms": ";".join(f"{x / 1e3:.6g}" for x in ts),
                     "profiled_rope_share": rope_ms / all_ms if all_ms > 0 else nan,
                     "profiled_rope_device_ms": rope_ms, "profiled_peak_mem_mb": peaks[v],
                     "copy_gbps": copy_gbps, **agreement[v], **fields, **peer_columns(v),
                     **{f"paired_{k}": x for k, x in paired_stats(rounds.times, v).items()}})
    return rows


# Kernels RoPE variants launch through Triton's own launcher. The profiler records
# them as device events but (torch 2.11) does not attach them to the CPU call that
# launched them, so they are recognised by name (every registered variant's,
# ``variants.rope_triton_kernels()``).


def _subtree(evt):
    yield evt
    for child in getattr(evt, "cpu_children", []) or []:
        yield from _subtree(child)


def _is_cpu(evt) -> bool:
    return str(getattr(evt, "device_type", "")).endswith("CPU")


def attribute_rope_time(events, label: str = "rope",
                        triton_kernels: Sequence[str] | None = None) -> tuple[float, float]:
    """(RoPE device time, all device time) in microseconds from profiler events.

    All time: every device operation (kernels, copies), not the GPU-side copies of
    ``record_function`` ranges. RoPE time: Triton RoPE kernels, recognised by name
    among the device operations (attached to their launch or not), plus the other
    device operations attached to calls inside ``label`` ranges; each counted once.
    """
    if triton_kernels is None:
        triton_kernels = rope_triton_kernels()
    events = list(events)
    device_ops = [e for e in events if not _is_cpu(e) and e.name != label
                  and not getattr(e, "is_user_annotation", False)]
    total = sum(float(e.time_range.elapsed_us()) for e in device_ops)
    ranges = [e for e in events if _is_cpu(e) and e.name == label]
    attached = [k for r in ranges for d in _subtree(r) for k in (getattr(d, "kernels", None) or [])]
    inside = sum(float(k.duration) for k in attached if k.name not in triton_kernels)
    inside += sum(float(e.time_range.elapsed_us()) for e in device_ops if e.name in triton_kernels)
    return inside, total


def rope_profile(model: MoonViTEncoder, inp: EncoderInputs, rope: str,
                 attention: str) -> tuple[float, float]:
    """(RoPE time, all time) of one profiled forward, in milliseconds. On a GPU:
    RoPE's device time in place (its kernels on the encoder's own tensors) and all
    device time (``attribute_rope_time``); on the CPU: the CPU time of the ``rope``
    ranges and of the forward. RoPE time is 0 for the floors (``ROPE_FREE_FLOORS``)."""
    cuda = inp.patches.device.type == "cuda"
    _forward(model, inp, rope, attention)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        _forward(model, inp, rope, attention)
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        inside, total = attribute_rope_time(prof.events())
    else:
        events = [e for e in prof.events() if _is_cpu(e)]
        total = sum(e.cpu_time_total for e in events if getattr(e, "cpu_parent", None) is None)
        inside = sum(e.cpu_time_total for e in events if e.name == "rope")
    return (0.0 if rope in ROPE_FREE_FLOORS else inside / 1e3), total / 1e3


def forward_peak_mb(model: MoonViTEncoder, inp: EncoderInputs, rope: str, attention: str) -> float:
    """Peak device memory of one eager forward beyond what was allocated before
    (activations and temporaries; MB = 1e6 bytes). NaN on the CPU."""
    if inp.patches.device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = _forward(model, inp, rope, attention)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 1e6


# Like the kernel checker (``correctness``, flash-attention's rule): a variant's
# encoder output may be at most twice as far from a float32 run of the same encoder
# (native RoPE, the same weights) as the native bf16 encoder is, plus a floor. A
# variant that rounds differently but no worse (RoPE in the QKV GEMM's epilogue
# rounds once, not twice) passes at any depth; skipping RoPE ("none") fails by far.
AGREE_RATIO = 2.0
AGREE_FLOOR = 1e-6  # relative to max |reference|

# Attention kernels that take bf16/fp16 only, and what the float32 reference runs instead.
_FP32_ATTENTION = {"sdpa_cudnn_batched": "sdpa_batched", "varlen_attn": "sdpa_per_image"}


def native_agreement(model: MoonViTEncoder, inp: EncoderInputs, attention: str,
                     variants: Sequence[str]) -> dict[str, dict[str, float]]:
    """Every variant's encoder output on the same inputs (eager, the same kernels a
    graph replays) against a float32 copy of the encoder running native RoPE:
    ``max_rel_err_vs_fp32`` = max |out - reference| / max |reference|, its
    tolerance ``agreement_tol_rel`` (``AGREE_RATIO`` x native's own error +
    ``AGREE_FLOOR``), and ``max_rel_err_vs_native`` (max |out - native| / max
    |native|, for reading). "none" is measured too: the floor skips RoPE and must
    miss the tolerance, which shows the check can fail."""
    reference_model = copy.deepcopy(model).float()
    reference = _forward(reference_model, replace(inp, patches=inp.patches.float()), "native",
                         _FP32_ATTENTION.get(attention, attention)).double()
    del reference_model
    ref_scale = reference.abs().max().item()
    native = _forward(model, inp, "native", attention).double()
    native_scale = native.abs().max().item()

    def rel(out, to, scale):
        return (out - to).abs().max().item() / scale if scale > 0 else nan

    tol = AGREE_RATIO * rel(native, reference, ref_scale) + AGREE_FLOOR
    result = {}
    for v in variants:  # one output held at a time (32 images: 1.4 GB each in float64)
        out = native if v == "native" else _forward(model, inp, v, attention).double()
        result[v] = {"max_rel_err_vs_native": rel(out, native, native_scale),
                     "max_rel_err_vs_fp32": rel(out, reference, ref_scale),
                     "agreement_tol_rel": tol}
        del out
    return result


def agrees_with_native(rows) -> "pd.Series":
    """Rows (a DataFrame of encoder rows) whose output is as close to the float32
    reference as the native encoder's (within ``AGREE_RATIO``): ``native_agreement``."""
    return rows["max_rel_err_vs_fp32"] <= rows["agreement_tol_rel"]


__all__ = ["Bucket", "BucketRounds", "agrees_with_native", "bucket_rounds", "bucket_rows",
           "encoder_inputs", "encoder_not_run", "forward_peak_mb", "make_bucket", "native_agreement", "paired_stats",
           "rope_in_place", "rope_minimal_ms", "rope_profile"]
