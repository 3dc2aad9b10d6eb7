"""The RoPE microbenchmark: every variant x shape x dtype x mode, one tidy row each."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import functools
from dataclasses import dataclass, field

import pandas as pd
import torch

from rope_kernels.correctness import draw_rope_inputs
from rope_kernels.provenance import provenance
from rope_kernels.roofline import minimal_bytes  # noqa: F401  (its home: roofline.py)
from rope_kernels.bench.same_bytes_copy import (same_bytes_copy, same_bytes_copy_inplace,
                                                same_bytes_copy_tilings)
from rope_kernels.bench.timing import (cold_set_count, host_time_us, peak_memory_mb, time_fn,
                                       time_rounds)
from rope_kernels.variants import Variant, get_variant

import triton  # noqa: E402  (after rope_kernels.kernels.checks chose compiler or interpreter)
import triton.language as tl  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, order=True)
class Shape:
    tokens: int
    heads: int
    head_dim: int
    rotation: str = "pairs"  # vocabulary.ROTATIONS: how each head's elements pair up
    tower: str = field(default="", compare=False)  # the tower (towers.py) the shape is from


def parse_dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def expand_families(families: Iterable[dict]) -> list[Shape]:
    """[{'tokens': [...], 'heads': [...], 'head_dim': 72}, ...] -> sorted unique shapes.

    A family may also name its ``rotation`` ("pairs", the default, or "half") and its
    ``tower``; ``{'tower': 'qwen3_vl'}`` alone is that tower's family
    (``towers.tower_families``: its heads, head_dim and rotation at the token counts of
    1, 4 and 16 images of 448x448 and 1024x1024)."""
    from rope_kernels.kernels.checks import check_rotation
    from rope_kernels.towers import tower_families

    shapes: dict[Shape, Shape] = {}
    for fam in families:
        if isinstance(fam, dict) and set(fam) == {"tower"}:
            fam = tower_families([fam["tower"]])[0]
        if (not isinstance(fam, dict) or not {"tokens", "heads", "head_dim"} <= set(fam)
                or set(fam) - {"tokens", "heads", "head_dim", "rotation", "tower"}):
            raise ValueError("each shape family needs exactly tokens, heads, head_dim (and "
                             f"optionally rotation, tower), or a tower alone; got {fam!r}")
        rotation = check_rotation(fam.get("rotation", "pairs"))
        tower = fam.get("tower", "")
        if not isinstance(tower, str):
            raise TypeError(f"a family's tower must be a string, got {tower!r}")
        head_dims = fam["head_dim"] if isinstance(fam["head_dim"], list) else [fam["head_dim"]]
        for t in fam["tokens"]:
            for h in fam["heads"]:
                for d in head_dims:
                    for name, v in (("tokens", t), ("heads", h), ("head_dim", d)):
                        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                            raise ValueError(f"{name} must be a positive int, got {v!r}")
                    if d % 2:
                        raise ValueError(f"head_dim must be even, got {d}")
                    shape = Shape(t, h, d, rotation, tower)
                    shapes.setdefault(shape, shape)  # the first family to name a shape keeps it
    return sorted(shapes)


def make_arg_sets(shape: Shape, dtype: torch.dtype, device, count: int, seed: int = 0):
    """``count`` independent (xq, xk, freqs_cis) sets (``correctness.draw_rope_inputs``,
    drawn on ``device`` itself: cold-L2 rotation needs many large sets); q/k are
    views of packed qkv."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sets = []
    for _ in range(count):
        inp = draw_rope_inputs(gen, shape.tokens, shape.heads, shape.head_dim, dtype)
        sets.append((inp.xq, inp.xk, inp.freqs_cis))
    return sets


def rope_read_bytes(tokens: int, heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one RoPE call reads: q and k (not v, though they are views into the
    packed qkv) and fp32 cos and sin. What the L2 rotation must cover."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * element * tokens * heads * head_dim + 4 * tokens * head_dim


# The same-bytes copies (``same_bytes_copy``) timed in rounds with the variants:
# every tiling of ``same_bytes_copy_tilings``, out of place on the variants' shared
# input sets and in place on input sets of their own (a copy in place rewrites the
# same values, so the in-place copies share theirs). Each variant's row carries the
# fastest copy that moves what it moves (``in_place`` pairs them) and its tiling.
SAME_BYTES_COPY = "same_bytes_copy"
# Calls per host-time loop on a GPU (five loops per variant and shape): enough to average
# out the timer, few enough that even native's six launches a call fit the launch queue.
HOST_CALLS = 100
SAME_BYTES_COPY_INPLACE = "same_bytes_copy_inplace"


def copy_name(inplace: bool, label: str) -> str:
    """The timing name of one copy tiling: same_bytes_copy[row:64x16/4]."""
    return f"{SAME_BYTES_COPY_INPLACE if inplace else SAME_BYTES_COPY}[{label}]"


def _copy_fn(inplace: bool, tiling):
    if inplace:
        return lambda xq, xk, freqs: same_bytes_copy_inplace(xq, xk, freqs, tiling=tiling)
    return lambda xq, xk, freqs: same_bytes_copy(xq, xk, freqs, tiling=tiling)


def fastest_copy_timing(timings: dict, inplace: bool):
    """(tiling label, Timing) of the fastest same-bytes copy of that kind (by median)."""
    prefix = (SAME_BYTES_COPY_INPLACE if inplace else SAME_BYTES_COPY) + "["
    copies = {name[len(prefix):-1]: t for name, t in timings.items() if name.startswith(prefix)}
    if not copies:
        raise ValueError(f"no {'in-place ' if inplace else ''}same-bytes copy was timed")
    label = min(copies, key=lambda k: copies[k].median_us)
    return label, copies[label]


def fastest_copy(timings: dict, inplace: bool) -> tuple[float, str]:
    """(median us, tiling label) of the fastest same-bytes copy of that kind."""
    label, timing = fastest_copy_timing(timings, inplace)
    return timing.median_us, label


@triton.jit
def _launch_floor_kernel(flag_ptr):
    """One program that stores one int: what a launch alone costs in the same rounds."""
    tl.store(flag_ptr, 1)


LAUNCH_FLOOR = "launch_floor"  # its timing name in the rounds


def launch_floor(flag: torch.Tensor) -> None:
    """Launch the one-program kernel on a one-element int32 ``flag``."""
    _launch_floor_kernel[(1,)](flag)


def _packed_sets(arg_sets):
    """(qkv, freqs_cis, cos, sin) per (xq, xk, freqs_cis) set: the packed buffer q and k
    slice, and freqs_cis's cos/sin views, as a layer hands them to ``Variant.packed``."""
    from rope_kernels.kernels.checks import packed_qkv_of
    from rope_kernels.kernels.reference import cos_sin_views

    return [(packed_qkv_of(xq, xk, "the host-time loop"), f, *cos_sin_views(f))
            for xq, xk, f in arg_sets]


def _packed_call(variant: Variant, rotation: str = "pairs"):
    def call(qkv, freqs_cis, cos, sin):
        return variant.packed(qkv, freqs_cis, cos, sin, rotation)
    return call


def _rotating(variant: Variant, rotation: str):
    """The variant's (xq, xk, freqs_cis) call for ``rotation`` (itself for "pairs")."""
    return variant if rotation == "pairs" else functools.partial(variant.__call__, rotation=rotation)


def bench_shape(
    variants: Sequence[Variant],
    shape: Shape,
    dtype: torch.dtype,
    modes: Sequence[str],
    *,
    device,
    copy_gbps: float,
    samples: int = 50,
    min_calls: int = 20,
    rounds: int = 5,
    seed: int = 0,
) -> list[dict]:
    """Time every variant and the same-bytes copies on one shape, per mode in
    ``rounds`` rounds of seeded shuffled order (``timing.time_rounds``); in-place
    variants (and the in-place copy) rotate input sets of their own. Returns rows
    without speedups.

    References in every row: ``copy_gbps`` is the device-to-device copy ceiling
    (``copy_bandwidth_gbps``, a 2 GiB copy) and ``pct_of_copy`` the variant's
    minimal bytes per second against it; ``same_bytes_copy_us`` is the median of
    the fastest SM copy moving exactly the bytes this call moves, in place when the
    variant is (``same_bytes_copy``, every tiling of ``same_bytes_copy_tilings``
    timed in the same rounds; ``same_bytes_copy_tiling`` names the fastest and
    ``same_bytes_copy_p20_us``/``_p80_us`` give its noise band), and
    ``pct_of_same_bytes_copy`` is that time over the variant's (100: as fast as
    copying the bytes). ``host_us`` (with ``host_p20_us``/``host_p80_us``) is the host
    time of one eager ``Variant.packed`` call (``timing.host_time_us``, loops of
    ``host_calls`` calls). ``launch_floor_us``: a one-program Triton kernel storing one int,
    timed in the same rounds (the part of a call that is launch alone)."""
    device = torch.device(device)
    rotation = shape.rotation
    count = cold_set_count(rope_read_bytes(shape.tokens, shape.heads, shape.head_dim, dtype), device)
    shared = make_arg_sets(shape, dtype, device, count)
    calls = max(count, min_calls if device.type == "cuda" else 1)
    nbytes = minimal_bytes(shape.tokens, shape.heads, shape.head_dim, dtype)
    # An in-place variant rotates its own copies (same values): the shared sets
    # the other variants read stay untouched.
    fns = {v.name: (_rotating(v, rotation),
                    make_arg_sets(shape, dtype, device, count) if v.inplace else shared)
           for v in variants}
    tilings = same_bytes_copy_tilings(shape.heads, shape.head_dim,
                                      torch.empty((), dtype=dtype).element_size())
    copy_sets = {False: shared}
    if any(v.inplace for v in variants):
        copy_sets[True] = make_arg_sets(shape, dtype, device, count)
    for inplace in sorted({v.inplace for v in variants}):
        for tiling in tilings:
            fns[copy_name(inplace, tiling.label)] = (_copy_fn(inplace, tiling), copy_sets[inplace])
    # the launch floor: a one-program kernel (one int stored) timed in the same rounds; at a
    # launch-bound shape (1024 tokens: ~2-5 us calls) launch_floor_us over a variant's
    # time says how much of its call is the launch itself
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    fns[LAUNCH_FLOOR] = (lambda *_args: launch_floor(flag), shared)
    mems = {v.name: peak_memory_mb(fns[v.name][0], fns[v.name][1][0]) for v in variants}
    # host time per eager call (a loop of calls that never waits for the device): what a
    # call costs where the GPU work is small, as in vLLM's eager vision tower. Called as
    # the encoder calls it (``Variant.packed`` on the layer's packed qkv, cos/sin views
    # made once per forward), so an engine's kernel is timed without this project's
    # argument checks around it. Rows of every mode carry it; on the CPU it includes
    # the interpreter's work (one call).
    on_gpu = device.type == "cuda"
    host_calls = HOST_CALLS if on_gpu else 1
    hosts = {v.name: host_time_us(_packed_call(v, rotation), _packed_sets(fns[v.name][1]),
                                  calls=host_calls,
                                  repeats=5 if on_gpu else 1, warmup=3 if on_gpu else 0)
             for v in variants}
    rows = []
    for mode in modes:
        order_seed = f"{seed}/{shape.tokens}x{shape.heads}x{shape.head_dim}/{dtype_name(dtype)}/{mode}"
        if rotation != "pairs":  # pairs rows keep the seeds they always had
            order_seed += f"/{rotation}"
        # CPU rounds skip the re-warm: interpreter time, and CPU timings are not results.
        timed = time_rounds(fns, mode=mode, calls_per_sample=calls, samples=samples, rounds=rounds,
                            seed=order_seed, rewarm=1 if device.type == "cuda" else 0)
        for variant in variants:
            t = timed.timings[variant.name]
            copy_tiling, copy = fastest_copy_timing(timed.timings, variant.inplace)
            copy_us = copy.median_us
            gbps = nbytes / (t.median_us * 1e-6) / 1e9
            rows.append({
                "variant": variant.name, "tokens": shape.tokens, "heads": shape.heads,
                "head_dim": shape.head_dim, "dtype": dtype_name(dtype), "mode": mode,
                "rotation": rotation, "tower": shape.tower, "timer": t.timer, "median_us": t.median_us, "p20_us": t.p20_us,
                "p80_us": t.p80_us, "samples": t.samples, "calls_per_sample": t.calls_per_sample,
                "input_sets": count, "rounds": len(timed.orders),
                "round_positions": timed.positions(variant.name), "order_seed": order_seed,
                "bytes": nbytes, "gbps": gbps,
                "pct_of_copy": 100 * gbps / copy_gbps, "copy_gbps": copy_gbps,
                "in_place": variant.inplace, "same_bytes_copy_us": copy_us,
                "same_bytes_copy_tiling": copy_tiling,
                "same_bytes_copy_p20_us": copy.p20_us,
                "same_bytes_copy_p80_us": copy.p80_us,
                "pct_of_same_bytes_copy": 100 * copy_us / t.median_us,
                "launch_floor_us": timed.timings[LAUNCH_FLOOR].median_us,
                "launches": variant.launch_count(dtype, rotation), "peak_mem_mb": mems[variant.name],
                "host_us": hosts[variant.name].median_us,
                "host_p20_us": hosts[variant.name].p20_us,
                "host_p80_us": hosts[variant.name].p80_us, "host_calls": host_calls,
                **variant.peer_columns,
            })
    del shared, fns
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def add_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """speedup_vs_native = native median / variant median, same shape, dtype, mode and
    rotation (NaN where native did not run: it rotates pairs only)."""
    keys = ["tokens", "heads", "head_dim", "dtype", "mode"] + (["rotation"] if "rotation" in df else [])
    native = df[df.variant == "native"].set_index(keys)["median_us"].rename("native_us")
    out = df.drop(columns=[c for c in ("speedup_vs_native",) if c in df]).join(native, on=keys)
    out["speedup_vs_native"] = out["native_us"] / out["median_us"]
    return out.drop(columns="native_us")


def not_run_lines(cases: Sequence[dict]) -> list[str]:
    """One line per variant and reason, naming every shape it covers (a report
    reads one FlashInfer line for its 15 Kimi shapes, not 15 copies of the reason)."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for c in cases:
        half = "" if c.get("rotation", "pairs") == "pairs" else f" {c['rotation']}"
        grouped.setdefault((c["variant"], c["reason"]), []).append(
            f"{c['tokens']}x{c['heads']}x{c['head_dim']}{half} {c['dtype']}")
    return [f"{variant} not timed at {', '.join(where)}: {reason}"
            for (variant, reason), where in grouped.items()]


def not_run_cases(variants: Sequence[Variant], shapes: Sequence[Shape],
                  dtypes: Sequence[torch.dtype]) -> list[dict]:
    """The (variant, shape, dtype) a variant does not take (``Variant.unsupported``:
    its dtypes, its head_dims), one dict each with the reason: not timed, and said so."""
    return [{"variant": v.name, "tokens": s.tokens, "heads": s.heads, "head_dim": s.head_dim,
             "dtype": dtype_name(d), "rotation": s.rotation, "reason": why}
            for d in dtypes for s in shapes for v in variants
            if (why := v.unsupported(d, head_dim=s.head_dim, rotation=s.rotation))]


# Tokens of the float64 check a rotate-half layout gets before it is timed (``checked_cases``).
CHECK_TOKENS = 67


def checked_cases(variants: Sequence[Variant], shapes: Sequence[Shape],
                  dtypes: Sequence[torch.dtype], device, *, skip=frozenset()) -> list[dict]:
    """Each variant's rotate-half layouts (heads, head_dim, dtype: the rotation newest to the
    study and to most peers) checked against float64 once, on ``CHECK_TOKENS`` fresh tokens
    (``correctness.check_variant``), before any is timed: a layout a variant gets wrong, or
    refuses by raising, is a not-run case with the reason (as ``not_run_cases`` gives), so a
    wrong kernel is never timed and one that raises does not stop the sweep. ``skip``:
    (variant, tokens, heads, head_dim, dtype, rotation) already not run."""
    from rope_kernels.correctness import check_variant

    out, seen = [], set()
    for d in dtypes:
        for s in shapes:
            if s.rotation == "pairs":
                continue
            for v in variants:
                layout = (v.name, s.heads, s.head_dim, d, s.rotation)
                if layout in seen or (v.name, s.tokens, s.heads, s.head_dim, dtype_name(d),
                                      s.rotation) in skip:
                    continue
                seen.add(layout)
                try:
                    r = check_variant(v, tokens=CHECK_TOKENS, heads=s.heads, head_dim=s.head_dim,
                                      dtype=d, device=device, rotation=s.rotation)
                    why = "" if r.passed else (
                        f"fails the float64 check at {CHECK_TOKENS}x{s.heads}x{s.head_dim} "
                        f"{s.rotation}: max error {r.max_abs_err:.3g} over {r.tolerance:.3g}"
                        + ("" if r.inputs_intact else ", wrote into inputs it must not"))
                except Exception as exc:  # noqa: BLE001 - a kernel that refuses: not run, with why
                    why = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                if why:
                    out += [{"variant": v.name, "tokens": t.tokens, "heads": t.heads,
                             "head_dim": t.head_dim, "dtype": dtype_name(d), "rotation": t.rotation,
                             "reason": why}
                            for t in shapes if (t.heads, t.head_dim, t.rotation) == (s.heads, s.head_dim, s.rotation)]
    return out


def run_microbench(
    variant_names: Sequence[str],
    families: Iterable[dict],
    dtypes: Sequence[str],
    modes: Sequence[str],
    *,
    device,
    copy_gbps: float,
    samples: int = 50,
    progress: bool = True,
    rounds: int = 5,
    seed: int = 0,
) -> pd.DataFrame:
    """The whole sweep as a tidy table, provenance in every row. Per shape and
    mode the variants are timed in ``rounds`` rounds of seeded shuffled order.
    A variant is not timed where it does not take the shape or dtype
    (``not_run_cases``) or, in a rotate-half layout, fails or refuses a float64 check
    (``checked_cases``): printed with the reason, and in ``df.attrs["not_run"]``."""
    variants = [get_variant(n) for n in variant_names]
    shapes = expand_families(families)
    dts = [parse_dtype(d) for d in dtypes]
    not_run = not_run_cases(variants, shapes, dts)
    skip = {(c["variant"], c["tokens"], c["heads"], c["head_dim"], c["dtype"], c["rotation"])
            for c in not_run}
    not_run += checked_cases(variants, shapes, dts, device, skip=skip)
    for line in not_run_lines(not_run):
        print(line, flush=True)
    skip = {(c["variant"], c["tokens"], c["heads"], c["head_dim"], c["dtype"], c["rotation"])
            for c in not_run}
    work = [(s, d) for d in dts for s in shapes]
    iterator = work
    if progress:
        from tqdm import tqdm

        iterator = tqdm(work, desc="microbench", unit="shape")
    rows = []
    for shape, dtype in iterator:
        here = [v for v in variants if (v.name, shape.tokens, shape.heads, shape.head_dim,
                                         dtype_name(dtype), shape.rotation) not in skip]
        if here:
            rows += bench_shape(here, shape, dtype, modes, device=device,
                                copy_gbps=copy_gbps, samples=samples, rounds=rounds, seed=seed)
    df = add_speedups(pd.DataFrame(rows))
    prov = provenance()
    for k, v in prov.items():
        df[k] = v
    df.attrs["not_run"] = not_run
    return df



def fused_config_grid(heads: int, head_dim: int, element_size: int = 2, *,
                      tile_bytes=(1024, 16384), warps=(2, 4, 8)) -> list:
    """Tiles-kernel launch settings for the block-size study of one (heads, head_dim):
    heads per program a power of two dividing ``heads`` (the largest three), tokens
    per program so that a tile of q holds ``tile_bytes[0]``..``tile_bytes[1]`` bytes."""
    from rope_kernels.kernels.fused import head_dim_chunks
    from rope_kernels.bench.fused_candidates import TilesConfig

    main, rest = head_dim_chunks(head_dim)
    block_hs = [h for h in (16, 8, 4, 2, 1) if heads % h == 0][:3]
    configs = []
    for bh in block_hs:
        for bt in (1, 2, 4, 8, 16, 32, 64):
            tile = bt * bh * (main + rest) * element_size
            if tile_bytes[0] <= tile <= tile_bytes[1]:
                configs += [TilesConfig(block_t=bt, block_h=bh, num_warps=w) for w in warps]
    return configs


def sweep_fused_configs(shapes: Sequence[Shape], configs, dtype: torch.dtype, *,
                        device, copy_gbps: float, mode: str = "cudagraph",
                        samples: int = 30, progress: bool = True,
                        candidates: bool = True) -> pd.DataFrame:
    """Time the fused rotation under each launch config: the evidence behind
    ``fused_launch_config``'s heuristic. ``configs`` is a list, or a function
    ``(shape) -> list`` (e.g. ``lambda s: fused_config_grid(s.heads, s.head_dim)``);
    its items are ``RowsConfig`` (the default's kernel, "rows", out of place),
    ``TilesConfig`` (the tiles candidate, out of place) or ``FusedCandidate``. With
    ``candidates`` every shape also gets the launch candidates of
    ``bench.fused_candidates.fused_candidates`` (rows tiles, the tiles kernel,
    persistent grid, in-kernel angles, cache hints; some in place).

    Rows carry ``strategy``, ``programs_per_sm``, ``in_place``, ``load_eviction_policy``
    and ``store_cache_modifier`` ("none": no hint); ``block_h`` of a rows candidate is
    every head (a program holds whole tokens). ``is_default`` marks what
    ``fused_qk_rope`` launches by default (out of place, and in place as
    ``fused_inplace``). In-place runs rotate input sets of their own (same values),
    as ``bench_shape`` does for in-place variants; the angles rows read int32 (row,
    col) per token instead of cos/sin, and their ``gbps`` use the same nominal bytes as
    every row (a time comparison)."""
    from rope_kernels.kernels.freqs import vision_patch_coords, vision_rope_frequencies
    from rope_kernels.kernels.fused import RowsConfig
    from rope_kernels.bench.fused_candidates import (FusedCandidate, TilesConfig,
                                                       fused_candidates, fused_qk_rope_angles,
                                                       sweep_grid)
    from rope_kernels.kernels.reference import cos_sin_views

    device = torch.device(device)
    element = torch.empty((), dtype=dtype).element_size()
    work = []
    for s in shapes:
        items = []
        for c in (configs(s) if callable(configs) else configs):
            if isinstance(c, (RowsConfig, TilesConfig)):
                c = FusedCandidate("rows" if isinstance(c, RowsConfig) else "tiles", c)
            if not isinstance(c, FusedCandidate):
                raise TypeError("a sweep config must be a RowsConfig, TilesConfig or "
                                f"FusedCandidate, got {c!r}")
            if c not in items:
                items.append(c)
        if candidates:
            items += [c for c in fused_candidates(s.heads, s.head_dim, element) if c not in items]
        work += [(s, c) for c in items]
    if progress:
        from tqdm import tqdm

        work = tqdm(work, desc="fused configs", unit="run")
    rows, current = [], None
    for shape, cand in work:
        if shape != current:
            read = rope_read_bytes(shape.tokens, shape.heads, shape.head_dim, dtype)
            count = cold_set_count(read, device)
            sets, own_sets = make_arg_sets(shape, dtype, device, count), None
            current = shape
        if cand.in_place and own_sets is None:
            # in-place runs rotate copies of their own: the shared sets stay as drawn
            own_sets = make_arg_sets(shape, dtype, device, count)
        arg_sets = own_sets if cand.in_place else sets
        if cand.strategy == "angles":
            coords = vision_patch_coords(sweep_grid(shape.tokens), device=device)
            freqs = vision_rope_frequencies(shape.head_dim, device=device)
            # the angles candidate's inputs: the same q/k, each set its own coords
            arg_sets = [(xq, xk, coords.clone(), freqs.clone()) for xq, xk, _ in arg_sets]

            def fn(xq, xk, c, f, _c=cand):
                return fused_qk_rope_angles(xq, xk, c, f, inplace=_c.in_place, config=_c.config)
        else:
            def fn(xq, xk, f, _c=cand):
                return _c(xq, xk, *cos_sin_views(f))

        t = time_fn(fn, arg_sets, mode=mode, calls_per_sample=max(len(arg_sets), 20),
                    samples=samples)
        nbytes = minimal_bytes(shape.tokens, shape.heads, shape.head_dim, dtype)
        gbps = nbytes / (t.median_us * 1e-6) / 1e9
        cfg = cand.config
        rows.append({"tokens": shape.tokens, "heads": shape.heads, "head_dim": shape.head_dim,
                     "dtype": dtype_name(dtype), "mode": mode, "strategy": cand.label,
                     "block_t": cfg.block_t,
                     "block_h": shape.heads if cand.strategy == "rows" else cfg.block_h,
                     "num_warps": cfg.num_warps, "programs_per_sm": cand.programs_per_sm,
                     "load_eviction_policy": cfg.eviction_policy or NO_CACHE_HINT,
                     "store_cache_modifier": cfg.store_cache_modifier or NO_CACHE_HINT,
                     "is_default": is_default_launch(cand, shape, element),
                     "in_place": cand.in_place,
                     "timer": t.timer, "median_us": t.median_us,
                     "p20_us": t.p20_us, "p80_us": t.p80_us, "gbps": gbps,
                     "pct_of_copy": 100 * gbps / copy_gbps, "copy_gbps": copy_gbps})
    return pd.DataFrame(rows)


# What the sweep's hint columns hold where a launch gives no cache hint.
NO_CACHE_HINT = "none"


def is_default_launch(candidate, shape: Shape, element_size: int) -> bool:
    """Whether ``candidate`` is what ``fused_qk_rope`` launches by default on ``shape``
    (its kernel, "rows", under ``fused_launch_config``), in place or not."""
    from rope_kernels.kernels.fused import fused_launch_config

    return candidate.strategy == "rows" and candidate.config == fused_launch_config(
        shape.heads, shape.head_dim, element_size)
