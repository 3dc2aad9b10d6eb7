"""The QKV projection microbenchmark: is RoPE free inside the GEMM's epilogue?

Kimi-K2.5's projection, 1152 -> 3456 (16 heads x 72) in bf16, at 5,476 to
87,616 tokens (1 to 16 images of 1024 x 1024), these ways (``QKV_VARIANTS``):

- ``cublas_linear``: ``F.linear`` alone, the floor (no RoPE at all);
- ``cublas_linear+fused_rope``: ``F.linear`` then the fused RoPE kernel in place
  on the packed view, as the encoder does today;
- ``compile_max_autotune``: ``torch.compile(mode="max-autotune-no-cudagraphs")``
  of ``rope(linear(x))`` (the cudagraph-trees mode cannot be captured inside our
  CUDA-graph timer); can Inductor fuse the rotation into its GEMM?
- ``qkv_rope_linear``: our Triton GEMM rotating q/k in its epilogue (cos/sin table),
  at the fastest of ``QKV_CANDIDATE_CONFIGS`` in this same run;
- ``qkv_rope_linear_angles``: the same with the angles computed in-kernel, at its own
  fastest candidate of the run;
- ``qkv_gemm_rotation_compiled_out``: the kernel with the rotation compiled out
  (benchmarks only; q/k NOT rotated), at the config of the faster of the two above:
  the mainloop's share;
- ``qkv_rope_linear_cute``: our CuTe DSL kernel (``kernels/qkv_cute.py``: warp-specialized
  ping-pong, W multicast over a 2x1 cluster, angles in-kernel), at the fastest of
  ``CUTE_CONFIGS`` in this run; sm_90 GPUs with nvidia-cutlass-dsl only (elsewhere a row
  says why it is absent); ``qkv_cute_rotation_compiled_out``: the same kernel and config
  with the rotation compiled out;
- ``quack_gemm`` / ``quack_gemm_rope``: QuACK's GEMM with a bias epilogue and with
  Kimi's RoPE in its epilogue (``peers/quack_gemm.py``), best of its configs;
  absent with the reason where QuACK is not installed.

Swept variants (ours over its candidate configs, QuACK's over its configs) get a
row per config in the sweep table (``qkv_gemm_sweep.csv``); the main table
(``qkv_gemm.csv``) holds one row per variant and token count, the swept ones at
their fastest config (``config`` says which). Every row: median/p20/p80
microseconds (``timing.time_fn``), TFLOP/s (2 * T * 1152 * 3456 flops), the ratio
to ``cublas_linear`` and to ``cublas_linear+fused_rope`` at the same token count,
and its correctness against float64 on the first input set: ``max_abs_err`` next to
``native_max_abs_err`` (cuBLAS linear in bf16 then Kimi's native RoPE against the
same reference), ``error_tolerance`` (twice that, plus a floor) and
``matches_float64``. Unrotated variants are judged against ``x W^T + b`` (column
``reference``). ``roofline`` returns what a compute-bound roofline plot needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from rope_kernels.correctness import draw_qkv_problem
from rope_kernels.bench.timing import time_fn
from rope_kernels.kernels.freqs import vision_patch_coords, vision_rope_frequencies
from rope_kernels.kernels.fused import fused_qk_rope
from rope_kernels.kernels.qkv_gemm import (QKV_CANDIDATE_CONFIGS, QKVGemmConfig,
                                           permute_qkv_weight, qkv_gemm_config,
                                           qkv_linear_rotation_compiled_out, qkv_rope_linear,
                                           qkv_rope_linear_angles, with_layout)
from rope_kernels.kernels.reference import cos_sin_views, native_rope, rope_cos_sin, rope_reference
from rope_kernels.kernels import qkv_cute
from rope_kernels.peers import quack_gemm as quack
from rope_kernels.provenance import provenance

QKV_VARIANTS = ("cublas_linear", "cublas_linear+fused_rope", "compile_max_autotune",
                "qkv_rope_linear", "qkv_rope_linear_angles", "qkv_gemm_rotation_compiled_out",
                "qkv_rope_linear_cute", "qkv_cute_rotation_compiled_out",
                "quack_gemm", "quack_gemm_rope")
# Variants whose output is x W^T + b, q and k not rotated (judged against that).
UNROTATED = ("cublas_linear", "qkv_gemm_rotation_compiled_out", "quack_gemm",
             "qkv_cute_rotation_compiled_out")
# Variants timed at our best config of the run, our swept kernels (each at its own
# fastest candidate), and every variant swept over configs.
AT_OUR_BEST = ("qkv_gemm_rotation_compiled_out",)
OURS_SWEPT = ("qkv_rope_linear", "qkv_rope_linear_angles")
CUTE = ("qkv_rope_linear_cute", "qkv_cute_rotation_compiled_out")  # the second at the first's best
SWEPT = OURS_SWEPT + ("qkv_rope_linear_cute", "quack_gemm", "quack_gemm_rope")
TOKENS = (5476, 21904, 43808, 87616)  # 1, 4, 8, 16 images of 1024 x 1024 (74 x 74 patches)
ERROR_FLOOR = 1e-6  # of the reference's largest magnitude, added to the tolerance


def image_grids(tokens: int, side: int = 74) -> list[tuple[int, int, int]]:
    """Images of side x side patches, then the remainder as an image of whole rows of
    ``side`` patches and one of its last partial row, totalling ``tokens`` (every grid
    within Kimi's 512-patch table, whatever the count)."""
    full, rest = divmod(tokens, side * side)
    rows, last = divmod(rest, side)
    return ([(1, side, side)] * full + ([(1, rows, side)] if rows else [])
            + ([(1, 1, last)] if last else []))


def gemm_flops(tokens: int, hidden: int, heads: int, head_dim: int) -> int:
    return 2 * tokens * hidden * 3 * heads * head_dim


def make_args(tokens: int, hidden: int, heads: int, head_dim: int, device, *, seed: int,
              dtype=torch.bfloat16) -> dict:
    """x, W, b (random, never zeros), freqs_cis, its cos/sin views, the patch
    coordinates and Kimi's frequencies; ``permuted`` and ``quack`` are filled in
    (outside any timing) by the variants that need them."""
    gen = torch.Generator(device=device).manual_seed(seed)
    grids = image_grids(tokens)
    x, w, b, freqs_cis = draw_qkv_problem(gen, grids, hidden, heads, head_dim, dtype)
    return {
        "x": x,
        "w": w,
        "b": b,
        "freqs_cis": freqs_cis,
        "cos_sin": cos_sin_views(freqs_cis),
        "coords": vision_patch_coords(grids, device=device),
        "freqs": vision_rope_frequencies(head_dim, device=device),
        "permuted": {},
    }


def linear_then_fused_rope(x, w, b, cos, sin, heads, head_dim):
    """cuBLAS (F.linear), then the fused RoPE kernel in place on q and k of the packed view."""
    qkv = F.linear(x, w, b).view(x.shape[0], 3, heads, head_dim)
    fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, inplace=True)
    return qkv


def _linear_then_rope(x, w, b, cos, sin, heads, head_dim):
    qkv = F.linear(x, w, b).view(x.shape[0], 3, heads, head_dim)
    q, k = rope_cos_sin(qkv[:, 0], qkv[:, 1], cos, sin)
    return q, k, qkv[:, 2]


def _permuted(a: dict, config: QKVGemmConfig, heads: int, head_dim: int):
    """The arg set's weight in ``config``'s layout, built once (as a model would at load)."""
    layout = (config.block_n, config.heads_per_tile, config.flat_pairs)
    if layout not in a["permuted"]:
        a["permuted"][layout] = permute_qkv_weight(a["w"], a["b"], heads, head_dim,
                                                   block_n=layout[0], heads_per_tile=layout[1],
                                                   flat=layout[2])
    return a["permuted"][layout]


def ours(name: str, config: QKVGemmConfig, heads: int, head_dim: int):
    """fn(args) of one of our variants at ``config``, weight permuted beforehand."""
    def call(a):
        p = _permuted(a, config, heads, head_dim)
        if name == "qkv_rope_linear_angles":
            return qkv_rope_linear_angles(a["x"], a["w"], a["b"], a["coords"], a["freqs"],
                                          config=config, permuted=p)
        fn = qkv_rope_linear if name == "qkv_rope_linear" else qkv_linear_rotation_compiled_out
        return fn(a["x"], a["w"], a["b"], *a["cos_sin"], config=config, permuted=p)
    return call


def quack_call(name: str, config: str, heads: int, head_dim: int):
    """fn(args) of a QuACK variant at one of its configs (operands built beforehand)."""
    def call(a):
        if name == "quack_gemm":  # (T, 3HD) -> the packed (T, 3, H, D) every variant returns
            out = quack.quack_gemm(a["x"], a["w"], a["b"], config=config)
            return out.view(a["x"].shape[0], 3, heads, head_dim)
        if "quack" not in a:
            a["quack"] = quack.kimi_mrope_operands(heads, head_dim, a["coords"], a["freqs"],
                                                   a["b"])
        return quack.quack_gemm_rope(a["x"], a["w"], a["b"], heads, a["quack"], config=config)
    return call


def cute_call(name: str, config, heads: int, head_dim: int):
    """fn(args) of our CuTe DSL kernel (``qkv_cute``) at ``config`` (a ``CuteQKVConfig``;
    ``qkv_cute_rotation_compiled_out``: the same config with the rotation compiled out);
    its per-pair table built once per arg set, outside any timing."""
    from dataclasses import replace

    if name == "qkv_cute_rotation_compiled_out":
        config = replace(config, rotate=False)

    def call(a):
        if "cute_table" not in a:
            a["cute_table"] = qkv_cute.rope_pair_table(heads, head_dim, a["freqs"], a["b"])
        return qkv_cute.qkv_rope_linear_cute(a["x"], a["w"], a["cute_table"], a["coords"],
                                             heads=heads, head_dim=head_dim, config=config)
    return call


# QuACK's plain GEMM at its default config and its RoPE epilogue at its fastest SM90
# config on Kimi's shape (notebook 05's committed run): what the exploration tools
# (tools/qkv_sweep.py, tools/qkv_power.py) time beside ours.
QUACK_BEST = (("quack_gemm", "quack_default"), ("quack_gemm_rope", "128x160_c2x1_pingpong"))


def quack_best_calls(heads: int, head_dim: int) -> tuple[list, str]:
    """([(variant, config, fn(args))] of ``QUACK_BEST``, "") or ([], why QuACK is absent)."""
    ok, why = quack.availability()
    if not ok:
        return [], why
    return [(name, cfg, quack_call(name, cfg, heads, head_dim)) for name, cfg in QUACK_BEST], ""


def candidate_configs(heads: int, head_dim: int, device: torch.device,
                      configs: Sequence[QKVGemmConfig] | None = None) -> list[QKVGemmConfig]:
    """Our configs to sweep: ``configs`` (GPU default ``QKV_CANDIDATE_CONFIGS``), each
    with this shape's N-tile layout; on a CPU the interpreter's small config, whole
    and persistent (the interpreter's time says nothing about a GPU's)."""
    if configs is None:
        if device.type == "cpu":
            small = qkv_gemm_config(heads, head_dim, device)
            return [small, QKVGemmConfig(**{**small.__dict__, "persistent": True})]
        configs = QKV_CANDIDATE_CONFIGS
    unique = []
    for c in configs:
        fitted = with_layout(c, heads, head_dim)
        if fitted not in unique:
            unique.append(fitted)
    return unique


@dataclass(frozen=True)
class QKVBench:
    """``rows``: qkv_gemm.csv (one row per variant x tokens); ``sweep``:
    qkv_gemm_sweep.csv (one row per swept variant x config x tokens)."""

    rows: pd.DataFrame
    sweep: pd.DataFrame


def _error(out, reference, native_error: float, scale: float) -> dict:
    """max |out - reference| (packed (T, 3, H, D) or (q, k, v)) and the verdict."""
    if isinstance(out, torch.Tensor):
        out = out.unbind(1)
    err = max((o.double() - r).abs().max().item() for o, r in zip(out, reference))
    tol = 2 * native_error + ERROR_FLOOR * scale
    return {"max_abs_err": err, "native_max_abs_err": native_error, "error_tolerance": tol,
            "matches_float64": bool(err <= tol)}


def references(a: dict, heads: int, head_dim: int):
    """(rotated, unrotated) float64 references as (q, k, v), the native path's error
    against each, and the references' largest magnitude."""
    tokens = a["x"].shape[0]
    lin64 = (a["x"].double() @ a["w"].double().T + a["b"].double()).view(tokens, 3, heads,
                                                                          head_dim)
    q64, k64 = rope_reference(lin64[:, 0], lin64[:, 1], a["freqs_cis"])
    rotated, unrotated = (q64, k64, lin64[:, 2]), tuple(lin64.unbind(1))
    lin = F.linear(a["x"], a["w"], a["b"]).view(tokens, 3, heads, head_dim)
    nq, nk = native_rope(lin[:, 0], lin[:, 1], a["freqs_cis"])
    native_rot = max((o.double() - r).abs().max().item()
                     for o, r in zip((nq, nk, lin[:, 2]), rotated))
    native_lin = max((o.double() - r).abs().max().item() for o, r in zip(lin.unbind(1), unrotated))
    scale = max(r.abs().max().item() for r in rotated)
    return (rotated, native_rot), (unrotated, native_lin), scale


def measure_variant(name: str, fn, arg_sets: Sequence[dict], refs: tuple, *,
                    mode: str = "cudagraph", samples: int = 30):
    """(timing or None, note, correctness columns, seconds spent) of ``fn`` over the
    arg sets: one call checked against ``refs`` ((rotated, unrotated, scale) from
    ``references``; unrotated variants,
    ``UNROTATED``, against x W^T + b), then timed by ``timing.time_fn``. A failure
    is returned as the note ("failed: ..."), never raised."""
    device = arg_sets[0]["x"].device
    try:
        start = time.perf_counter()
        out = fn(arg_sets[0])  # compiles, autotunes
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        note = (f"compiled in {time.perf_counter() - start:.0f} s"
                if name == "compile_max_autotune" else "")
        (reference, native), scale = refs[name in UNROTATED], refs[2]
        checked = _error(out, reference, native, scale)
        del out
        timing = time_fn(fn, [(a,) for a in arg_sets], mode=mode, samples=samples)
        return timing, note, checked, time.perf_counter() - start
    except Exception as e:  # recorded, not raised: a variant failing is a result
        return None, f"failed: {type(e).__name__}: {str(e)[:200]}", {}, 0.0


def run_qkv_bench(
    tokens: Sequence[int] = TOKENS,
    *,
    device="cuda",
    hidden: int = 1152,
    heads: int = 16,
    head_dim: int = 72,
    mode: str = "cudagraph",
    samples: int = 30,
    variants: Sequence[str] = QKV_VARIANTS,
    configs: Sequence[QKVGemmConfig] | None = None,
    quack_configs: Sequence[str] = tuple(quack.QUACK_CONFIGS),
    compile_budget_s: float = 300.0,
    progress: bool = True,
) -> QKVBench:
    """Time (and check against float64) every variant at every token count.

    Swept variants run every config; the main row of each is its fastest. Our
    rotation-compiled-out variant runs at the config of the faster of our swept
    kernels (so one of them must be among ``variants``). ``compile_max_autotune``
    compiles once per token count (static shapes); once compiling has taken
    ``compile_budget_s`` seconds in total, later token counts record it as
    skipped. A variant that fails, or a peer that is absent, is a row whose
    ``note`` says why, never hidden."""
    unknown = sorted(set(variants) - set(QKV_VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {QKV_VARIANTS}")
    if "qkv_cute_rotation_compiled_out" in variants and "qkv_rope_linear_cute" not in variants:
        raise ValueError("qkv_cute_rotation_compiled_out runs at qkv_rope_linear_cute's best "
                         "config: include qkv_rope_linear_cute in variants")
    if set(AT_OUR_BEST) & set(variants) and not set(OURS_SWEPT) & set(variants):
        raise ValueError(f"{sorted(set(AT_OUR_BEST) & set(variants))} run at the best config of "
                         f"our kernels: include one of {OURS_SWEPT} in variants")
    bad = sorted(set(quack_configs) - set(quack.QUACK_CONFIGS))
    if bad:
        raise ValueError(f"unknown QuACK configs {bad}; choose from {sorted(quack.QUACK_CONFIGS)}")
    device = torch.device(device)
    ours_configs = candidate_configs(heads, head_dim, device, configs)
    quack_ok, quack_why = (quack.availability() if {"quack_gemm", "quack_gemm_rope"} & set(variants)
                           else (False, ""))
    # QuACK's rows name its package, version and source hash, as every peer row does
    quack_columns = dict(zip(("peer_package", "peer_version", "peer_sha256"),
                             (quack.PACKAGE, *quack.source()))) if quack_ok else {}
    cute_ok, cute_why = (qkv_cute.availability(device) if set(CUTE) & set(variants)
                         else (False, ""))
    # our CuTe kernel runs on the installed CuTe DSL: its rows name the version
    cute_note = f"CuTe DSL: nvidia-cutlass-dsl {qkv_cute.cutlass_dsl_version()}" if cute_ok else ""
    rows, sweep_rows, compile_spent = [], [], 0.0
    compiled = None
    if "compile_max_autotune" in variants:
        compiled = torch.compile(_linear_then_rope, mode="max-autotune-no-cudagraphs",
                                 dynamic=False, fullgraph=True)
    shape = {"hidden": hidden, "heads": heads, "head_dim": head_dim, "dtype": "bfloat16",
             "mode": mode}

    def measure(name, fn, arg_sets, refs):
        return measure_variant(name, fn, arg_sets, refs, mode=mode, samples=samples)

    def row_of(name, t, config, timing, note, checked):
        if name in CUTE and cute_note and not note:
            note = cute_note
        row = {"variant": name, "tokens": t, **shape, "config": config,
               "flops": gemm_flops(t, hidden, heads, head_dim), "note": note,
               "reference": "x W^T + b" if name in UNROTATED else "rope(x W^T + b)", **checked,
               **(quack_columns if name.startswith("quack") else {})}
        if timing is not None:
            row.update(timer=timing.timer, median_us=timing.median_us, p20_us=timing.p20_us,
                       p80_us=timing.p80_us, samples=timing.samples,
                       tflops=row["flops"] / (timing.median_us * 1e-6) / 1e12)
        if progress:
            shown = f"{timing.median_us:9.1f} us" if timing else note
            print(f"qkv_gemm T={t:6d} {name:30s} {config:28s} {shown}", flush=True)
        return row

    for t in tokens:
        arg_sets = [make_args(t, hidden, heads, head_dim, device, seed=s) for s in range(2)]
        rotated, unrotated, scale = references(arg_sets[0], heads, head_dim)
        refs = (rotated, unrotated, scale)  # refs[True] = unrotated
        best_ours = best_cute = None
        for name in variants:
            if name in CUTE and not cute_ok:
                rows.append(row_of(name, t, "", None, f"absent: {cute_why}", {}))
                continue
            if name in SWEPT:
                if name.startswith("quack") and not quack_ok:
                    rows.append(row_of(name, t, "", None, f"absent: {quack_why}", {}))
                    continue
                candidates = ([(c.label, ours(name, c, heads, head_dim), c) for c in ours_configs]
                              if name in OURS_SWEPT else
                              [(c.label, cute_call(name, c, heads, head_dim), c)
                               for c in qkv_cute.CUTE_CONFIGS]
                              if name in CUTE else
                              [(quack.gemm_config(c, device)[1], quack_call(name, c, heads,
                                                                             head_dim), c)
                               for c in quack_configs])
                best = None
                for label, fn, config in candidates:
                    timing, note, checked, _ = measure(name, fn, arg_sets, refs)
                    sweep_rows.append(row_of(name, t, label, timing, note, checked))
                    if timing is not None and (best is None or timing.median_us < best[1].median_us):
                        best = (label, timing, note, checked, config)
                if best is None:
                    rows.append(row_of(name, t, "", None, "failed at every config (see sweep)", {}))
                    continue
                rows.append(row_of(name, t, best[0], best[1], best[2], best[3]))
                if name in OURS_SWEPT and (best_ours is None
                                           or best[1].median_us < best_ours[1]):
                    best_ours = (best[4], best[1].median_us)
                if name in CUTE:
                    best_cute = best[4]
            elif name == "qkv_cute_rotation_compiled_out":
                if best_cute is None:
                    rows.append(row_of(name, t, "", None, "qkv_rope_linear_cute did not run", {}))
                    continue
                timing, note, checked, _ = measure(name, cute_call(name, best_cute, heads,
                                                                   head_dim), arg_sets, refs)
                rows.append(row_of(name, t, best_cute.label, timing, note, checked))
            elif name in AT_OUR_BEST:
                if best_ours is None:
                    rows.append(row_of(name, t, "", None, "no config of our kernels ran", {}))
                    continue
                timing, note, checked, _ = measure(name, ours(name, best_ours[0], heads,
                                                              head_dim), arg_sets, refs)
                rows.append(row_of(name, t, best_ours[0].label, timing, note, checked))
            else:
                if name == "compile_max_autotune" and compile_spent > compile_budget_s:
                    rows.append(row_of(name, t, "", None,
                                       f"skipped: compile budget of {compile_budget_s:.0f} s spent",
                                       {}))
                    continue
                fn = {
                    "cublas_linear": lambda a: F.linear(a["x"], a["w"], a["b"]).view(
                        a["x"].shape[0], 3, heads, head_dim),
                    "cublas_linear+fused_rope": lambda a: linear_then_fused_rope(
                        a["x"], a["w"], a["b"], *a["cos_sin"], heads, head_dim),
                    "compile_max_autotune": lambda a: compiled(
                        a["x"], a["w"], a["b"], *a["cos_sin"], heads, head_dim),
                }[name]
                timing, note, checked, spent = measure(name, fn, arg_sets, refs)
                if name == "compile_max_autotune":
                    compile_spent += spent
                rows.append(row_of(name, t, "", timing, note, checked))
        del arg_sets, rotated, unrotated, refs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return QKVBench(_frame(rows, rows), _frame(sweep_rows, rows))


# Column order of both tables. Columns a failed or absent row leaves empty are
# floats or text in every run (never int or bool), so re-runs upsert cleanly.
COLUMNS = ("variant", "tokens", "hidden", "heads", "head_dim", "dtype", "mode", "config",
           "timer", "median_us", "p20_us", "p80_us", "samples", "flops", "tflops",
           "ratio_to_cublas", "ratio_to_cublas_fused_rope", "reference", "max_abs_err",
           "native_max_abs_err", "error_tolerance", "matches_float64", "note",
           "peer_package", "peer_version", "peer_sha256")
FLOAT_COLUMNS = ("median_us", "p20_us", "p80_us", "samples", "tflops", "max_abs_err",
                 "native_max_abs_err", "error_tolerance")


def _frame(rows: list[dict], main_rows: list[dict]) -> pd.DataFrame:
    """Rows as a table with the ratios to the main table's baselines and provenance."""
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if not c.startswith("ratio_")])
    for col in FLOAT_COLUMNS:
        df[col] = df[col].astype(float)
    df["timer"] = df["timer"].fillna("").astype(object)
    df["matches_float64"] = df["matches_float64"].map(
        lambda v: "" if v is None or v != v else str(bool(v))).astype(object)
    main = pd.DataFrame(main_rows, columns=["variant", "tokens", "median_us"])
    for base_name, col in (("cublas_linear", "ratio_to_cublas"),
                           ("cublas_linear+fused_rope", "ratio_to_cublas_fused_rope")):
        base = main[main.variant == base_name].set_index("tokens")["median_us"].astype(float)
        df[col] = df["median_us"] / df["tokens"].map(base).astype(float)
    df = df[list(COLUMNS)]
    for k, v in provenance().items():
        df[k] = v
    return df


def peak_bf16_tflops(device="cuda", n: int = 8192, samples: int = 10) -> float:
    """The compute ceiling: a large square bf16 cuBLAS matmul, TFLOP/s."""
    a = torch.randn(n, n, device=device).bfloat16()
    b = torch.randn(n, n, device=device).bfloat16()
    t = time_fn(torch.matmul, [(a, b)], mode="cudagraph", samples=samples)
    return 2 * n**3 / (t.median_us * 1e-6) / 1e12


def roofline(df: pd.DataFrame, peak_tflops: float, hbm_gbps: float | None = None) -> pd.DataFrame:
    """Rows for a compute-bound roofline plot: each timed row's arithmetic intensity
    (flops over the GEMM's minimal bytes: x, W, b read once, qkv written once),
    achieved TFLOP/s, the ceiling at that intensity and the fraction of it reached.
    ``hbm_gbps`` (e.g. the copy ceiling) adds the memory roof; None: compute only."""
    timed = df.dropna(subset=["median_us"]).copy()
    out_features = 3 * timed["heads"] * timed["head_dim"]
    nbytes = 2 * (timed["tokens"] * timed["hidden"] + out_features * timed["hidden"]
                  + out_features + timed["tokens"] * out_features)
    timed["bytes"] = nbytes
    timed["intensity"] = timed["flops"] / nbytes
    ceiling = pd.Series(peak_tflops, index=timed.index, dtype=float)
    if hbm_gbps is not None:
        ceiling = ceiling.clip(upper=timed["intensity"] * hbm_gbps / 1e3)
    timed["ceiling_tflops"] = ceiling
    timed["fraction_of_ceiling"] = timed["tflops"] / ceiling
    timed["peak_tflops"] = peak_tflops
    return timed[["variant", "tokens", "config", "intensity", "tflops", "ceiling_tflops",
                  "fraction_of_ceiling", "peak_tflops", "median_us"]]
