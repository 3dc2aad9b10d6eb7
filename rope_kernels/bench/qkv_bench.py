"""The QKV projection microbenchmark: is RoPE free inside the GEMM's epilogue?

Kimi-K2.5's projection, 1152 -> 3456 (16 heads x 72) in bf16, at 5,476 to
87,616 tokens (1 to 16 images of 1024 x 1024), these ways (``QKV_VARIANTS``):

- ``cublas_linear``: ``F.linear`` alone, the floor (no RoPE at all);
- ``cublas_linear+fused_rope``: ``F.linear`` then the fused RoPE kernel in place
  on the packed view, as the encoder does today;
- ``compile_max_autotune``: ``torch.compile(mode="max-autotune-no-cudagraphs")``
  of ``rope(linear(x))`` (the cudagraph-trees mode cannot be captured inside our
  CUDA-graph timer); can Inductor fuse the rotation into its GEMM?
- through ``qkv.qkv_rope`` (``VARIANT_BACKENDS``), each at one fixed, named config (the
  backend's default, ``config`` in the row): ``qkv_rope_linear`` (our Triton kernel, cos/sin
  table), ``qkv_rope_linear_angles`` (angles in-kernel), ``qkv_gemm_rotation_compiled_out``
  (the angles path's kernel and config with ``epilogue="none"``: q/k NOT rotated, the
  mainloop's share), ``qkv_rope_linear_cute`` and ``qkv_cute_rotation_compiled_out`` (our
  CuTe DSL kernel; sm_90 GPUs with nvidia-cutlass-dsl only), ``quack_gemm`` and
  ``quack_gemm_rope`` (QuACK's GEMM with a bias epilogue and with Kimi's RoPE in it,
  where QuACK runs). A backend that does not run here is a row saying why.

Timing: per token count, ``input_sets`` input sets (x, W, b each), as many as cover twice
the L2 with what one call reads (``timing.cold_set_count``), every call reading the next
set; every variant timed in ``rounds`` rounds of seeded shuffled order
(``timing.time_rounds``: the rows record each one's positions and the seed), CUDA-graph
replays, median/p20/p80 over the pooled samples. Configs are not picked from these
samples: exploring them is ``tools/qkv_sweep.py``'s (``bench/qkv_configs.py``), and the
defaults cite the committed sweep they rest on. Every row: TFLOP/s (2 * T * 1152 * 3456
flops), the ratio to ``cublas_linear`` and to ``cublas_linear+fused_rope`` at the same token
count, and its correctness against float64 on the first input set: ``max_abs_err`` next to
``native_max_abs_err`` (cuBLAS linear in bf16 then Kimi's native RoPE against the same
reference), ``error_tolerance`` (twice that, plus a floor) and ``matches_float64``.
Unrotated variants are judged against ``x W^T + b`` (column ``reference``). ``roofline``
returns what a compute-bound roofline plot needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from rope_kernels.bench.timing import cold_set_count, sample_fn, time_fn, time_rounds
from rope_kernels.correctness import draw_qkv_problem
from rope_kernels.kernels import qkv_cute
from rope_kernels.kernels.freqs import vision_patch_coords
from rope_kernels.kernels.fused import fused_qk_rope
from rope_kernels.kernels.qkv_gemm import qkv_gemm_config
from rope_kernels.kernels.reference import cos_sin_views, native_rope, rope_cos_sin, rope_reference
from rope_kernels.peers import quack_gemm as quack
from rope_kernels.provenance import provenance
from rope_kernels.qkv import qkv_rope, qkv_rope_operands
from rope_kernels.vocabulary import KIMI_HEAD_DIM, KIMI_HEADS, KIMI_TOKENS

QKV_VARIANTS = ("cublas_linear", "cublas_linear+fused_rope", "compile_max_autotune",
                "qkv_rope_linear", "qkv_rope_linear_angles", "qkv_gemm_rotation_compiled_out",
                "qkv_rope_linear_cute", "qkv_cute_rotation_compiled_out",
                "quack_gemm", "quack_gemm_rope")
# The variants ``qkv_rope`` runs: name -> (backend, epilogue).
VARIANT_BACKENDS = {
    "qkv_rope_linear": ("triton_table", "rope"),
    "qkv_rope_linear_angles": ("triton", "rope"),
    "qkv_gemm_rotation_compiled_out": ("triton", "none"),
    "qkv_rope_linear_cute": ("cute", "rope"),
    "qkv_cute_rotation_compiled_out": ("cute", "none"),
    "quack_gemm": ("quack", "none"),
    "quack_gemm_rope": ("quack", "rope"),
}
# Variants whose output is x W^T + b, q and k not rotated (judged against that).
UNROTATED = ("cublas_linear",) + tuple(n for n, (_, e) in VARIANT_BACKENDS.items() if e == "none")
TOKENS = KIMI_TOKENS[1:]  # 1, 4, 8, 16 images of 1024 x 1024 (74 x 74 patches)
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


def read_bytes(tokens: int, hidden: int, heads: int, head_dim: int, element_size: int = 2) -> int:
    """What one call reads: x, W and b (the input sets must cover twice the L2 with it)."""
    n = 3 * heads * head_dim
    return element_size * (tokens * hidden + n * hidden + n)


def make_args(tokens: int, hidden: int, heads: int, head_dim: int, device, *, seed: int,
              dtype=torch.bfloat16) -> dict:
    """x, W, b (random, never zeros), freqs_cis, its cos/sin views, the patch
    coordinates; ``operands`` (per ``qkv_rope`` backend) are built by ``prepare`` outside
    any timing."""
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
        "operands": {},
    }


def prepare(a: dict, name: str, heads: int, head_dim: int) -> None:
    """Build the ``qkv_rope`` operands variant ``name`` reads from arg set ``a`` (once per
    forward in a model; here once per arg set, before timing)."""
    if name not in VARIANT_BACKENDS:
        return
    backend = VARIANT_BACKENDS[name][0]
    if backend not in a["operands"]:
        a["operands"][backend] = qkv_rope_operands(
            a["coords"], heads=heads, head_dim=head_dim, backend=backend,
            freqs_cis=a["freqs_cis"] if backend == "triton_table" else None)


def variant_call(name: str, heads: int, head_dim: int, config=None):
    """fn(args) of a ``VARIANT_BACKENDS`` variant through ``qkv_rope`` at ``config`` (None:
    the backend's default)."""
    backend, epilogue = VARIANT_BACKENDS[name]

    def call(a):
        prepare(a, name, heads, head_dim)
        return qkv_rope(a["x"], a["w"], a["b"], a["operands"][backend], heads=heads,
                        head_dim=head_dim, backend=backend, epilogue=epilogue, config=config)
    return call


def config_label(name: str, heads: int, head_dim: int, device, config=None) -> str:
    """The name of the config variant ``name`` runs at (its backend's default for None)."""
    backend = VARIANT_BACKENDS[name][0]
    if backend == "quack":
        default = quack.DEFAULT_ROPE_CONFIG if name == "quack_gemm_rope" else \
            quack.DEFAULT_PLAIN_CONFIG
        return quack.gemm_config(config or default, device)[1]
    if backend == "cute":
        return (config or qkv_cute.CuteQKVConfig()).label
    return (config or qkv_gemm_config(heads, head_dim, torch.device(device),
                                      angles=backend == "triton")).label


def linear_then_fused_rope(x, w, b, cos, sin, heads, head_dim):
    """cuBLAS (F.linear), then the fused RoPE kernel in place on q and k of the packed view."""
    qkv = F.linear(x, w, b).view(x.shape[0], 3, heads, head_dim)
    fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, inplace=True)
    return qkv


def _linear_then_rope(x, w, b, cos, sin, heads, head_dim):
    qkv = F.linear(x, w, b).view(x.shape[0], 3, heads, head_dim)
    q, k = rope_cos_sin(qkv[:, 0], qkv[:, 1], cos, sin)
    return q, k, qkv[:, 2]


def quack_best_calls(heads: int, head_dim: int) -> tuple[list, str]:
    """([(variant, config label, fn(args))] of QuACK's two variants at their defaults, "")
    or ([], why QuACK is absent): what the exploration tools time beside ours."""
    ok, why = quack.availability()
    if not ok:
        return [], why
    return [(name, config_label(name, heads, head_dim, "cuda"), variant_call(name, heads, head_dim))
            for name in ("quack_gemm", "quack_gemm_rope")], ""


@dataclass(frozen=True)
class QKVBench:
    """``rows``: qkv_gemm.csv (one row per variant x tokens)."""

    rows: pd.DataFrame


def _error(out, reference, native_error: float, scale: float) -> dict:
    """max |out - reference| (packed (T, 3, H, D) or (q, k, v)) and the verdict."""
    if isinstance(out, torch.Tensor):
        out = out.unbind(1)
    err = max((o.double() - r).abs().max().item() for o, r in zip(out, reference))
    tol = 2 * native_error + ERROR_FLOOR * scale
    return {"max_abs_err": err, "native_max_abs_err": native_error, "error_tolerance": tol,
            "matches_float64": bool(err <= tol)}


def references(a: dict, heads: int, head_dim: int, rotation: str = "pairs"):
    """(rotated, unrotated) float64 references as (q, k, v), the native path's error
    against each, and the references' largest magnitude; q and k rotated in ``rotation``
    (the native path: Kimi's, or Qwen's rotate-half)."""
    tokens = a["x"].shape[0]
    lin64 = (a["x"].double() @ a["w"].double().T + a["b"].double()).view(tokens, 3, heads,
                                                                          head_dim)
    q64, k64 = rope_reference(lin64[:, 0], lin64[:, 1], a["freqs_cis"], rotation)
    rotated, unrotated = (q64, k64, lin64[:, 2]), tuple(lin64.unbind(1))
    lin = F.linear(a["x"], a["w"], a["b"]).view(tokens, 3, heads, head_dim)
    nq, nk = native_rope(lin[:, 0], lin[:, 1], a["freqs_cis"], rotation)
    native_rot = max((o.double() - r).abs().max().item()
                     for o, r in zip((nq, nk, lin[:, 2]), rotated))
    native_lin = max((o.double() - r).abs().max().item() for o, r in zip(lin.unbind(1), unrotated))
    scale = max(r.abs().max().item() for r in rotated)
    return (rotated, native_rot), (unrotated, native_lin), scale


def _first_call_checked(name: str, fn, args: dict, refs: tuple, start: float) -> tuple[dict, str]:
    """(correctness columns, note) of ``fn``'s first call on ``args`` (it compiles and
    autotunes), checked against ``refs`` (``UNROTATED`` variants against x W^T + b); the
    note is torch.compile's compile time since ``start``."""
    out = fn(args)
    if args["x"].device.type == "cuda":
        torch.cuda.synchronize(args["x"].device)
    note = f"compiled in {time.perf_counter() - start:.0f} s" if name == "compile_max_autotune" else ""
    (reference, native), scale = refs[name in UNROTATED], refs[2]
    return _error(out, reference, native, scale), note


def measure_variant(name: str, fn, arg_sets: Sequence[dict], refs: tuple, *,
                    mode: str = "cudagraph", samples: int = 30):
    """(timing or None, note, correctness columns, seconds spent) of ``fn`` over the
    arg sets: one call checked against ``refs`` ((rotated, unrotated, scale) from
    ``references``; unrotated variants,
    ``UNROTATED``, against x W^T + b), then timed by ``timing.time_fn``. A failure
    is returned as the note ("failed: ..."), never raised."""
    try:
        start = time.perf_counter()
        checked, note = _first_call_checked(name, fn, arg_sets[0], refs, start)
        timing = time_fn(fn, [(a,) for a in arg_sets], mode=mode, samples=samples)
        return timing, note, checked, time.perf_counter() - start
    except Exception as e:  # recorded, not raised: a variant failing is a result
        return None, f"failed: {type(e).__name__}: {str(e)[:200]}", {}, 0.0


def run_qkv_bench(
    tokens: Sequence[int] = TOKENS,
    *,
    device="cuda",
    hidden: int = max(KIMI_HEADS) * KIMI_HEAD_DIM,
    heads: int = max(KIMI_HEADS),
    head_dim: int = KIMI_HEAD_DIM,
    mode: str = "cudagraph",
    samples: int = 30,
    rounds: int = 5,
    seed: int = 0,
    variants: Sequence[str] = QKV_VARIANTS,
    compile_budget_s: float = 300.0,
    progress: bool = True,
) -> QKVBench:
    """Time (and check against float64) every variant at every token count.

    Per token count: the input sets (``read_bytes`` x their count covers twice the L2),
    one checked call per variant (compiles; a variant that raises is a row saying so),
    then every variant that ran in ``rounds`` rounds of seeded shuffled order, each at
    its fixed config. ``compile_max_autotune`` compiles once per token count (static
    shapes); once compiling has taken ``compile_budget_s`` seconds in total, later token
    counts record it as skipped. A variant that fails, or a backend that does not run
    here, is a row whose ``note`` says why, never hidden."""
    unknown = sorted(set(variants) - set(QKV_VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {QKV_VARIANTS}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    device = torch.device(device)
    absent = {}
    if {"quack_gemm", "quack_gemm_rope"} & set(variants):
        ok, why = quack.availability()
        if not ok:
            absent.update({"quack_gemm": why, "quack_gemm_rope": why})
    if {"qkv_rope_linear_cute", "qkv_cute_rotation_compiled_out"} & set(variants):
        ok, why = qkv_cute.availability(device)
        if not ok:
            absent.update({"qkv_rope_linear_cute": why, "qkv_cute_rotation_compiled_out": why})
    # QuACK's rows name its package, version and source hash, as every peer row does
    quack_columns = (dict(zip(("peer_package", "peer_version", "peer_sha256"),
                              (quack.PACKAGE, *quack.source())))
                     if "quack_gemm" in set(variants) - set(absent)
                     or "quack_gemm_rope" in set(variants) - set(absent) else {})
    # our CuTe kernel runs on the installed CuTe DSL: its rows name the version
    cute_note = (f"CuTe DSL: nvidia-cutlass-dsl {qkv_cute.cutlass_dsl_version()}"
                 if "qkv_rope_linear_cute" in set(variants) - set(absent) else "")
    compiled = None
    if "compile_max_autotune" in variants:
        compiled = torch.compile(_linear_then_rope, mode="max-autotune-no-cudagraphs",
                                 dynamic=False, fullgraph=True)
    baselines = {
        "cublas_linear": lambda a: F.linear(a["x"], a["w"], a["b"]).view(
            a["x"].shape[0], 3, heads, head_dim),
        "cublas_linear+fused_rope": lambda a: linear_then_fused_rope(
            a["x"], a["w"], a["b"], *a["cos_sin"], heads, head_dim),
        "compile_max_autotune": lambda a: compiled(
            a["x"], a["w"], a["b"], *a["cos_sin"], heads, head_dim),
    }
    shape = {"hidden": hidden, "heads": heads, "head_dim": head_dim, "dtype": "bfloat16",
             "mode": mode}
    rows, compile_spent = [], 0.0

    def row_of(name, t, config, note, checked, timing=None, timed=None, sets=0):
        if name.startswith("qkv_") and "cute" in name and cute_note and not note:
            note = cute_note
        row = {"variant": name, "tokens": t, **shape, "config": config,
               "flops": gemm_flops(t, hidden, heads, head_dim), "note": note,
               "reference": "x W^T + b" if name in UNROTATED else "rope(x W^T + b)", **checked,
               **(quack_columns if name.startswith("quack") else {})}
        if timing is not None:
            row.update(timer=timing.timer, median_us=timing.median_us, p20_us=timing.p20_us,
                       p80_us=timing.p80_us, samples=timing.samples, input_sets=sets,
                       rounds=len(timed.orders), round_positions=timed.positions(name),
                       order_seed=str(timed.seed),
                       tflops=row["flops"] / (timing.median_us * 1e-6) / 1e12)
        if progress:
            shown = f"{timing.median_us:9.1f} us" if timing else note
            print(f"qkv_gemm T={t:6d} {name:30s} {config:40s} {shown}", flush=True)
        return row

    for t in tokens:
        count = cold_set_count(read_bytes(t, hidden, heads, head_dim), device)
        arg_sets = [make_args(t, hidden, heads, head_dim, device, seed=s) for s in range(count)]
        rotated, unrotated, scale = references(arg_sets[0], heads, head_dim)
        refs = (rotated, unrotated, scale)  # refs[True] = unrotated
        fns, checks, labels, t_rows = {}, {}, {}, {}
        for name in variants:
            if name in absent:
                t_rows[name] = row_of(name, t, "", f"absent: {absent[name]}", {})
                continue
            if name == "compile_max_autotune" and compile_spent > compile_budget_s:
                t_rows[name] = row_of(name, t, "", f"skipped: compile budget of "
                                      f"{compile_budget_s:.0f} s spent", {})
                continue
            labels[name] = (config_label(name, heads, head_dim, device)
                            if name in VARIANT_BACKENDS else "")
            fn = variant_call(name, heads, head_dim) if name in VARIANT_BACKENDS \
                else baselines[name]
            checked, note, spent = check_variant(name, fn, arg_sets, refs, mode=mode)
            if name == "compile_max_autotune":
                compile_spent += spent
            if checked is None:
                t_rows[name] = row_of(name, t, labels[name], note, {})
                continue
            fns[name], checks[name] = (fn, [(a,) for a in arg_sets]), (checked, note)
        if fns:
            timed = time_rounds(fns, mode=mode, calls_per_sample=len(arg_sets), samples=samples,
                                rounds=rounds, seed=f"{seed}/{t}",
                                rewarm=1 if device.type == "cuda" else 0)
            for name in fns:
                checked, note = checks[name]
                t_rows[name] = row_of(name, t, labels[name], note, checked, timed.timings[name],
                                      timed, len(arg_sets))
        rows += [t_rows[name] for name in variants]
        del arg_sets, rotated, unrotated, refs, fns
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return QKVBench(_frame(rows))


def check_variant(name: str, fn, arg_sets: Sequence[dict], refs: tuple, *,
                  mode: str = "cudagraph"):
    """(correctness columns or None, note, seconds): ``fn`` called once on every arg set
    (builds operands, compiles), its first output checked against ``refs`` (``UNROTATED``
    variants against x W^T + b), then one sample in ``mode`` (captures a graph). A failure
    is the note ("failed: ..."), never raised."""
    start = time.perf_counter()
    try:
        checked, note = _first_call_checked(name, fn, arg_sets[0], refs, start)
        for a in arg_sets[1:]:
            fn(a)
        sample_fn(fn, [(a,) for a in arg_sets], mode=mode, samples=1, warmup=0)
        return checked, note, time.perf_counter() - start
    except Exception as e:  # recorded, not raised: a variant failing is a result
        return None, f"failed: {type(e).__name__}: {str(e)[:200]}", time.perf_counter() - start


# Column order of the table. Columns a failed or absent row leaves empty are floats or
# text in every run (never int or bool), so re-runs upsert cleanly.
COLUMNS = ("variant", "tokens", "hidden", "heads", "head_dim", "dtype", "mode", "config",
           "timer", "median_us", "p20_us", "p80_us", "samples", "input_sets", "rounds",
           "round_positions", "order_seed", "flops", "tflops",
           "ratio_to_cublas", "ratio_to_cublas_fused_rope", "reference", "max_abs_err",
           "native_max_abs_err", "error_tolerance", "matches_float64", "note",
           "peer_package", "peer_version", "peer_sha256")
FLOAT_COLUMNS = ("median_us", "p20_us", "p80_us", "samples", "input_sets", "rounds", "tflops",
                 "max_abs_err", "native_max_abs_err", "error_tolerance")


def _frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as a table with the ratios to the baselines at each token count, and provenance."""
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if not c.startswith("ratio_")])
    for col in FLOAT_COLUMNS:
        df[col] = df[col].astype(float)
    for col in ("timer", "round_positions", "order_seed"):
        df[col] = df[col].fillna("").astype(object)
    df["matches_float64"] = df["matches_float64"].map(
        lambda v: "" if v is None or v != v else str(bool(v))).astype(object)
    for base_name, col in (("cublas_linear", "ratio_to_cublas"),
                           ("cublas_linear+fused_rope", "ratio_to_cublas_fused_rope")):
        base = df[df.variant == base_name].set_index("tokens")["median_us"].astype(float)
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
