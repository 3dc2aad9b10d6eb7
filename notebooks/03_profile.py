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
device = "auto"
tokens = 64  # one 1024x1024 image is 5476 vision tokens
heads = 4
head_dim = 72
dtype = "bfloat16"
layers = 27  # MoonViT's depth, for per-forward counts
variants = []  # empty: every variant
data_dir = ""  # where to upsert launches.csv; empty: do not save
report_dir = ""  # where to write traces/<variant>.json.gz; empty: do not save

# %% [markdown]
# # 3. What each variant launches: torch.profiler
#
# **Question.** How many kernels does the RoPE step of one MoonViT attention block launch per
# variant, and where does its device time go? Reading the code gives 6 for the native path (an
# upcast, a complex multiply and a downcast, for q and for k), about 8 for what vLLM merged
# (two cos/sin copies, then upcast, rotary kernel and downcast for q and for k; our re-creation
# is `rope_kernels/kernels/vllm_merged_recreated.py`) and 1 for a fused kernel.
#
# **Method.** On a GPU: torch.profiler around one call (after warm-up) on q/k views of a packed
# qkv buffer, counting device operations (kernels, copies); a Chrome trace per variant is saved
# gzipped. On a CPU there are no device kernels: the count comes from the operator dispatcher
# plus Triton launches (`rope_kernels.bench.launches`), labelled as such.

# %%
from pathlib import Path

import pandas as pd
import torch

from rope_kernels.study.devices import data_line, provenance
from rope_kernels.study.notebooks import check_parameters, notebook_setup
from rope_kernels.study.plots import with_units

from rope_kernels import VARIANTS
from rope_kernels.bench.launches import count_launches
from rope_kernels.bench.microbench import Shape, make_arg_sets, parse_dtype

kind, dev = notebook_setup(device)  # quiet known warnings, display and plot style
check_parameters("03_profile", globals(), kind)  # the runner's rules and messages, for plain papermill too
names = variants or list(VARIANTS)
dt = parse_dtype(dtype)
xq, xk, freqs = make_arg_sets(Shape(tokens, heads, head_dim), dt, dev, 1)[0]
derived = {"native": 6, "vllm_merged": 8, "vllm_merged_recreated": 8, "vllm_packed_qk": 1,
           "sglang_vision": 1, "fused": 1, "fused_inplace": 1}
print(f"Profiled shape: {tokens} tokens x {heads} heads x head_dim {head_dim}, {dtype}; q and k are "
      f"strided views of a packed ({tokens}, 3, {heads}, {head_dim}) qkv buffer. "
      f"Per-forward counts: x {layers} layers.")

# %% tags=["appendix"]
# NBVAL_IGNORE_OUTPUT
pd.Series(provenance(kind)).to_frame("this run")

# %%
rows, kernel_tables = [], {}
for name in names:
    v = VARIANTS[name]
    if why := v.unsupported(dt, head_dim=head_dim):
        print(f"{name}: not run at head_dim {head_dim} in {dtype} ({why})")
        continue
    if dev.type == "cuda":
        from rope_kernels.bench.profiling import kernel_summary, profile_call
        trace = Path(report_dir) / "traces" / f"{name}.json.gz" if report_dir else None
        kernels = profile_call(v, (xq, xk, freqs), trace_path=trace)
        measured, source = len(kernels), "torch.profiler (device ops)"
        kernel_tables[name] = kernel_summary(kernels)
    elif name == "compiled":
        measured, source = None, "n/a on CPU (Inductor's C++ kernels bypass the dispatcher)"
    else:
        v(xq, xk, freqs)  # warm-up, as profile_call does: what a peer caches per freqs_cis is not per call
        measured, _ = count_launches(v, xq, xk, freqs)
        source = "dispatcher + Triton launches (CPU stand-in)"
    rows.append({"variant": name, "launches_per_call": measured, "recorded": v.launch_count(dt),
                 "derived_from_code": derived.get(name), "per_forward": None if measured is None else measured * layers,
                 "source": source, **v.peer_columns})
launches = pd.DataFrame(rows)
with_units(launches)

# %%
checked = launches.dropna(subset=["launches_per_call"])
assert (checked.launches_per_call == checked.recorded).all(), checked
if data_dir:
    from rope_kernels.study.results import upsert_csv
    from rope_kernels.study.specs import LAUNCHES_CSV
    out = launches.assign(tokens=tokens, heads=heads, head_dim=head_dim, dtype=dtype, layers=layers,
                          **provenance(kind))
    written = Path(data_dir) / LAUNCHES_CSV
    upsert_csv(written, out)  # key: specs.RESULT_FILES
    print(data_line(written))  # what this report wrote; tests compare it with the CSV

# %% [markdown]
# ## Device time per kernel
#
# Where one call's device time goes (GPU only). The native path's time is spread over copies and
# the complex multiply; the merged path adds the cos/sin copies and runs the rotary kernel twice.

# %%
# NBVAL_IGNORE_OUTPUT
if kernel_tables:
    for name, table in kernel_tables.items():
        print(f"--- {name}: {table.launches.sum()} launches, {table.device_time_us.sum():.1f} us")
        display(with_units(table.assign(kernel=table.kernel.str.slice(0, 90))).round(2))
else:
    print("no device kernels on the CPU")

# %% [markdown]
# **Reading the counts.** `recorded` is the figure in `rope_kernels.VARIANTS`; the assertion above
# fails the notebook if the profiler disagrees. Differences from the counts derived from the code:
# `compiled` is one
# Inductor kernel for q and k together; `liger` copies q and k into contiguous buffers first
# (2 copies + 1 kernel) because it rotates in place; on fp32 data the casts disappear (native 2,
# merged 4).
