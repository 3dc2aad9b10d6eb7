# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python (rope-study)
#     language: python
#     name: rope-study
# ---

# %% tags=["parameters"]
# Parameters (papermill). Defaults: the small CPU configuration nbval re-runs.
device = "auto"  # auto | cpu | cuda | rocm
dtypes = ["float32", "bfloat16", "float16"]
shapes = [[7, 3, 72], [16, 2, 128], [1, 1, 4]]  # [tokens, heads, head_dim]
variants = []  # empty: every variant in rope_kernels.VARIANTS
seed = 0
data_dir = ""  # where to upsert correctness.csv; empty: do not save

# %% [markdown]
# # 1. The kernels and their correctness
#
# **Question.** vLLM PR #50400 replaced the RoPE of Kimi-K2.5's vision tower (a complex
# multiplication in PyTorch, several kernels per layer) with a fused Triton path. Do all
# the implementations this study compares compute the same function, and how accurately?
#
# **The math.** Kimi rotates *adjacent* pairs `(x[2j], x[2j+1])` of every head (GPT-J
# style, not NeoX halves) by the angle in `freqs_cis[t, j]`, a unit complex number:
#
#     out[2j]   = x[2j] * cos - x[2j+1] * sin
#     out[2j+1] = x[2j] * sin + x[2j+1] * cos
#
# The 2D table alternates axes: pair `2i` turns by `column * f_i`, pair `2i+1` by
# `row * f_i`, with `f_i = theta^(-4i/head_dim)`. q and k arrive as strided views of a
# packed `(T, 3, H, D)` qkv buffer (token stride `3*H*D`).
#
# **Method.** Every variant is checked against a float64 reference on random inputs (never
# zeros): in fp32 the error must stay under 1e-5 of the output scale; in bf16/fp16 a
# variant may be at most 2x as far from float64 as PyTorch's own native path in the same
# dtype (plus a tiny floor), the rule flash-attention's tests use.

# %%
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

from rope_kernels import VARIANTS, cos_sin_views, fused_qk_rope, native_rope, rope_cos_sin
from rope_kernels.bench.correctness import check_variant
from rope_kernels.bench.microbench import parse_dtype
from rope_kernels.study.notebooks import show_source
from rope_kernels.kernels.fused import _fused_qk_rope_kernel, _rotate_pairs, fused_launch_config

# %%
# NBVAL_IGNORE_OUTPUT
pd.Series(provenance(kind)).to_frame("this run")

# %% [markdown]
# ## The native path (Kimi before the PR)
#
# Per tensor: an fp32 upcast copy, the complex multiply, a downcast copy: 3 kernels for q,
# 3 for k, each moving the data again. Rendered from the library's source:

# %%
show_source(native_rope)

# %% [markdown]
# ## The fused kernel
#
# One launch rotates q and k together. A program owns a few tokens x a group of heads x
# the whole head_dim, covered by at most two power-of-two chunks (72 = 64 + 8). cos/sin are
# read once per token straight from `freqs_cis` (strided views, no copy) and broadcast over
# the heads; the math is fp32 whatever the data type. Rendered from the library's source:

# %%
show_source(_rotate_pairs)
show_source(_fused_qk_rope_kernel)

# %% [markdown]
# The launch settings come from a small documented heuristic, not autotuning, so one compile serves every token count:

# %%
show_source(fused_launch_config)

# %% [markdown]
# ## Every variant, every dtype
#
# `launches` is the number of kernels one call makes (bf16 data), recorded beside each
# variant and checked against the profiler in notebook 3.

# %%
names = variants or list(VARIANTS)
pd.DataFrame([{"variant": n, "launches": VARIANTS[n].launches,
               "launches_fp32": VARIANTS[n].launches_fp32,
               "description": VARIANTS[n].description} for n in names])

# %%
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

# %%
summary = correctness.groupby(["variant", "dtype"]).passed.all().unstack()
summary

# %%
assert correctness.passed.all(), correctness[~correctness.passed]
if data_dir:
    from rope_kernels.study.results import upsert_csv
    out = correctness.assign(**provenance(kind))
    upsert_csv(Path(data_dir) / "correctness.csv", out,
               ["variant", "dtype", "tokens", "heads", "head_dim", "device_name"])


# %% [markdown]
# ## Try your own variant
#
# Write any function `(xq, xk, freqs_cis) -> (q, k)` below. The harness checks it against the
# float64 reference on fresh random data and times it beside native and fused (on a GPU also
# with CUDA graphs). The example is the real-arithmetic form that `torch.compile` fuses.

# %%
def my_rope(xq, xk, freqs_cis):
    cos, sin = cos_sin_views(freqs_cis)      # strided views, no copy
    return rope_cos_sin(xq, xk, cos, sin)    # edit me

tokens, heads, head_dim = shapes[0]
mine = check_variant(my_rope, tokens=tokens, heads=heads, head_dim=head_dim,
                     dtype=torch.bfloat16, device=dev, seed=seed, name="my_rope")
pd.DataFrame([mine.as_dict()])[["variant", "max_abs_err", "tolerance", "passed"]].style.format(
    {"max_abs_err": "{:.1e}", "tolerance": "{:.1e}"}).hide(axis="index")

# %%
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

# %% [markdown]
# **Caveats.** On a CPU the Triton kernels run in Triton's interpreter, which this project
# patches to round fp32 to bf16 to nearest even as GPUs do (the interpreter truncates); CPU
# timings say nothing about GPU speed. `fused_inplace` rotates the caller's q/k in place
# (inside the packed qkv buffer); the checker verifies v is untouched.
