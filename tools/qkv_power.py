"""GPU exploration: SM clock and board power while the QKV GEMM runs back to back.

    python tools/qkv_power.py                      # 87,616 tokens, cuBLAS and NVIDIA_ANGLES_CONFIG
    python tools/qkv_power.py --configs 2,23 --seconds 2
    python tools/qkv_power.py --quack                # QuACK's GEMMs too

Tests one reading of why our QKV kernel falls further behind cuBLAS as the token
count grows (1.02x at 21,904 tokens, 1.12x at 87,616, rotation compiled out): that
it moves more bytes between L2 and the SMs per output (128x128 tiles), so it draws
more power per FLOP and the GPU lowers its clock on longer runs. Each variant runs
back to back (no L2 flush: the steady state a long kernel reaches) for ``--seconds``
while ``nvidia-smi`` samples the SM clock and power every 50 ms; a sample counts for
the variant whose loop was running when it arrived, after a 0.3 s ramp. Prints, per
variant: us per call, median SM clock [p20, p80], median power, samples. Where $OUT is
set, writes the rows to ``qkv_power.csv`` there, with provenance; on a node whose copy
of the tree has no or other git metadata, set ROPE_STUDY_COMMIT to the commit (else the
rows name whatever HEAD that metadata holds, marked -dirty). Exploration only: nothing
in the study reads it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HIDDEN, HEADS, HEAD_DIM = 1152, 16, 72
QUERY = "clocks.sm,power.draw,temperature.gpu"
RAMP_S = 0.3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=87616)
    p.add_argument("--configs", default="", help="comma-separated indices into QKV_SWEEP_CONFIGS "
                   "(default: NVIDIA_ANGLES_CONFIG)")
    p.add_argument("--seconds", type=float, default=2.0, help="loop time per variant")
    p.add_argument("--quack", action="store_true",
                   help="QuACK's plain GEMM (its default config) and its RoPE-epilogue GEMM "
                        "(128x160) too (installed by tools/device_setup.sh)")
    args = p.parse_args(argv)
    if args.tokens < 1 or args.seconds <= RAMP_S:
        p.error(f"--tokens must be positive and --seconds more than {RAMP_S}")
    return args


def parse_sample(line: str):
    """(sm_mhz, watts, celsius) of one ``nvidia-smi --format=csv,noheader,nounits`` line,
    or None for a line that is not three numbers (a header, '[N/A]')."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        return None


def summarize(samples, windows):
    """One dict per (variant, t0, t1, us_per_call) window: the samples that arrived in
    it after the ramp, as median and p20/p80 SM clock, median power and temperature."""
    import numpy as np

    rows = []
    for name, t0, t1, us in windows:
        got = np.array([s for t, s in samples if t0 + RAMP_S <= t <= t1]).reshape(-1, 3)
        row = {"variant": name, "us_per_call": us, "samples": len(got)}
        if len(got):
            row.update(sm_mhz=float(np.median(got[:, 0])),
                       sm_mhz_p20=float(np.percentile(got[:, 0], 20)),
                       sm_mhz_p80=float(np.percentile(got[:, 0], 80)),
                       watts=float(np.median(got[:, 1])), celsius=float(np.median(got[:, 2])))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import pandas as pd
    import torch

    from rope_kernels.bench import qkv_bench as qb
    from rope_kernels.bench.qkv_configs import QKV_SWEEP_CONFIGS
    from rope_kernels.kernels.qkv_gemm import NVIDIA_ANGLES_CONFIG

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from qkv_sweep import pick_configs  # the sweep's own --configs, so an index means the same

    try:
        configs = pick_configs(args.configs, QKV_SWEEP_CONFIGS) if args.configs else [
            NVIDIA_ANGLES_CONFIG]
    except ValueError as e:
        print(f"qkv_power: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("qkv_power: needs a CUDA GPU", file=sys.stderr)
        return 2
    a = qb.make_args(args.tokens, HIDDEN, HEADS, HEAD_DIM, torch.device("cuda"), seed=0)
    variants = [("cublas_linear", lambda: torch.nn.functional.linear(a["x"], a["w"], a["b"]))]
    for c in configs:
        for name in ("qkv_gemm_rotation_compiled_out", "qkv_rope_linear_angles"):
            fn = qb.variant_call(name, HEADS, HEAD_DIM, config=c)
            variants.append((f"{name} {c.label}", lambda fn=fn: fn(a)))
    if args.quack:
        calls, why = qb.quack_best_calls(HEADS, HEAD_DIM)
        if why:
            print(f"qkv_power: QuACK unavailable: {why}", file=sys.stderr)
            return 2
        for name, cfg, fn in calls:
            variants.append((f"{name} {cfg}", lambda fn=fn: fn(a)))
    variants.append(("cublas_linear (again)", variants[0][1]))

    samples = []
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)

    def reader():
        for line in smi.stdout:
            s = parse_sample(line)
            if s is not None:
                samples.append((time.perf_counter(), s))

    threading.Thread(target=reader, daemon=True).start()
    windows = []
    try:
        for name, fn in variants:
            for _ in range(3):
                fn()  # compile, build operands, warm
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            n = max(1, int(args.seconds * 1000 / max(start.elapsed_time(end), 1e-3)))
            t0 = time.perf_counter()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            windows.append((name, t0, t1, start.elapsed_time(end) * 1000 / n))
            time.sleep(0.5)  # let the clock recover between variants
    finally:
        smi.terminate()
    df = pd.DataFrame(summarize(samples, windows))
    df.insert(0, "tokens", args.tokens)
    pd.set_option("display.width", 250)
    print(df.round(1).to_string(index=False))
    if os.environ.get("OUT"):
        from rope_kernels.atomic_io import write_atomic
        from rope_kernels.provenance import provenance

        for k, v in provenance().items():
            df[k] = v
        write_atomic(Path(os.environ["OUT"]) / "qkv_power.csv", df.to_csv(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
