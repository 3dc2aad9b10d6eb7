"""The QKV projection microbenchmark: is RoPE free inside the GEMM's epilogue?

Kimi-K2.5's projection, 1152 -> 3456 (16 heads x 72) in bf16, at 5,476 to
87,616 tokens (1 to 16 images of 1024 x 1024), five ways:

- ``cublas_linear``: ``F.linear`` alone, the floor (no RoPE at all);
- ``cublas_linear+fused_rope``: ``F.linear`` then the fused RoPE kernel in place
  on the packed view, as the encoder does today;
- ``compile_max_autotune``: ``torch.compile(mode="max-autotune-no-cudagraphs")``
  of ``rope(linear(x))`` (the cudagraph-trees mode cannot be captured inside our
  CUDA-graph timer); can Inductor fuse the rotation into its GEMM?
- ``qkv_rope_linear``: the Triton GEMM rotating q/k in its epilogue (cos/sin table);
- ``qkv_rope_linear_angles``: the same, angles computed in-kernel from patch coordinates.

Every row: median/p20/p80 microseconds (CUDA graphs, ``timing.time_fn``), TFLOP/s
(2 * T * 1152 * 3456 flops), the ratio to ``cublas_linear`` at the same token
count, and the provenance columns. ``roofline`` returns what a compute-bound
roofline plot needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from rope_kernels.bench.timing import time_fn
from rope_kernels.kernels.freqs import vision_freqs_cis, vision_patch_coords, vision_rope_frequencies
from rope_kernels.kernels.fused import fused_qk_rope
from rope_kernels.kernels.qkv_gemm import qkv_rope_linear, qkv_rope_linear_angles
from rope_kernels.kernels.reference import cos_sin_views, rope_cos_sin
from rope_kernels.provenance import provenance

QKV_VARIANTS = ("cublas_linear", "cublas_linear+fused_rope", "compile_max_autotune",
                "qkv_rope_linear", "qkv_rope_linear_angles")
TOKENS = (5476, 21904, 43808, 87616)  # 1, 4, 8, 16 images of 1024 x 1024 (74 x 74 patches)


def image_grids(tokens: int, side: int = 74) -> list[tuple[int, int, int]]:
    """Images of side x side patches, plus one row of the remainder, totalling ``tokens``."""
    full, rest = divmod(tokens, side * side)
    return [(1, side, side)] * full + ([(1, 1, rest)] if rest else [])


def gemm_flops(tokens: int, hidden: int, heads: int, head_dim: int) -> int:
    return 2 * tokens * hidden * 3 * heads * head_dim


def make_args(tokens: int, hidden: int, heads: int, head_dim: int, device, *, seed: int,
              dtype=torch.bfloat16) -> dict:
    """x, W, b (random, never zeros), the RoPE table views and the patch coordinates."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out_features = 3 * heads * head_dim
    grids = image_grids(tokens)
    freqs_cis = vision_freqs_cis(grids, head_dim, device=device)
    return {
        "x": torch.randn(tokens, hidden, device=device, generator=gen).to(dtype),
        "w": (torch.randn(out_features, hidden, device=device, generator=gen)
              / hidden**0.5).to(dtype),
        "b": torch.randn(out_features, device=device, generator=gen).to(dtype),
        "cos_sin": cos_sin_views(freqs_cis),
        "coords": vision_patch_coords(grids, device=device),
        "freqs": vision_rope_frequencies(head_dim, device=device),
    }


def _linear_then_fused(x, w, b, cos, sin, heads, head_dim):
    qkv = F.linear(x, w, b).view(x.shape[0], 3, heads, head_dim)
    fused_qk_rope(qkv[:, 0], qkv[:, 1], cos, sin, inplace=True)
    return qkv


def _linear_then_rope(x, w, b, cos, sin, heads, head_dim):
    qkv = F.linear(x, w, b).view(x.shape[0], 3, heads, head_dim)
    q, k = rope_cos_sin(qkv[:, 0], qkv[:, 1], cos, sin)
    return q, k, qkv[:, 2]


def variant_calls(heads: int, head_dim: int, compiled=None) -> dict:
    """name -> fn(args dict): each computes the packed, rotated qkv (compile: q, k, v)."""
    calls = {
        "cublas_linear": lambda a: F.linear(a["x"], a["w"], a["b"]),
        "cublas_linear+fused_rope": lambda a: _linear_then_fused(
            a["x"], a["w"], a["b"], *a["cos_sin"], heads, head_dim),
        "qkv_rope_linear": lambda a: qkv_rope_linear(a["x"], a["w"], a["b"], *a["cos_sin"]),
        "qkv_rope_linear_angles": lambda a: qkv_rope_linear_angles(
            a["x"], a["w"], a["b"], a["coords"], a["freqs"]),
    }
    if compiled is not None:
        calls["compile_max_autotune"] = lambda a: compiled(
            a["x"], a["w"], a["b"], *a["cos_sin"], heads, head_dim)
    return calls


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
    compile_budget_s: float = 300.0,
    progress: bool = True,
) -> pd.DataFrame:
    """Time every variant at every token count; tidy rows with provenance.

    ``compile_max_autotune`` compiles once per token count (static shapes); once
    compiling has taken ``compile_budget_s`` seconds in total, later token
    counts record it as skipped rather than stall the run. A failure to
    compile or to run is recorded in the row's ``note``, never hidden."""
    unknown = sorted(set(variants) - set(QKV_VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {QKV_VARIANTS}")
    device = torch.device(device)
    rows, compile_spent = [], 0.0
    compiled = None
    if "compile_max_autotune" in variants:
        compiled = torch.compile(_linear_then_rope, mode="max-autotune-no-cudagraphs",
                                 dynamic=False, fullgraph=True)
    for t in tokens:
        arg_sets = [make_args(t, hidden, heads, head_dim, device, seed=s) for s in range(2)]
        calls = variant_calls(heads, head_dim, compiled)
        for name in variants:
            note, timing = "", None
            if name == "compile_max_autotune" and compile_spent > compile_budget_s:
                note = f"skipped: compile budget of {compile_budget_s:.0f} s spent"
            else:
                try:
                    start = time.perf_counter()
                    calls[name](arg_sets[0])  # compiles, autotunes, permutes weights
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    if name == "compile_max_autotune":
                        compile_spent += time.perf_counter() - start
                        note = f"compiled in {time.perf_counter() - start:.0f} s"
                    timing = time_fn(calls[name], [(a,) for a in arg_sets], mode=mode,
                                     samples=samples)
                except Exception as e:  # recorded, not raised: a peer failing is a result
                    note = f"failed: {type(e).__name__}: {str(e)[:200]}"
            row = {"variant": name, "tokens": t, "hidden": hidden, "heads": heads,
                   "head_dim": head_dim, "dtype": "bfloat16", "mode": mode,
                   "flops": gemm_flops(t, hidden, heads, head_dim), "note": note}
            if timing is not None:
                row.update(timer=timing.timer, median_us=timing.median_us, p20_us=timing.p20_us,
                           p80_us=timing.p80_us, samples=timing.samples,
                           tflops=row["flops"] / (timing.median_us * 1e-6) / 1e12)
            rows.append(row)
            if progress:
                shown = f"{timing.median_us:9.1f} us" if timing else note
                print(f"qkv_gemm T={t:6d} {name:26s} {shown}", flush=True)
        del arg_sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    base = df[df.variant == "cublas_linear"].set_index("tokens")["median_us"]
    df["ratio_to_cublas"] = df["median_us"] / df["tokens"].map(base)
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
    return timed[["variant", "tokens", "intensity", "tflops", "ceiling_tflops",
                  "fraction_of_ceiling", "peak_tflops", "median_us"]]
