"""First device call after tools/device_setup.sh: do the CUDA peers build, agree with
float64 and run? Checks SGLang's Kimi-K2.5 path, FlashInfer and QuACK (in place and out
of place) against float64, then times them once at 21904 x 16 x 72 (bf16, CUDA graphs,
cold L2, shuffled rounds) beside fused and fused_inplace, times the fused kernel's
launch candidates (persistent grid, in-kernel angles) beside its default, and prints
the tables. A step that fails prints why and the rest go on.
Writes $OUT/peer_probe.csv (or ./probe-out). About 2-4 minutes on an H200 (first JIT
builds: 10-60 s).

    eval "$(bash tools/device_setup.sh env)"; python tools/peer_probe.py [TOKENS HEADS HEAD_DIM]
"""

import os
import sys
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

t_start = time.time()
out = Path(os.environ.get("OUT", "probe-out"))
out.mkdir(parents=True, exist_ok=True)
pd.set_option("display.width", 250)

from rope_kernels.correctness import check_variant  # noqa: E402
from rope_kernels.bench.microbench import Shape, bench_shape  # noqa: E402
from rope_kernels.bench.timing import copy_bandwidth_gbps  # noqa: E402
from rope_kernels.study.devices import provenance  # noqa: E402
from rope_kernels.variants import VARIANTS, peer_status  # noqa: E402

tokens, heads, head_dim = (int(a) for a in (sys.argv[1:4] if len(sys.argv) >= 4 else (21904, 16, 72)))
device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test of this script
print(provenance(), flush=True)
print(f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", flush=True)
for row in peer_status():  # loads every peer: JIT builds happen here
    where = f"{row['package']} {row['version']} ({row['origin']}) {row['sha256'][:12]}"
    print(f"{row['name']:<18} {'ran' if row['available'] else 'absent':<7} "
          f"{where if row['available'] else row['reason']}", flush=True)
print(f"peers loaded in {time.time() - t_start:.0f} s", flush=True)

wanted = ["fused", "fused_inplace", "sglang_kimi_k25", "flashinfer", "quack_qkv", "quack_rotary",
          "sglang_vision", "vllm_packed_qk"]
names = [n for n in wanted if n in VARIANTS]
# the probe shape, then the head dims and edge sizes of notebook 01's GPU shapes (a peer
# that raises there would stop 01), bf16 only: each new head_dim or dtype costs the CuTe
# and JIT peers a compile (seconds each); every failure is listed with its reason
check_shapes = [(tokens, heads, head_dim), (7, 3, 72)]
check_dtypes = [torch.bfloat16]
if device == "cuda":
    check_shapes += [(1, 16, 72), (4099, 12, 128), (1023, 2, 80)]
rows, failures = {}, []
for name in names:
    passed = skipped = 0
    for dtype in check_dtypes:
        for shape in check_shapes:
            try:
                res = check_variant(VARIANTS[name], tokens=shape[0], heads=shape[1],
                                    head_dim=shape[2], dtype=dtype, device=device)
                if not res.supported:
                    skipped += 1
                    continue
                why = "" if res.passed else (f"error {res.max_abs_err:.3g} > tol "
                                             f"{res.tolerance:.3g}, intact={res.inputs_intact}")
            except Exception as exc:  # noqa: BLE001
                why = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            if why:
                failures.append((name, str(dtype).removeprefix("torch."), shape, why[:160]))
            else:
                passed += 1
            if shape == check_shapes[0] and dtype == torch.bfloat16:
                rows.setdefault(name, {})["f64_probe_shape"] = "ok" if not why else "FAIL"
    rows.setdefault(name, {}).update(f64_checks_passed=passed, f64_checks_skipped=skipped)
for failure in failures:
    print("FAILED float64 check:", *failure, flush=True)
print(f"checks done at {time.time() - t_start:.0f} s", flush=True)

copy = copy_bandwidth_gbps(device)
good = [n for n in names if rows[n].get("f64_probe_shape") == "ok"]
try:
    timed = bench_shape([VARIANTS[n] for n in good], Shape(tokens, heads, head_dim),
                        torch.bfloat16, ["cudagraph" if device == "cuda" else "eager"],
                        device=device, copy_gbps=copy,
                        samples=10, rounds=3)
    for r in timed:
        rows[r["variant"]].update(median_us=r["median_us"], p20_us=r["p20_us"],
                                  p80_us=r["p80_us"], pct_of_copy=r["pct_of_copy"])
except Exception:  # noqa: BLE001
    traceback.print_exc()
try:  # the fused kernel's launch candidates beside its default, same shape
    from rope_kernels.bench.microbench import sweep_fused_configs
    from rope_kernels.kernels.fused import fused_launch_config

    sweep = sweep_fused_configs([Shape(tokens, heads, head_dim)],
                                [fused_launch_config(heads, head_dim, 2)], torch.bfloat16,
                                device=device, copy_gbps=copy, samples=10, progress=False,
                                mode="cudagraph" if device == "cuda" else "eager")
    print(sweep[["strategy", "block_t", "block_h", "num_warps", "programs_per_sm", "is_default",
                 "median_us", "pct_of_copy"]].round(2).to_string())
    sweep.assign(**provenance()).to_csv(out / "fused_candidates_probe.csv", index=False)
except Exception:  # noqa: BLE001
    traceback.print_exc()
print(f"candidates done at {time.time() - t_start:.0f} s", flush=True)
table = pd.DataFrame.from_dict(rows, orient="index")
for name in table.index:
    v = VARIANTS[name]
    table.loc[name, "in_place"] = v.inplace
    table.loc[name, "launches"] = v.launches
    table.loc[name, "peer"] = f"{v.peer_package} {v.peer_version} {v.peer_sha256[:12]}".strip()
if "median_us" in table and "fused" in table.index:
    table["time_vs_fused"] = table["median_us"] / table.loc["fused", "median_us"]
    table["time_vs_fused_inplace"] = table["median_us"] / table.loc["fused_inplace", "median_us"]
mode = "cudagraph, cold L2" if device == "cuda" else "eager (a CPU smoke test: not a measurement)"
print(f"copy ceiling {copy:.0f} GB/s; {tokens} x {heads} x {head_dim} bf16, {mode}")
print(table.round(3).to_string())
table.assign(**provenance()).to_csv(out / "peer_probe.csv")
print(f"probe done in {time.time() - t_start:.0f} s", flush=True)
