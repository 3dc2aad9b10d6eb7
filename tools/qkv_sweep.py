"""GPU exploration of the QKV GEMM's configs (estimated 1-2 min on an H200, mostly compiling).

    python tools/qkv_sweep.py            # QKV_SWEEP_CONFIGS at 21,904 / 43,808 / 87,616 tokens
    python tools/qkv_sweep.py --quick    # QKV_CANDIDATE_CONFIGS (notebook 05's) at 87,616 only
    python tools/qkv_sweep.py --configs 0,2,5   # a subset of QKV_SWEEP_CONFIGS by index

Compiling dominates (two kernels per config, a few seconds each; the token count
is not specialized on, so more token counts cost little).

Kimi's projection (1152 -> 3 x 16 x 72, bf16), cold L2, CUDA graphs, timed by the
project's own ``qkv_bench.measure_variant`` (``timing.time_fn``): cuBLAS
(``F.linear``), cuBLAS + our fused RoPE in place, and every config of
``QKV_SWEEP_CONFIGS`` (``rope_kernels/bench/qkv_configs.py``) through ``qkv_rope`` as
``qkv_rope_linear`` (rotation in the epilogue, cos/sin from the table), as
``qkv_rope_linear_angles`` (angles computed in-kernel) and as
``qkv_gemm_rotation_compiled_out`` (same kernel and config, ``epilogue="none"``: the
mainloop's share). Every call's output is checked against float64 once
(``matches_float64``); a config that fails prints one line and the sweep goes on.
Prints a table (config, us, ratio to cuBLAS, ratio to cuBLAS + fused RoPE) and, where
``$OUT`` is set (or ``--csv`` given), writes every row to ``qkv_sweep.csv`` there, with
provenance (set ROPE_STUDY_COMMIT on a node whose copy of the tree has no or other git
metadata: the H200's copy recorded a stale HEAD, marked -dirty).
Exploration only: the study's rows come from notebook 05_qkv_gemm, each kernel at its
default; a default chosen from a sweep cites the sweep's committed rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

TOKENS = (21904, 43808, 87616)  # 4, 8 and 16 images of 1024 x 1024
QUICK_TOKENS = (87616,)
HIDDEN, HEADS, HEAD_DIM = 1152, 16, 72


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"only QKV_CANDIDATE_CONFIGS, only {QUICK_TOKENS} tokens")
    p.add_argument("--tokens", type=int, nargs="+", help="token counts (overrides --quick)")
    p.add_argument("--configs", help="comma-separated indices into QKV_SWEEP_CONFIGS")
    p.add_argument("--quack", action="store_true",
                   help="QuACK's plain GEMM and its RoPE epilogue (its best SM90 config) too")
    p.add_argument("--cute", help="our CuTe DSL kernel (qkv_cute) at these configs, "
                   "comma-separated CuteQKVConfig.parse specs (e.g. 192x2,160x1/e32/m)")
    p.add_argument("--samples", type=int, default=10, help="timed CUDA-graph replays per row")
    p.add_argument("--csv", type=Path, help="where to write the rows (default $OUT/qkv_sweep.csv)")
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error(f"--samples must be >= 1, got {args.samples}")
    if args.tokens and min(args.tokens) < 1:
        p.error(f"--tokens must be positive, got {args.tokens}")
    return args


def pick_configs(spec: str | None, configs: tuple) -> list:
    """``configs`` or the entries at the comma-separated indices of ``spec``."""
    if not spec:
        return list(configs)
    try:
        idx = [int(i) for i in spec.split(",")]
    except ValueError:
        raise ValueError(f"--configs must be comma-separated ints, got {spec!r}") from None
    bad = [i for i in idx if not 0 <= i < len(configs)]
    if bad:
        raise ValueError(f"--configs indices {bad} out of range 0..{len(configs) - 1}")
    return [configs[i] for i in idx]


BASELINES = ("cublas_linear", "cublas_linear+fused_rope")


def run_sweep(tokens, configs, *, device, hidden: int = HIDDEN, heads: int = HEADS,
              head_dim: int = HEAD_DIM, samples: int = 10, mode: str = "cudagraph", log=print,
              on_row=None, extra=()):
    """One row per (tokens, variant, config): the baselines, then each config with the
    rotation and with it compiled out, each checked against float64 once and timed
    (``qkv_bench.measure_variant``). A failing or wrong config is logged in one line
    and kept as a row (``note`` / ``matches_float64``); the sweep goes on.
    ``on_row(row)`` sees each row as it is measured (progress, partial results);
    ``extra``: more (variant, config label, fn(args)) to time after the baselines."""
    import pandas as pd
    import torch

    from rope_kernels.bench import qkv_bench as qb

    rows = []
    for t in tokens:
        arg_sets = [qb.make_args(t, hidden, heads, head_dim, device, seed=s) for s in range(2)]
        refs = qb.references(arg_sets[0], heads, head_dim)
        base = {}
        runs = [("cublas_linear", "", lambda a: torch.nn.functional.linear(
                     a["x"], a["w"], a["b"]).view(a["x"].shape[0], 3, heads, head_dim)),
                ("cublas_linear+fused_rope", "", lambda a: qb.linear_then_fused_rope(
                     a["x"], a["w"], a["b"], *a["cos_sin"], heads, head_dim))]
        runs += list(extra)
        for c in configs:
            for name in ("qkv_rope_linear", "qkv_rope_linear_angles",
                         "qkv_gemm_rotation_compiled_out"):
                runs.append((name, c.label, qb.variant_call(name, heads, head_dim, config=c)))
        for name, label, fn in runs:
            timing, note, checked, spent = qb.measure_variant(name, fn, arg_sets, refs,
                                                              mode=mode, samples=samples)
            us = timing.median_us if timing is not None else float("nan")
            if name in BASELINES:
                base[name] = us
            rows.append({
                "tokens": t, "variant": name, "config": label, "median_us": us,
                "p20_us": timing.p20_us if timing is not None else float("nan"),
                "p80_us": timing.p80_us if timing is not None else float("nan"),
                "ratio_to_cublas": us / base.get("cublas_linear", float("nan")),
                "ratio_to_cublas_fused_rope": us / base.get("cublas_linear+fused_rope",
                                                            float("nan")),
                "matches_float64": checked.get("matches_float64", ""),
                "max_abs_err": checked.get("max_abs_err", float("nan")),
                "error_tolerance": checked.get("error_tolerance", float("nan")),
                "seconds": spent, "note": note})
            if on_row is not None:
                on_row(rows[-1])
            if timing is None:
                log(f"T={t} {name} {label}: {note}")
            elif not checked["matches_float64"]:
                log(f"T={t} {name} {label}: WRONG against float64 (error "
                    f"{checked['max_abs_err']:.3g} > tolerance {checked['error_tolerance']:.3g})")
        del arg_sets, refs
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def format_tables(df) -> str:
    """Per token count: every row, fastest first within each variant; then the best
    ``qkv_rope_linear`` config per token count."""
    parts = []
    cols = ["variant", "config", "median_us", "ratio_to_cublas", "ratio_to_cublas_fused_rope",
            "matches_float64"]
    for t, grp in df.groupby("tokens", sort=False):
        shown = grp.assign(variant=grp.variant.replace(
            "qkv_gemm_rotation_compiled_out", "(rotation compiled out)"))
        parts.append(f"== {t} tokens ==\n" + shown[cols].sort_values(
            ["variant", "median_us"]).round(3).to_string(index=False))
    ours = df[(df.variant == "qkv_rope_linear") & (df.matches_float64 == True)]  # noqa: E712
    best = ours.dropna(subset=["median_us"]).sort_values("median_us").groupby("tokens").head(1)
    parts.append("best qkv_rope_linear (matching float64) per token count:\n"
                 + (best[["tokens", "config", "median_us", "ratio_to_cublas",
                          "ratio_to_cublas_fused_rope"]].sort_values("tokens").round(3)
                    .to_string(index=False) if len(best) else "none"))
    return "\n\n".join(parts)


def main(argv=None) -> int:
    args = parse_args(argv)
    import pandas as pd
    import torch

    from rope_kernels.atomic_io import write_atomic
    from rope_kernels.bench.qkv_configs import QKV_CANDIDATE_CONFIGS, QKV_SWEEP_CONFIGS

    if not torch.cuda.is_available():
        print("qkv_sweep: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        configs = pick_configs(args.configs, QKV_CANDIDATE_CONFIGS if args.quick and
                               not args.configs else QKV_SWEEP_CONFIGS)
    except ValueError as e:
        print(f"qkv_sweep: {e}", file=sys.stderr)
        return 2
    extra = []
    from rope_kernels.bench import qkv_bench as qb
    if args.quack:
        calls, why = qb.quack_best_calls(HEADS, HEAD_DIM)
        if why:
            print(f"qkv_sweep: QuACK not available: {why}", file=sys.stderr)
            return 2
        extra += calls
    if args.cute:
        from rope_kernels.kernels.qkv_cute import CuteQKVConfig
        try:
            cute_cfgs = [CuteQKVConfig.parse(spec) for spec in args.cute.split(",")]
        except (ValueError, TypeError) as e:
            print(f"qkv_sweep: --cute {args.cute!r}: {e}", file=sys.stderr)
            return 2
        for c in cute_cfgs:
            label = f"cute {c.label}"
            for name in ("qkv_rope_linear_cute", "qkv_cute_rotation_compiled_out"):
                extra.append((name, label, qb.variant_call(name, HEADS, HEAD_DIM, config=c)))
    tokens = args.tokens or (QUICK_TOKENS if args.quick else TOKENS)
    print(f"{torch.cuda.get_device_name()}; {len(configs)} configs x 2 kernels x "
          f"{len(tokens)} token counts; samples={args.samples}", flush=True)
    start = time.perf_counter()

    def progress(row):
        print(f"  T={row['tokens']:6d} {row['variant']:30s} {row['config']:36s} "
              f"{row['median_us']:8.1f} us  x{row['ratio_to_cublas']:.3f} cuBLAS  "
              f"({row['seconds']:.0f} s)", flush=True)

    df = run_sweep(tokens, configs, device=torch.device("cuda"), samples=args.samples,
                   log=lambda line: print(line, flush=True), on_row=progress, extra=extra)
    pd.set_option("display.width", 250)
    print("\n" + format_tables(df))
    print(f"\nsweep took {time.perf_counter() - start:.0f} s", flush=True)
    csv = args.csv or (Path(os.environ["OUT"]) / "qkv_sweep.csv" if os.environ.get("OUT") else None)
    if csv is not None:
        from rope_kernels.provenance import provenance

        for k, v in provenance().items():
            df[k] = v
        write_atomic(csv, df.to_csv(index=False))
        print(f"rows -> {csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
