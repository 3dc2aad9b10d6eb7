"""One device call's worth of exploration: kernel launch-config sweep, all
variants at key shapes in both modes, attention backends and CUDA-graph capture
of the encoder. Writes CSVs to $OUT (or ./probe-out) and prints a summary."""

import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from rope_kernels.provenance import provenance
from rope_kernels.kernels.fused import fused_launch_config
from rope_kernels.bench.microbench import (Shape, fused_config_grid, run_microbench,
                                     sweep_fused_configs)
from rope_kernels.bench.timing import copy_bandwidth_gbps, time_fn

out = Path(os.environ.get("OUT", "probe-out"))
out.mkdir(parents=True, exist_ok=True)
pd.set_option("display.width", 250)
pd.set_option("display.max_rows", 500)
prov = provenance()
print(prov, flush=True)
copy = copy_bandwidth_gbps("cuda")
print(f"copy ceiling {copy:.0f} GB/s", flush=True)
part = set(sys.argv[1:]) or {"sweep", "bench", "encoder"}

if "sweep" in part:
    t0 = time.time()
    shapes = [Shape(65536, 16, 72), Shape(8192, 16, 72), Shape(65536, 2, 72),
              Shape(65536, 4, 72), Shape(8192, 12, 128), Shape(8192, 3, 128), Shape(256, 3, 128)]

    def configs(s):
        cs = fused_config_grid(s.heads, s.head_dim, 2, warps=(4, 8))
        d = fused_launch_config(s.heads, s.head_dim, 2)
        return cs if d in cs else cs + [d]

    df = sweep_fused_configs(shapes, configs, torch.bfloat16, device="cuda", copy_gbps=copy,
                             samples=20, progress=False)
    df.to_csv(out / "sweep.csv", index=False)
    best = df.loc[df.groupby(["tokens", "heads", "head_dim"]).median_us.idxmin()]
    print(best[["tokens", "heads", "head_dim", "block_t", "block_h", "num_warps", "median_us", "pct_of_copy"]])
    print(df[df.is_default][["tokens", "heads", "head_dim", "block_t", "block_h", "num_warps", "median_us", "pct_of_copy"]])
    print(f"sweep {time.time() - t0:.0f}s", flush=True)

if "bench" in part:
    t0 = time.time()
    fams = [{"tokens": [256, 1024, 4096, 8192], "heads": [3, 6, 12], "head_dim": 128},
            {"tokens": [4096, 8192, 65536], "heads": [16], "head_dim": 72}]
    df = run_microbench(["native", "fused", "vllm_merged", "compiled", "liger"], fams,
                        ["bfloat16"], ["eager", "cudagraph", "cudagraph_warm"],
                        device="cuda", copy_gbps=copy, samples=20, progress=False)
    df.to_csv(out / "bench.csv", index=False)
    print(df[["variant", "tokens", "heads", "head_dim", "mode", "median_us", "pct_of_copy",
              "speedup_vs_native", "peak_mem_mb", "input_sets"]].to_string())
    print(f"bench {time.time() - t0:.0f}s", flush=True)

if "encoder" in part:
    t0 = time.time()
    from rope_kernels.model.vit import EncoderConfig, MoonViTEncoder, encoder_inputs, pick_attention
    cfg = EncoderConfig.kimi_k25()
    model = MoonViTEncoder(cfg, device="cuda")
    grids = [(1, 74, 74)] * 4
    inp = encoder_inputs(grids, cfg, device="cuda")
    print("picked attention:", pick_attention(grids, "cuda"))
    rows = []
    for att in ("sdpa_cudnn_batched", "sdpa_batched", "varlen_attn", "sdpa_per_image"):
        for rope in ("native", "fused", "none"):
            try:
                fn = lambda p, r=rope, a=att: model(p, inp.grids, rope=r, attention=a,
                                                    cu_seqlens=inp.cu_seqlens, max_seqlen=inp.max_seqlen)
                t = time_fn(fn, [(inp.patches,)], mode="eager", calls_per_sample=1, samples=5, warmup=1)
                rows.append({"attention": att, "rope": rope, "eager_ms": t.median_us / 1e3})
            except Exception as e:  # noqa: BLE001
                rows.append({"attention": att, "rope": rope, "error": repr(e)[:200]})
    for rope in ("native", "fused", "fused_inplace", "vllm_merged", "none"):
        try:
            att = pick_attention(grids, "cuda")
            fn = lambda p, r=rope: model(p, inp.grids, rope=r, attention=att,
                                         cu_seqlens=inp.cu_seqlens, max_seqlen=inp.max_seqlen)
            t = time_fn(fn, [(inp.patches,)], mode="cudagraph", calls_per_sample=1, samples=5, warmup=1)
            rows.append({"attention": att + "+graph", "rope": rope, "eager_ms": t.median_us / 1e3})
        except Exception as e:  # noqa: BLE001
            rows.append({"attention": "graph", "rope": rope, "error": repr(e)[:300]})
    df = pd.DataFrame(rows)
    df.to_csv(out / "encoder.csv", index=False)
    print(df.to_string())
    o_n = model(inp.patches, inp.grids, rope="native", attention=att)
    o_f = model(inp.patches, inp.grids, rope="fused", attention=att)
    print("native vs fused encoder max diff", (o_n.float() - o_f.float()).abs().max().item(),
          "scale", o_n.float().abs().max().item())
    print(f"encoder {time.time() - t0:.0f}s", flush=True)
