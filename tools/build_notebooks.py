"""Write notebooks/*.ipynb from the cell lists below (outputs are added by
`make notebooks`, which executes them with their default CPU parameters).

Cells whose output varies run to run (timings, progress bars) start with
`# NBVAL_IGNORE_OUTPUT`; everything else is compared exactly by nbval.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def md(text):
    return new_markdown_cell(text.strip("\n"))


def code(text, *, params=False):
    cell = new_code_cell(text.strip("\n"))
    if params:
        cell.metadata["tags"] = ["parameters"]
    return cell


SETUP = """
import warnings
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
import pandas as pd
import torch
from pathlib import Path
from rope_kernels.study.devices import provenance
from rope_kernels.study.notebooks import resolve_device
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 40)
kind, dev = resolve_device(device)
"""

PROVENANCE = """
# NBVAL_IGNORE_OUTPUT
pd.Series(provenance(kind)).to_frame("this run")
"""

# --------------------------------------------------------------------------- 01
NB01 = [
    code('''
# Parameters (papermill). Defaults: the small CPU configuration nbval re-runs.
device = "auto"  # auto | cpu | cuda | rocm
dtypes = ["float32", "bfloat16", "float16"]
shapes = [[7, 3, 72], [16, 2, 128], [1, 1, 4]]  # [tokens, heads, head_dim]
variants = []  # empty: every variant in rope_kernels.VARIANTS
seed = 0
data_dir = ""  # where to upsert correctness.csv; empty: do not save
''', params=True),
    md('''
# 1. The kernels and their correctness

**Question.** vLLM PR #50400 replaced the RoPE of Kimi-K2.5's vision tower (a complex
multiplication in PyTorch, several kernels per layer) with a fused Triton path. Do all
the implementations this study compares compute the same function, and how accurately?

**The math.** Kimi rotates *adjacent* pairs `(x[2j], x[2j+1])` of every head (GPT-J
style, not NeoX halves) by the angle in `freqs_cis[t, j]`, a unit complex number:

    out[2j]   = x[2j] * cos - x[2j+1] * sin
    out[2j+1] = x[2j] * sin + x[2j+1] * cos

The 2D table alternates axes: pair `2i` turns by `column * f_i`, pair `2i+1` by
`row * f_i`, with `f_i = theta^(-4i/head_dim)`. q and k arrive as strided views of a
packed `(T, 3, H, D)` qkv buffer (token stride `3*H*D`).

**Method.** Every variant is checked against a float64 reference on random inputs (never
zeros): in fp32 the error must stay under 1e-5 of the output scale; in bf16/fp16 a
variant may be at most 2x as far from float64 as PyTorch's own native path in the same
dtype (plus a tiny floor), the rule flash-attention's tests use.
'''),
    code(SETUP + '''
from rope_kernels import VARIANTS, cos_sin_views, fused_qk_rope, native_rope, rope_cos_sin
from rope_kernels.bench.correctness import check_variant
from rope_kernels.bench.microbench import parse_dtype
from rope_kernels.study.notebooks import show_source
from rope_kernels.kernels.fused import _fused_qk_rope_kernel, _rotate_pairs, fused_launch_config
'''),
    code(PROVENANCE),
    md('''
## The native path (Kimi before the PR)

Per tensor: an fp32 upcast copy, the complex multiply, a downcast copy: 3 kernels for q,
3 for k, each moving the data again. Rendered from the library's source:
'''),
    code("show_source(native_rope)"),
    md('''
## The fused kernel

One launch rotates q and k together. A program owns a few tokens x a group of heads x
the whole head_dim, covered by at most two power-of-two chunks (72 = 64 + 8). cos/sin are
read once per token straight from `freqs_cis` (strided views, no copy) and broadcast over
the heads; the math is fp32 whatever the data type. Rendered from the library's source:
'''),
    code("show_source(_rotate_pairs)\nshow_source(_fused_qk_rope_kernel)"),
    md("The launch settings come from a small documented heuristic, not autotuning, so one compile serves every token count:"),
    code("show_source(fused_launch_config)"),
    md('''
## Every variant, every dtype

`launches` is the number of kernels one call makes (bf16 data), recorded beside each
variant and checked against the profiler in notebook 3.
'''),
    code('''
names = variants or list(VARIANTS)
pd.DataFrame([{"variant": n, "launches": VARIANTS[n].launches,
               "launches_fp32": VARIANTS[n].launches_fp32,
               "description": VARIANTS[n].description} for n in names])
'''),
    code('''
rows = []
for name in names:
    for dt in dtypes:
        for tokens, heads, head_dim in shapes:
            r = check_variant(VARIANTS[name], tokens=tokens, heads=heads, head_dim=head_dim,
                              dtype=parse_dtype(dt), device=dev, seed=seed)
            rows.append(r.as_dict())
correctness = pd.DataFrame(rows)
shown = correctness[["variant", "dtype", "tokens", "heads", "head_dim", "max_abs_err",
                     "native_max_abs_err", "tolerance", "rel_err", "inputs_intact", "passed"]]
shown.style.format({c: "{:.1e}" for c in ["max_abs_err", "native_max_abs_err", "tolerance", "rel_err"]}).hide(axis="index")
'''),
    code('''
summary = correctness.groupby(["variant", "dtype"]).passed.all().unstack()
summary
'''),
    code('''
assert correctness.passed.all(), correctness[~correctness.passed]
if data_dir:
    from rope_kernels.study.results import upsert_csv
    out = correctness.assign(**provenance(kind))
    upsert_csv(Path(data_dir) / "correctness.csv", out,
               ["variant", "dtype", "tokens", "heads", "head_dim", "device_name"])
'''),
    md('''
## Try your own variant

Write any function `(xq, xk, freqs_cis) -> (q, k)` below. The harness checks it against the
float64 reference on fresh random data and times it beside native and fused (on a GPU also
with CUDA graphs). The example is the real-arithmetic form that `torch.compile` fuses.
'''),
    code('''
def my_rope(xq, xk, freqs_cis):
    cos, sin = cos_sin_views(freqs_cis)      # strided views, no copy
    return rope_cos_sin(xq, xk, cos, sin)    # edit me

tokens, heads, head_dim = shapes[0]
mine = check_variant(my_rope, tokens=tokens, heads=heads, head_dim=head_dim,
                     dtype=torch.bfloat16, device=dev, seed=seed, name="my_rope")
pd.DataFrame([mine.as_dict()])[["variant", "max_abs_err", "tolerance", "passed"]].style.format(
    {"max_abs_err": "{:.1e}", "tolerance": "{:.1e}"}).hide(axis="index")
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
from rope_kernels.bench.microbench import Shape, make_arg_sets
from rope_kernels.bench.timing import time_fn
sets = make_arg_sets(Shape(tokens, heads, head_dim), torch.bfloat16, dev, 2)
modes = ["eager"] + (["cudagraph"] if dev.type == "cuda" else [])
timed = []
for label, fn in [("native", VARIANTS["native"]), ("fused", VARIANTS["fused"]), ("my_rope", my_rope)]:
    for mode in modes:
        t = time_fn(fn, sets, mode=mode, samples=20 if dev.type == "cuda" else 3)
        timed.append({"variant": label, "mode": mode, "timer": t.timer, "median_us": t.median_us})
pd.DataFrame(timed).pivot(index="variant", columns="mode", values="median_us").round(2)
'''),
    md('''
**Caveats.** On a CPU the Triton kernels run in Triton's interpreter, which this project
patches to round fp32 to bf16 to nearest even as GPUs do (the interpreter truncates); CPU
timings say nothing about GPU speed. `fused_inplace` rotates the caller's q/k in place
(inside the packed qkv buffer); the checker verifies v is untouched.
'''),
]

# --------------------------------------------------------------------------- 02
NB02 = [
    code('''
# Parameters (papermill). Defaults: the small CPU configuration nbval re-runs.
device = "auto"
variants = []  # empty: every variant in rope_kernels.VARIANTS
families = [{"tokens": [16, 33], "heads": [2], "head_dim": [8, 72]}]
dtypes = ["bfloat16"]
modes = ["eager"]  # eager | cudagraph | cudagraph_warm (GPU only for the graph modes)
samples = 3
config_sweep = False  # time fused launch configs (block sizes) on sweep_shapes
sweep_shapes = [[8192, 16, 72]]  # [tokens, heads, head_dim]
progress = True
data_dir = ""  # where to upsert microbench.csv (and fused_configs.csv); empty: do not save
''', params=True),
    md('''
# 2. Microbenchmarks: speedup, roofline, and PR #50400's table

**Question.** Does a fused q/k RoPE kernel deliver the PR's published 5.7x-8.5x over the
native path, does what vLLM actually merged, and how close to the hardware limit do the
kernels get against what users would otherwise pick (torch.compile, Liger)?

**Method.** For each shape (tokens x heads x head_dim), dtype, variant and mode:
- *eager*: a Python loop of calls between CUDA events (launch overhead included);
- *cudagraph*: the same calls captured in one CUDA graph and replayed (the PR's method);
- *cudagraph_warm*: replays on a single input set, so small shapes run from L2, the way
  many published tables are measured; shown beside, never instead of, the cold numbers.

Calls rotate over enough input sets to cover twice the L2 cache; warm-up first; the median
(and p20/p80) of many samples. q/k are strided views of a packed qkv buffer. The ceiling is
a device-to-device copy measured in the same run (bytes read + written): `% of copy` is the
minimal traffic (read and write q and k, read fp32 cos/sin once) over time, against it.
`copy_same_bytes_us` times a copy of the same bytes the same way: the ceiling at that size.
On a CPU the timer is the wall clock and the numbers are not GPU predictions.
'''),
    code(SETUP + '''
import matplotlib.pyplot as plt
from rope_kernels import VARIANTS
from rope_kernels.bench.microbench import run_microbench
from rope_kernels.study.summary import pr_comparison
from rope_kernels.bench.timing import copy_bandwidth_gbps
names = variants or list(VARIANTS)
'''),
    code(PROVENANCE),
    code('''
# NBVAL_IGNORE_OUTPUT
copy_gbps = copy_bandwidth_gbps(dev)
print(f"device-to-device copy ceiling: {copy_gbps:.0f} GB/s (bytes read + written)")
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
bench = run_microbench(names, families, dtypes, modes, device=dev, copy_gbps=copy_gbps,
                       samples=samples, progress=progress)
if data_dir:
    from rope_kernels.study.results import MICROBENCH_KEY, upsert_csv
    upsert_csv(Path(data_dir) / "microbench.csv", bench, MICROBENCH_KEY)
bench[["variant", "tokens", "heads", "head_dim", "dtype", "mode", "median_us", "pct_of_copy",
       "speedup_vs_native", "launches", "peak_mem_mb"]].round(2)
'''),
    md("What each variant launches and allocates per call (beyond its inputs; NaN on the CPU, where it is not measured):"),
    code('''
bench.groupby("variant")[["launches"]].first().loc[names]
'''),
    md('''
## Speedup over native

One panel per head layout (heads x head_dim); the PR's rows are 3/6/12 heads x 128, Kimi-K2.5's
vision tower is 16 x 72 (2 and 4 heads per rank under tensor parallelism).
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
def panels(df, value, ylabel, hline=None, log=False):
    layouts = sorted(df.groupby(["heads", "head_dim"]).groups)
    mode = [m for m in ("cudagraph", "eager") if m in set(df["mode"])][0]
    fig, axes = plt.subplots(1, len(layouts), figsize=(4 * len(layouts), 3.2), squeeze=False, sharey=True)
    for ax, (h, d) in zip(axes[0], layouts):
        sub = df[(df.heads == h) & (df.head_dim == d) & (df["mode"] == mode) & (df.dtype == dtypes[0])]
        for name, g in sub.groupby("variant", sort=False):
            ax.plot(g.tokens, g[value], marker="o", label=name)
        if hline is not None:
            ax.axhline(hline, color="k", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"{h} heads x {d}, {mode}")
        ax.set_xlabel("tokens")
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    plt.show()

panels(bench, "speedup_vs_native", "speedup over native (x)", hline=1.0, log=True)
'''),
    md('''
## Roofline view: % of the copy ceiling

RoPE does a handful of flops per byte, so it is memory-bound: the only ceiling that matters is
bandwidth. 100% would move the minimal bytes at copy speed. Below a few thousand tokens every
variant is bound by launch latency instead.
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
panels(bench, "pct_of_copy", "% of device-to-device copy bandwidth", hline=100.0)
'''),
    md('''
## Against PR #50400's published table

The PR reports bf16 CUDA-graph times for 256-8192 tokens x 3/6/12 heads x 128 (its GPU is not
stated; `data/reference/pr50400_table.csv`). Our native and fused, same shapes, both L2 regimes:
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
pr = pd.read_csv(Path("..") / "data" / "reference" / "pr50400_table.csv")
cmp = {m: pr_comparison(bench, pr, m) for m in ("cudagraph", "cudagraph_warm") if m in set(bench["mode"])}
if not any(len(c) for c in cmp.values()):
    print("No PR shapes in this grid (the CPU default); the GPU profile includes all 12 rows.")
else:
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    for (m, c), mk in zip(cmp.items(), ("o", "s")):
        lbl = [f"{t}x{h}" for t, h in zip(c.tokens, c.heads)]
        axes[0].plot(lbl, c.our_fused_us, marker=mk, label=f"our fused ({m})")
        axes[1].plot(lbl, c.our_speedup, marker=mk, label=f"our fused/native ({m})")
    axes[0].plot(lbl, c.fused_us, "k--", marker="x", label="PR fused (published)")
    axes[1].plot(lbl, c.speedup, "k--", marker="x", label="PR speedup (published)")
    axes[0].set_ylabel("fused time per call (us)"); axes[1].set_ylabel("speedup over native (x)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=60); ax.legend(fontsize=8); ax.set_xlabel("tokens x heads (head_dim 128)")
    fig.tight_layout(); plt.show()
    display(pd.concat({m: c.set_index(["tokens", "heads"])[["native_us", "fused_us", "speedup",
                       "our_native_us", "our_fused_us", "our_speedup", "fused_at_or_under_pr"]]
                       for m, c in cmp.items()}, axis=1).round(2))
'''),
    md('''
## The study's targets

Evaluated from the rows above (benchmarks, not tests): fused at >= 90% of the copy ceiling at
8192 tokens and more; fused at or under the PR's fused time on its 12 rows; at 16 x 72 and
4096+ tokens fused at least 1.5x `compiled` and 3x `liger`.
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
g = bench[(bench["mode"] == "cudagraph") & (bench.dtype == "bfloat16")] if "cudagraph" in set(bench["mode"]) else bench.iloc[0:0]
checks = []
f = g[(g.variant == "fused") & (g.tokens >= 8192)]
for _, r in f.iterrows():
    checks.append({"target": "fused >= 90% of copy", "shape": f"{r.tokens}x{r.heads}x{r.head_dim}",
                   "value": r.pct_of_copy, "goal": 90.0, "met": r.pct_of_copy >= 90.0})
for m, label in (("cudagraph", "cold L2"), ("cudagraph_warm", "warm L2")):
    for _, r in cmp.get(m, pd.DataFrame()).iterrows():
        checks.append({"target": f"fused <= PR fused (us, {label})", "shape": f"{r.tokens}x{r.heads}x{r.head_dim}",
                       "value": r.our_fused_us, "goal": r.fused_us, "met": r.our_fused_us <= r.fused_us})
kimi = g[(g.heads == 16) & (g.head_dim == 72) & (g.tokens >= 4096)].pivot_table(index="tokens", columns="variant", values="median_us")
for peer, goal in (("compiled", 1.5), ("liger", 3.0)):
    if peer in kimi and "fused" in kimi:
        for t, r in kimi.iterrows():
            ratio = r[peer] / r["fused"]
            checks.append({"target": f"fused vs {peer} (x)", "shape": f"{t}x16x72", "value": ratio, "goal": goal, "met": ratio >= goal})
targets = pd.DataFrame(checks)
targets.round(2) if len(targets) else print("Targets are defined for the GPU profile (cudagraph mode).")
'''),
    md('''
## Block sizes: the evidence behind the launch heuristic

With `config_sweep=True` the fused kernel is timed under each candidate (tokens per program,
heads per program, warps); `is_default` marks the heuristic's pick.
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
if config_sweep and dev.type == "cuda":
    from rope_kernels.kernels.fused import fused_launch_config
    from rope_kernels.bench.microbench import Shape, fused_config_grid, sweep_fused_configs, parse_dtype
    dt = parse_dtype(dtypes[0])
    es = torch.empty((), dtype=dt).element_size()

    def candidates(s):
        cs = fused_config_grid(s.heads, s.head_dim, es, warps=(4, 8))
        d = fused_launch_config(s.heads, s.head_dim, es)
        return cs if d in cs else cs + [d]

    sweep = sweep_fused_configs([Shape(*s) for s in sweep_shapes], candidates, dt, device=dev,
                                copy_gbps=copy_gbps, samples=samples, progress=progress)
    sweep = sweep.assign(**provenance(kind))
    if data_dir:
        from rope_kernels.study.results import upsert_csv
        upsert_csv(Path(data_dir) / "fused_configs.csv", sweep,
                   ["tokens", "heads", "head_dim", "dtype", "mode", "block_t", "block_h", "num_warps", "device_name"])
    best = sweep.loc[sweep.groupby(["tokens", "heads", "head_dim"]).median_us.idxmin()]
    chosen = sweep[sweep.is_default]
    display(best.merge(chosen, on=["tokens", "heads", "head_dim"], suffixes=("_best", "_default"))[
        ["tokens", "heads", "head_dim", "block_t_best", "block_h_best", "num_warps_best", "median_us_best",
         "pct_of_copy_best", "block_t_default", "block_h_default", "median_us_default", "pct_of_copy_default"]].round(2))
else:
    print("config sweep skipped (config_sweep=False or no GPU)")
'''),
    md('''
**Caveats.** Timings are of the RoPE call alone; in a model its inputs come from the qkv
projection and may already sit in L2. `peak_mem_mb` is what one call allocates beyond its
inputs (native's fp32 temporaries against a fused kernel's outputs; nothing in place).
`compiled` is torch.compile with static shapes: one compile per shape, paid before timing.
'''),
]

# --------------------------------------------------------------------------- 03
NB03 = [
    code('''
# Parameters (papermill). Defaults: the small CPU configuration nbval re-runs.
device = "auto"
tokens = 64  # one 1024x1024 image is 5476 vision tokens
heads = 4
head_dim = 72
dtype = "bfloat16"
layers = 27  # MoonViT's depth, for per-forward counts
variants = []  # empty: every variant
data_dir = ""  # where to upsert launches.csv; empty: do not save
report_dir = ""  # where to write traces/<variant>.json.gz; empty: do not save
''', params=True),
    md('''
# 3. What each variant launches: torch.profiler

**Question.** How many kernels does the RoPE step of one MoonViT attention block launch per
variant, and where does its device time go? STUDY_FACTS derives 6 for the native path (an
upcast, a complex multiply and a downcast, for q and for k), about 8 for what vLLM merged
(two cos/sin copies, then upcast, rotary kernel and downcast for q and for k) and 1 for a
fused kernel.

**Method.** On a GPU: torch.profiler around one call (after warm-up) on q/k views of a packed
qkv buffer, counting device operations (kernels, copies); a Chrome trace per variant is saved
gzipped. On a CPU there are no device kernels: the count comes from the operator dispatcher
plus Triton launches (`rope_kernels.bench.launches`), labelled as such.
'''),
    code(SETUP + '''
from rope_kernels import VARIANTS
from rope_kernels.bench.launches import count_launches
from rope_kernels.bench.microbench import Shape, make_arg_sets, parse_dtype
names = variants or list(VARIANTS)
dt = parse_dtype(dtype)
xq, xk, freqs = make_arg_sets(Shape(tokens, heads, head_dim), dt, dev, 1)[0]
derived = {"native": 6, "vllm_merged": 8, "fused": 1, "fused_inplace": 1}
'''),
    code(PROVENANCE),
    code('''
rows, kernel_tables = [], {}
for name in names:
    v = VARIANTS[name]
    if dev.type == "cuda":
        from rope_kernels.bench.profiling import kernel_summary, profile_call
        trace = Path(report_dir) / "traces" / f"{name}.json.gz" if report_dir else None
        kernels = profile_call(v, (xq, xk, freqs), trace_path=trace)
        measured, source = len(kernels), "torch.profiler (device ops)"
        kernel_tables[name] = kernel_summary(kernels)
    elif name == "compiled":
        measured, source = None, "n/a on CPU (Inductor's C++ kernels bypass the dispatcher)"
    else:
        measured, _ = count_launches(v, xq, xk, freqs)
        source = "dispatcher + Triton launches (CPU stand-in)"
    rows.append({"variant": name, "launches_per_call": measured, "recorded": v.launch_count(dt),
                 "study_facts": derived.get(name), "per_forward": None if measured is None else measured * layers,
                 "source": source})
launches = pd.DataFrame(rows)
launches
'''),
    code('''
checked = launches.dropna(subset=["launches_per_call"])
assert (checked.launches_per_call == checked.recorded).all(), checked
if data_dir:
    from rope_kernels.study.results import upsert_csv
    out = launches.assign(tokens=tokens, heads=heads, head_dim=head_dim, dtype=dtype, layers=layers,
                          **provenance(kind))
    upsert_csv(Path(data_dir) / "launches.csv", out, ["variant", "tokens", "heads", "head_dim", "dtype", "device_name"])
'''),
    md('''
## Device time per kernel

Where one call's device time goes (GPU only). The native path's time is spread over copies and
the complex multiply; the merged path adds the cos/sin copies and runs the rotary kernel twice.
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
if kernel_tables:
    for name, table in kernel_tables.items():
        print(f"--- {name}: {table.launches.sum()} launches, {table.device_time_us.sum():.1f} us")
        display(table.assign(kernel=table.kernel.str.slice(0, 90)).round(2))
else:
    print("no device kernels on the CPU")
'''),
    md('''
**Reading the counts.** `recorded` is the figure in `rope_kernels.VARIANTS`; the assertion above
fails the notebook if the profiler disagrees. Differences from STUDY_FACTS: `compiled` is one
Inductor kernel for q and k together; `liger` copies q and k into contiguous buffers first
(2 copies + 1 kernel) because it rotates in place; on fp32 data the casts disappear (native 2,
merged 4).
'''),
]

# --------------------------------------------------------------------------- 04
NB04 = [
    code('''
# Parameters (papermill). Defaults: the small CPU configuration nbval re-runs.
device = "auto"
encoder = "small"  # small (CPU-sized) | kimi_k25 (27 layers, 1152 wide, 16 x 72)
layers = 0  # 0: the encoder's own depth
dtype = "bfloat16"
resolutions = ["56x56", "112x84"]
image_counts = [1, 2]
variants = ["native", "fused", "fused_inplace", "vllm_merged", "none"]
modes = ["eager"]  # eager | cudagraph
samples = 2
attention = "auto"  # auto | sdpa_cudnn_batched | sdpa_batched | varlen_attn | sdpa_per_image
max_tokens = 400000  # skip buckets with more vision tokens than this (memory)
prefill_tokens_per_s = 0.0  # > 0: add a modeled TTFT = encoder + LLM prefill (a model, labelled)
seed = 0
progress = True
data_dir = ""  # where to upsert ttft.csv; empty: do not save
''', params=True),
    md('''
# 4. The vision encoder: latency versus image count

**Question.** Users feel a kernel as time-to-first-token of a multimodal request. How much
does the RoPE choice change the Kimi-K2.5 vision encoder's latency as images per request
grow, and how close does each variant get to the floor (the same encoder with RoPE skipped)?

**Method.** A MoonViT-shaped encoder with the real dimensions (27 layers, hidden 1152, 16 heads
x 72, MLP 4304 with tanh GELU, LayerNorms, qkv/out projections with bias, 2x2 patch merge and
projector to 7168), seeded random bf16 weights. Images are turned into patch grids by Kimi's
resize rule, the 2D RoPE table is built once per forward and shared by all layers, attention
is block-diagonal per image with the best kernel available here (named in every row). Only
the RoPE step differs between variants. All variants of a bucket are timed round-robin
(drift hits them alike), eager and as one CUDA graph of the whole encoder per bucket. Besides
each variant's median, every round is compared within itself (`paired_saving_pct`: native's
time minus the variant's over native's, that round; `paired_rope_cost_ms`: the variant minus
the floor, that round), and those per-round numbers are summarised (median, p20, p80): the
pairing cancels drift that moves a whole round, which separate medians keep.
'''),
    code(SETUP + '''
import matplotlib.pyplot as plt
from rope_kernels.bench.encoder_bench import (bucket_samples, forward_peak_mb, make_bucket, outputs_agree,
                                        paired_stats, rope_minimal_ms, rope_profile)
from rope_kernels.bench.microbench import parse_dtype
from rope_kernels.bench.timing import copy_bandwidth_gbps, summarize
from rope_kernels.bench.vit import EncoderConfig, MoonViTEncoder, encoder_inputs, pick_attention
cfg = {"small": EncoderConfig.small, "kimi_k25": EncoderConfig.kimi_k25}[encoder]()
if layers:
    cfg = cfg.with_layers(layers)
model = MoonViTEncoder(cfg, device=dev, dtype=parse_dtype(dtype), seed=seed)
'''),
    code(PROVENANCE),
    md("Patch grids and token counts per bucket (vision tokens before the merge; the LLM sees a quarter):"),
    code('''
buckets = [make_bucket(r, n) for r in resolutions for n in image_counts]
skipped = [b for b in buckets if b.vit_tokens > max_tokens]
buckets = [b for b in buckets if b.vit_tokens <= max_tokens]
pd.DataFrame([{"resolution": b.resolution, "images": b.images, "grid (t,h,w)": b.grids[0],
               "vit_tokens": b.vit_tokens, "llm_tokens": b.llm_tokens} for b in buckets])
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
copy_gbps = copy_bandwidth_gbps(dev)
print(f"copy ceiling {copy_gbps:.0f} GB/s; skipped (over max_tokens): {[(b.resolution, b.images) for b in skipped]}")
'''),
    md("Native and fused encoders must agree (same kernels elsewhere; RoPE differs only in rounding order):"),
    code('''
check_bucket = buckets[0]
inp = encoder_inputs(check_bucket.grids, cfg, device=dev, dtype=parse_dtype(dtype), seed=seed)
att = pick_attention(check_bucket.grids, dev) if attention == "auto" else attention
agree = outputs_agree(model, inp, att)
bf16_step = agree["scale"] * 2 ** -7  # one bf16 ulp at the output's largest magnitude
agree_table = pd.DataFrame([{"variant": v, "max_abs_diff_vs_native": d, "within_2_bf16_ulps": d <= 2 * bf16_step}
                            for v, d in agree.items() if v != "scale"])
assert agree_table.within_2_bf16_ulps.all(), agree_table
agree_table[["variant", "within_2_bf16_ulps"]]
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
from tqdm import tqdm
rows = []
work = [(b, m) for b in buckets for m in modes]
for b, mode in tqdm(work, desc="encoder buckets", disable=not progress):
    inp = encoder_inputs(b.grids, cfg, device=dev, dtype=parse_dtype(dtype), seed=seed)
    att = pick_attention(b.grids, dev) if attention == "auto" else attention
    if mode == modes[0]:  # properties of the kernels, not of the launch mode
        profiled = {v: rope_profile(model, inp, v, att) for v in variants}  # (rope ms, all ms)
        peaks = {v: forward_peak_mb(model, inp, v, att) for v in variants}
    timer, times = bucket_samples(model, inp, variants, mode, att, samples=samples)
    for v, ts in times.items():
        t = summarize(ts, timer, 1)
        rows.append({"variant": v, "resolution": b.resolution, "images": b.images,
                     "vit_tokens": b.vit_tokens, "llm_tokens": b.llm_tokens, "mode": mode,
                     "attention_kernel": att, "timer": t.timer, "median_ms": t.median_us / 1e3,
                     "p20_ms": t.p20_us / 1e3, "p80_ms": t.p80_us / 1e3, "samples": t.samples,
                     "rope_share": profiled[v][0] / profiled[v][1], "rope_device_ms": profiled[v][0],
                     "copy_gbps": copy_gbps, "peak_mem_mb": peaks[v],
                     "layers": cfg.layers, "encoder": encoder,
                     **{f"paired_{k}": x for k, x in paired_stats(times, v).items()}})
    del inp
ttft = pd.DataFrame(rows).assign(**provenance(kind))
if prefill_tokens_per_s > 0:
    ttft["modeled_ttft_ms"] = ttft.median_ms + ttft.llm_tokens / prefill_tokens_per_s * 1e3
if data_dir:
    from rope_kernels.study.results import TTFT_KEY, upsert_csv
    upsert_csv(Path(data_dir) / "ttft.csv", ttft, TTFT_KEY)
ttft.pivot_table(index=["resolution", "images", "mode"], columns="variant", values="median_ms").round(2)
'''),
    md("## Encoder latency versus image count (the floor, RoPE skipped, dashed)"),
    code('''
# NBVAL_IGNORE_OUTPUT
res = sorted(set(ttft.resolution), key=resolutions.index)
fig, axes = plt.subplots(len(modes), len(res), figsize=(4.2 * len(res), 3.2 * len(modes)), squeeze=False)
for i, mode in enumerate(modes):
    for j, r in enumerate(res):
        ax = axes[i][j]
        sub = ttft[(ttft["mode"] == mode) & (ttft.resolution == r)]
        for v, g in sub.groupby("variant", sort=False):
            ax.plot(g.images, g.median_ms, marker="o", ls="--" if v == "none" else "-",
                    color="k" if v == "none" else None, label="none (floor)" if v == "none" else v)
        ax.set_xscale("log", base=2); ax.set_yscale("log")
        ax.set_title(f"{r}, {mode}"); ax.set_xlabel("images per request"); ax.set_ylabel("encoder ms")
axes[0][-1].legend(fontsize=8)
fig.tight_layout(); plt.show()
'''),
    md("## What the RoPE choice saves over native, and what it costs over the floor"),
    code('''
# NBVAL_IGNORE_OUTPUT
wide = ttft.pivot_table(index=["resolution", "images", "vit_tokens", "mode"], columns="variant",
                        values="median_ms").reset_index()
for v in variants:
    if v in ("native",) or v not in wide:
        continue
    wide[f"{v}_saving_ms"] = wide["native"] - wide[v]
    wide[f"{v}_saving_pct"] = 100 * (wide["native"] - wide[v]) / wide["native"]
    if "none" in wide and v != "none":
        wide[f"{v}_rope_cost_ms"] = wide[v] - wide["none"]
wide["rope_minimal_ms"] = [rope_minimal_ms(t, cfg.heads, cfg.head_dim, cfg.layers, copy_gbps)
                           for t in wide.vit_tokens]
if "fused_rope_cost_ms" in wide:
    wide["fused_cost_over_minimal"] = wide["fused_rope_cost_ms"] / wide["rope_minimal_ms"]
cols = [c for c in wide.columns if c.endswith(("saving_ms", "saving_pct")) or c in
        ("resolution", "images", "mode", "fused_rope_cost_ms", "rope_minimal_ms", "fused_cost_over_minimal")]
wide[cols].round(2)
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
sav = [c for c in wide.columns if c.endswith("saving_pct") and not c.startswith("none")]
fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 3.2), squeeze=False)
for ax, mode in zip(axes[0], modes):
    sub = wide[wide["mode"] == mode]
    for r in res:
        s = sub[sub.resolution == r]
        for c in sav:
            ax.plot(s.images, s[c], marker="o", label=f"{c.removesuffix('_saving_pct')} {r}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2); ax.set_xlabel("images per request"); ax.set_ylabel("saving over native (%)")
    ax.set_title(mode)
axes[0][-1].legend(fontsize=7)
fig.tight_layout(); plt.show()
'''),
    md("## RoPE's share of encoder time (profiler: its kernels' device time over all device time)"),
    code('''
# NBVAL_IGNORE_OUTPUT
ttft[ttft["mode"] == modes[0]].pivot_table(index=["resolution", "images"], columns="variant",
                                          values="rope_share").mul(100).round(2)
'''),
    md("RoPE's device time in one forward, measured in place, against the physical minimum of its bytes:"),
    code('''
# NBVAL_IGNORE_OUTPUT
in_place = ttft[ttft["mode"] == modes[0]].pivot_table(index=["resolution", "images", "vit_tokens"],
                                                      columns="variant", values="rope_device_ms").reset_index()
in_place["rope_minimal_ms"] = [rope_minimal_ms(t, cfg.heads, cfg.head_dim, cfg.layers, copy_gbps)
                               for t in in_place.vit_tokens]
for v in variants:
    if v in in_place and v != "none":
        in_place[f"{v}_over_minimal"] = in_place[v] / in_place["rope_minimal_ms"]
in_place.round(3)
'''),
    md('''
## Targets (GPU profile)

At 16 images of 1024x1024, in both modes: the fused encoder's RoPE cost (fused minus none) at
most 1.2x the physical minimum (27 layers x RoPE's minimal bytes / copy bandwidth), and the
fused encoder at least 7% faster than native.

RoPE's cost is about 1.5% of this encoder's time while one forward varies by about 1% from
round to round, so "fused minus none" resolves it only to a few ms; the in-place device time
from the profiler (printed below the tables) measures the same cost directly.
'''),
    code('''
# NBVAL_IGNORE_OUTPUT
t16 = wide[(wide.resolution == "1024x1024") & (wide.images == 16)]
if len(t16) and "fused_rope_cost_ms" in t16:
    display(t16[["mode", "native", "fused", "none", "fused_rope_cost_ms", "rope_minimal_ms",
                 "fused_cost_over_minimal", "fused_saving_pct"]].assign(
        cost_met=t16.fused_cost_over_minimal <= 1.2, saving_met=t16.fused_saving_pct >= 7).round(3))
    p16 = ttft[(ttft.resolution == "1024x1024") & (ttft.images == 16) & (ttft.variant == "fused")]
    minimal = rope_minimal_ms(int(p16.vit_tokens.iloc[0]), cfg.heads, cfg.head_dim, cfg.layers, copy_gbps)
    print("per-round (paired) estimates, median [p20, p80]:")
    display(p16[["mode", "paired_saving_pct", "paired_saving_pct_p20", "paired_saving_pct_p80",
                 "paired_rope_cost_ms", "paired_rope_cost_ms_p20", "paired_rope_cost_ms_p80"]].assign(
        rope_minimal_ms=minimal, cost_over_minimal=p16.paired_rope_cost_ms / minimal,
        cost_met=p16.paired_rope_cost_ms / minimal <= 1.2, saving_met=p16.paired_saving_pct >= 7).round(3))
    in_place = p16.rope_device_ms.iloc[0]
    print(f"RoPE measured in place (profiler, fused kernels' device time in one forward): "
          f"{in_place:.3f} ms = {in_place / minimal:.3f}x the {minimal:.3f} ms minimum")
else:
    print("targets are defined for 16 images of 1024x1024 (the GPU profile)")
'''),
    md('''
**Caveats.** Random weights: the latency is the real model's (same shapes, same kernels), the
outputs are not. Attention uses PyTorch's kernels (no flash_attn package on the H200 here).
A modeled TTFT (encoder + LLM prefill at `prefill_tokens_per_s`) is only added when that
parameter is set, and is a model, not a measurement.
'''),
]

# --------------------------------------------------------------------------- 05
NB05 = [
    code('''
# Parameters (papermill)
data_root = "../data"  # merges data/<device>/*.csv across devices
''', params=True),
    md('''
# 5. Across devices

Each device's runs land in `data/<device>/`; this notebook merges them, one row per device,
so results from several GPUs and nodes form one comparison (the same table heads
`reports/index.html`). Every figure comes from the committed CSVs, with the commit that made it.
'''),
    code('''
import pandas as pd
from pathlib import Path
from rope_kernels.study.summary import all_devices, load_device_tables
pd.set_option("display.width", 200)
summary = all_devices(Path(data_root))
summary.T if len(summary) else "no device data yet"
'''),
    md("Provenance of every CSV row, per device and file:"),
    code('''
frames = []
for name in ("microbench.csv", "ttft.csv", "launches.csv", "correctness.csv", "fused_configs.csv"):
    df = load_device_tables(Path(data_root), name)
    if len(df):
        frames.append(df.groupby("device_folder").agg(
            rows=("device_name", "size"), device=("device_name", "first"), torch=("torch_version", "first"),
            triton=("triton_version", "first"), commits=("git_commit", lambda s: ", ".join(sorted(set(s))))
        ).assign(file=name).reset_index())
pd.concat(frames, ignore_index=True) if frames else "no device data yet"
'''),
]


def write(name, cells):
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.metadata["language_info"] = {"name": "python"}
    path = ROOT / "notebooks" / f"{name}.ipynb"
    nbformat.write(nb, str(path))
    print("wrote", path)


if __name__ == "__main__":
    write("01_kernels", NB01)
    write("02_microbench", NB02)
    write("03_profile", NB03)
    write("04_ttft", NB04)
    write("05_summary", NB05)
