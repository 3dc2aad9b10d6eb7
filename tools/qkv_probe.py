"""GPU probe for the QKV projection with RoPE in its epilogue (kernels/qkv_gemm.py).

One call: correctness on the GPU (float64 reference at an odd token count, every
path: table/angles x TMA/pointers x persistent or not), then CUDA-graph timings
at 43,808 and 87,616 tokens (1152 -> 3456, bf16) of cuBLAS linear, cuBLAS +
the fused RoPE in place, and a sweep of the kernel's launch configs (table
variant; the best few also with in-kernel angles and with the rotation compiled
out, which separates the epilogue's cost from the GEMM's). Prints a compact
table last; writes qkv_probe.csv under $OUT (or ./qkv_probe_out).

    python tools/qkv_probe.py [--quick] [--configs "BMxBNxBKxHPT/stages/warps/group_m[/np|/ptr]" ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rope_kernels.correctness import _max_abs  # noqa: E402
from rope_kernels.bench.timing import time_fn  # noqa: E402
from rope_kernels.kernels import qkv_gemm  # noqa: E402
from rope_kernels.kernels.freqs import (vision_freqs_cis, vision_patch_coords,  # noqa: E402
                                        vision_rope_frequencies)
from rope_kernels.kernels.fused import fused_qk_rope  # noqa: E402
from rope_kernels.kernels.qkv_gemm import QKVGemmConfig, qkv_rope_linear  # noqa: E402
from rope_kernels.kernels.reference import cos_sin_views, native_rope, rope_reference  # noqa: E402

HIDDEN, HEADS, HEAD_DIM = 1152, 16, 72
SWEEP = [  # block_m x block_n x block_k x heads_per_tile / stages / warps / group_m [/np /ptr]
    "128x128x64x16/3/4/8", "128x128x64x16/4/4/8", "128x128x64x16/4/8/8", "128x128x64x16/5/8/8",
    "128x128x128x16/3/8/8", "256x128x64x16/3/8/8", "128x128x64x16/4/8/1", "256x128x64x16/3/8/1",
    "128x64x64x8/4/4/8", "256x64x64x8/4/8/8", "128x128x64x16/4/8/8/np", "128x128x64x16/4/8/8/ptr",
]


def parse_config(text: str) -> QKVGemmConfig:
    parts = text.split("/")
    bm, bn, bk, hpt = (int(v) for v in parts[0].split("x"))
    flags = parts[4:]
    return QKVGemmConfig(block_m=bm, block_n=bn, block_k=bk, heads_per_tile=hpt,
                         num_stages=int(parts[1]), num_warps=int(parts[2]), group_m=int(parts[3]),
                         persistent="np" not in flags, use_tma=False if "ptr" in flags else None)


def image_grids(tokens: int):
    """Images of 74 x 74 patches (1024^2 px) plus a remainder image to reach ``tokens``."""
    full, rest = divmod(tokens, 74 * 74)
    grids = [(1, 74, 74)] * full
    if rest:
        grids.append((1, 1, rest))
    return grids


def problem(tokens: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(3 * HIDDEN, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).bfloat16()
    b = torch.randn(3 * HIDDEN, device="cuda", generator=gen).bfloat16()
    grids = image_grids(tokens)
    freqs_cis = vision_freqs_cis(grids, HEAD_DIM, device="cuda")
    coords = vision_patch_coords(grids, device="cuda")
    return x, w, b, freqs_cis, coords


def check(tokens: int, configs) -> list[str]:
    x, w, b, freqs_cis, coords = problem(tokens, seed=1)
    cos, sin = cos_sin_views(freqs_cis)
    freqs = vision_rope_frequencies(HEAD_DIM, device="cuda")
    ref = (x.double() @ w.double().T + b.double()).view(tokens, 3, HEADS, HEAD_DIM)
    ref_q, ref_k = rope_reference(ref[:, 0], ref[:, 1], freqs_cis)
    lin = F.linear(x, w, b).view(tokens, 3, HEADS, HEAD_DIM)
    nat = native_rope(lin[:, 0], lin[:, 1], freqs_cis)
    native_err = max(_max_abs(nat, (ref_q, ref_k)), _max_abs((lin[:, 2],), (ref[:, 2],)))
    lines = [f"check T={tokens}: native path max err {native_err:.4g}"]
    ok = True
    for cfg in configs:
        for angles in (False, True):
            out = torch.full((tokens, 3, HEADS, HEAD_DIM), float("nan"), dtype=x.dtype,
                             device="cuda")
            if angles:
                qkv_gemm.qkv_rope_linear_angles(x, w, b, coords, freqs, config=cfg, out=out)
            else:
                qkv_rope_linear(x, w, b, cos, sin, config=cfg, out=out)
            torch.cuda.synchronize()
            err = max(_max_abs((out[:, 0], out[:, 1]), (ref_q, ref_k)),
                      _max_abs((out[:, 2],), (ref[:, 2],)))
            good = bool(torch.isfinite(out).all()) and err <= 2 * native_err
            ok &= good
            lines.append(f"  {'angles' if angles else 'table '} {describe(cfg):32s} max err "
                         f"{err:.4g} {'ok' if good else 'FAIL'}")
    lines.append("CHECK " + ("PASSED" if ok else "FAILED"))
    return lines


def describe(cfg: QKVGemmConfig) -> str:
    tail = ("" if cfg.persistent else "/np") + ("/ptr" if cfg.use_tma is False else "")
    return (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}x{cfg.heads_per_tile}/{cfg.num_stages}/"
            f"{cfg.num_warps}/{cfg.group_m}{tail}")


def tflops(tokens: int, us: float) -> float:
    return 2 * tokens * HIDDEN * 3 * HIDDEN / (us * 1e-6) / 1e12


def compile_max_autotune(tokens: int, rows: list, samples: int) -> None:
    """torch.compile(mode="max-autotune") of linear then the cos/sin rotation: does
    Inductor fuse the rotation into its GEMM's epilogue, and how fast is it?"""
    from rope_kernels.kernels.reference import rope_cos_sin

    def linear_rope(x, w, b, cos, sin):
        qkv = F.linear(x, w, b).view(x.shape[0], 3, HEADS, HEAD_DIM)
        q, k = rope_cos_sin(qkv[:, 0], qkv[:, 1], cos, sin)
        return q, k, qkv[:, 2]

    t1 = time.time()
    try:
        fn = torch.compile(linear_rope, mode="max-autotune", dynamic=False, fullgraph=True)
        sets = [problem(tokens, seed=s) for s in range(2)]
        arg_sets = [(x, w, b, *cos_sin_views(f)) for x, w, b, f, _ in sets]
        fn(*arg_sets[0])
        torch.cuda.synchronize()
        compile_s = time.time() - t1
        t = time_fn(fn, arg_sets, mode="cudagraph", samples=samples)
    except Exception as e:
        print(f"T={tokens:6d} compile_max_autotune FAILED after {time.time() - t1:.0f}s: "
              f"{type(e).__name__}: {str(e)[-200:]}", flush=True)
        return
    rows.append({"variant": "compile_max_autotune", "config": f"compile {compile_s:.0f}s",
                 "tokens": tokens, "median_us": t.median_us, "p20_us": t.p20_us,
                 "p80_us": t.p80_us, "tflops": tflops(tokens, t.median_us)})
    print(f"T={tokens:6d} compile_max_autotune (compiled in {compile_s:.0f}s) {t.median_us:8.1f} us",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer configs and samples")
    parser.add_argument("--configs", nargs="*", default=None)
    parser.add_argument("--tokens", type=int, nargs="*", default=[43808, 87616])
    parser.add_argument("--top", type=int, default=3, help="configs also timed with angles/bare")
    parser.add_argument("--compile-tokens", type=int, default=87616,
                        help="time torch.compile(max-autotune) of rope(linear(x)) here (0: skip)")
    parser.add_argument("--compile-after-s", type=float, default=170,
                        help="skip the compile stage if the run is already this old")
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", "qkv_probe_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = [parse_config(c) for c in (args.configs or (SWEEP[:4] if args.quick else SWEEP))]
    samples = 10 if args.quick else 30
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)

    t0 = time.time()
    try:
        lines = check(5477, [configs[0], QKVGemmConfig(**{**configs[0].__dict__, "use_tma": False}),
                             QKVGemmConfig(**{**configs[0].__dict__, "persistent": False})])
    except Exception as e:  # report and go on to the timings
        lines = [f"CHECK ERROR {type(e).__name__}: {str(e)[-300:]}"]
    print("\n".join(lines), f"({time.time() - t0:.0f}s)", flush=True)

    a = torch.randn(8192, 8192, device="cuda").bfloat16()
    bmat = torch.randn(8192, 8192, device="cuda").bfloat16()
    t = time_fn(torch.matmul, [(a, bmat)], mode="cudagraph", samples=10)
    peak = 2 * 8192**3 / (t.median_us * 1e-6) / 1e12
    print(f"cuBLAS 8192^3 bf16: {peak:.0f} TFLOP/s (the roofline's compute ceiling)", flush=True)
    del a, bmat

    rows = []
    for tokens in args.tokens:
        sets = [problem(tokens, seed=s) for s in range(2)]
        base_args = [(x, w, b) for x, w, b, _, _ in sets]
        rope_args = [(x, w, b, *cos_sin_views(f)) for x, w, b, f, _ in sets]
        angle_args = [(x, w, b, c, vision_rope_frequencies(HEAD_DIM, device="cuda"))
                      for x, w, b, _, c in sets]

        def record(name, fn, arg_sets, cfg=None):
            try:
                t = time_fn(fn, arg_sets, mode="cudagraph", samples=samples)
            except Exception as e:  # a config the GPU cannot run is a finding, not the end
                print(f"T={tokens:6d} {name:24s} {describe(cfg) if cfg else '':30s} FAILED "
                      f"{type(e).__name__}: {str(e)[-160:]}", flush=True)
                return float("inf")
            row = {"variant": name, "config": describe(cfg) if cfg else "", "tokens": tokens,
                   "median_us": t.median_us, "p20_us": t.p20_us, "p80_us": t.p80_us,
                   "tflops": tflops(tokens, t.median_us)}
            rows.append(row)
            print(f"T={tokens:6d} {name:24s} {row['config']:30s} {t.median_us:8.1f} us "
                  f"{row['tflops']:6.0f} TFLOP/s", flush=True)
            return t.median_us

        def linear_rope(x, w, b, cos, sin):
            qkv = F.linear(x, w, b).view(x.shape[0], 3, HEADS, HEAD_DIM)
            fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, inplace=True)
            return qkv

        record("cublas_linear", F.linear, base_args)
        record("cublas_linear+fused_rope", linear_rope, rope_args)
        timed = []
        for cfg in configs:
            t1 = time.time()
            us = record("qkv_rope_linear", lambda x, w, b, c, s, _cfg=cfg: qkv_rope_linear(
                x, w, b, c, s, config=_cfg), rope_args, cfg)
            timed.append((us, cfg))
            print(f"    ({time.time() - t1:.0f}s incl. compile)", flush=True)
        for _, cfg in sorted(timed, key=lambda p: p[0])[:args.top]:
            record("qkv_rope_linear_angles", lambda x, w, b, c, f, _cfg=cfg:
                   qkv_gemm.qkv_rope_linear_angles(x, w, b, c, f, config=_cfg), angle_args, cfg)

            def bare(x, w, b, c, s, _cfg=cfg):
                heads, head_dim = HEADS, HEAD_DIM
                return qkv_gemm._launch(x, w, b, heads, head_dim, _cfg, None, None, cos=c, sin=s,
                                        coords=None, freqs=None, rotate=False)
            record("same_kernel_no_rotation", bare, rope_args, cfg)
        del sets, base_args, rope_args, angle_args
        torch.cuda.empty_cache()
        pd.DataFrame(rows).to_csv(out_dir / "qkv_probe.csv", index=False)

    if args.compile_tokens and time.time() - t0 < args.compile_after_s:
        compile_max_autotune(args.compile_tokens, rows, samples)
        pd.DataFrame(rows).to_csv(out_dir / "qkv_probe.csv", index=False)

    df = pd.DataFrame(rows)
    print("\n== summary (median us; ratio to cuBLAS linear) ==")
    for tokens, g in df.groupby("tokens"):
        cublas = g[g.variant == "cublas_linear"].median_us.iloc[0]
        for _, r in g.sort_values("median_us").iterrows():
            print(f"T={tokens:6d} {r.variant:24s} {r.config:30s} {r.median_us:8.1f} "
                  f"{r.median_us / cublas:5.3f}x {r.tflops:5.0f} TF")
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
