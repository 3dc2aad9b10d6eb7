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
variants = []  # empty: every variant in rope_kernels.VARIANTS
families = [{"tokens": [16, 33], "heads": [2], "head_dim": [8, 72]}]
dtypes = ["bfloat16"]
modes = ["eager"]  # eager | cudagraph | cudagraph_warm (GPU only for the graph modes)
samples = 3
config_sweep = False  # time fused launch configs (block sizes) on sweep_shapes
sweep_shapes = [[8192, 16, 72]]  # [tokens, heads, head_dim]
progress = True
data_dir = ""  # where to upsert microbench.csv (and fused_configs.csv); empty: do not save

# %% [markdown]
# # 2. Microbenchmarks: speedup, roofline, and PR #50400's table
#
# **Question.** Does a fused q/k RoPE kernel deliver the PR's published 5.7x-8.5x over the
# native path, does what vLLM actually merged, and how close to the hardware limit do the
# kernels get against what users would otherwise pick (torch.compile, Liger)?
#
# **Method.** For each shape (tokens x heads x head_dim), dtype, variant and mode:
# - *eager*: a Python loop of calls between CUDA events (launch overhead included): how vLLM runs
#   its vision tower unless encoder CUDA graphs are on, so the report opens with each eager call's
#   host time beside its device time (the cold CUDA-graph time of the same shape);
# - *cudagraph*: the same calls captured in one CUDA graph and replayed (the PR's method);
# - *cudagraph_warm*: replays on a single input set, so small shapes run from L2, the way
#   many published tables are measured; shown beside, never instead of, the cold numbers.
#
# Calls rotate over enough input sets to cover twice the L2 cache; warm-up first; the median
# (and p20/p80) of many samples. q/k are strided views of a packed qkv buffer; `in_place` says
# whether a variant writes into them (compare in place with in place). Two references, both
# in every row:
# - the **copy ceiling** (`copy_gbps`): a 2 GiB device-to-device copy measured once per run
#   (bytes read + written); `pct_of_copy` is the minimal traffic (read and write q and k, read
#   fp32 cos/sin once) over time, against it;
# - the **same-bytes copy** (`same_bytes_copy_us`, `rope_kernels/bench/same_bytes_copy.py`):
#   Triton SM copies that read q, k and cos/sin where the call reads them and write q and k
#   where the call writes them (fresh outputs, or in place for in-place variants), in a small
#   family of tilings (a token row's column blocks; whole tokens per program at 4 KB and
#   1 KB; flat blocks; the engines' own cuts: vLLM's tokens x one head, SGLang's pairs per
#   program, with vector or with scalar loads; and the fused kernel itself with its rotation
#   replaced by a gate on cos/sin),
#   each timed in the same rounds on the same input sets; the fastest is the limit at that
#   size (`same_bytes_copy_tiling` names it, `same_bytes_copy_p20_us`/`_p80_us` give its
#   noise band). `pct_of_same_bytes_copy` is its time over the variant's; no variant
#   should exceed 100% beyond noise.
#
# On a CPU the timer is the wall clock and the numbers are not GPU predictions.

# %%
from pathlib import Path

import pandas as pd
import torch

from rope_kernels import VARIANTS
from rope_kernels.bench.microbench import run_microbench
from rope_kernels.bench.timing import copy_bandwidth_gbps
from rope_kernels.study import plots
from rope_kernels.study.devices import data_line, provenance
from rope_kernels.study.notebooks import check_parameters, notebook_setup
from rope_kernels.study.plots import with_units
from rope_kernels.study.summary import pr_comparison
from rope_kernels.variants import peer_status

kind, dev = notebook_setup(device)  # quiet known warnings, display and plot style
check_parameters("02_microbench", globals(), kind)  # the runner's rules and messages, for plain papermill too
names = variants or list(VARIANTS)

# %% tags=["appendix"]
# NBVAL_IGNORE_OUTPUT
pd.Series(provenance(kind)).to_frame("this run")

# %% [markdown] tags=["appendix"]
# Which peers ran here, from which package, version and source hash (sha256 of the file(s) the
# peer runs), and why the others did not:

# %% tags=["appendix"]
# NBVAL_IGNORE_OUTPUT
pd.DataFrame(peer_status())[["name", "available", "package", "version", "origin", "sha256", "reason"]]

# %%
# NBVAL_IGNORE_OUTPUT
copy_gbps = copy_bandwidth_gbps(dev)
print(f"device-to-device copy ceiling: {copy_gbps:.0f} GB/s (bytes read + written)")

# %%
# NBVAL_IGNORE_OUTPUT
bench = run_microbench(names, families, dtypes, modes, device=dev, copy_gbps=copy_gbps,
                       samples=samples, progress=progress)
if data_dir:
    from rope_kernels.study.results import upsert_csv
    from rope_kernels.study.specs import MICROBENCH_CSV
    written = Path(data_dir) / MICROBENCH_CSV
    upsert_csv(written, bench)  # key: specs.RESULT_FILES
    print(data_line(written))  # what this report wrote; tests compare it with the CSV
# Kimi's and the PR's rows rotate interleaved pairs; Qwen's towers (a family {tower: ...}) rotate
# halves: their rows are shown apart below (Qwen3-VL is 16 x 72 like Kimi-K2.5)
half = bench[bench["rotation"] == "half"]
bench = bench[bench["rotation"] == "pairs"]
with_units(bench[["variant", "in_place", "tokens", "heads", "head_dim", "dtype", "mode", "median_us",
                  "p20_us", "p80_us", "pct_of_copy", "pct_of_same_bytes_copy", "speedup_vs_native",
                  "launches", "peak_mem_mb"]]).round(2)

# %% [markdown]
# What each variant launches and allocates per call (beyond its inputs; NaN on the CPU, where it is not measured):

# %%
with_units(bench.groupby("variant")[["launches"]].first().reindex(names))


# %% [markdown]
# ## Speedup over native
#
# One panel per head layout (heads x head_dim); the PR's rows are 3/6/12 heads x 128, Kimi-K2.5's
# vision tower is 16 x 72 (2 and 4 heads per rank under tensor parallelism).

# %%
# NBVAL_IGNORE_OUTPUT
plots.kernel_panels(bench, "speedup_vs_native", "speedup over native [x]", hline=1.0, logy=True,
                    dtype=dtypes[0], variants=names);

# %% [markdown]
# ## Roofline view: % of the copy ceiling
#
# RoPE does a handful of flops per byte, so it is memory-bound: the only ceiling that matters is
# bandwidth. 100% would move the minimal bytes at copy speed. Below a few thousand tokens every
# variant is bound by launch latency instead.

# %%
# NBVAL_IGNORE_OUTPUT
plots.kernel_panels(bench, "pct_of_copy", "of device-to-device copy bandwidth [%]", hline=100.0,
                    dtype=dtypes[0], variants=names);

# %% [markdown]
# The same traffic against the same-bytes SM copy of each shape (in-place variants against the
# in-place copy), timed in the same rounds: 100% is as fast as copying those bytes.

# %%
# NBVAL_IGNORE_OUTPUT
plots.kernel_panels(bench, "pct_of_same_bytes_copy", "of the same-bytes SM copy [%]", hline=100.0,
                    dtype=dtypes[0], variants=names);

# %% [markdown]
# ## Against PR #50400's published table
#
# The PR reports bf16 CUDA-graph times for 256-8192 tokens x 3/6/12 heads x 128 (its GPU is not
# stated; `data/reference/pr50400_table.csv`). Our native and fused, same shapes, both L2 regimes:

# %%
# NBVAL_IGNORE_OUTPUT
import matplotlib.pyplot as plt

from rope_kernels.study.targets import PR_TABLE_CSV

pr = pd.read_csv(PR_TABLE_CSV)
cmp = {m: pr_comparison(bench, pr, m) for m in ("cudagraph", "cudagraph_warm") if m in set(bench["mode"])}
if not any(len(c) for c in cmp.values()):
    print("No PR shapes in this grid (the CPU default); the GPU profile includes all 12 rows.")
else:
    plots.pr_table_plot(cmp, bench)
    plt.show()
    display(with_units(pd.concat({m: c.set_index(["tokens", "heads"])[[
        "native_us", "fused_us", "speedup", "our_native_us", "our_fused_us", "our_speedup",
        "fused_at_or_under_pr"]] for m, c in cmp.items()}, axis=1)).round(2))

# %% [markdown]
# ## The study's targets
#
# Judged from the rows above by `rope_kernels.study.targets` (one tested table of every target:
# what, which rows, against what, threshold; `python -m rope_kernels targets` prints it for the
# committed data). Ratios are like for like: an in-place peer against our in-place kernel, an
# out-of-place one against our out-of-place kernel. A time under the physical minimum reads
# "within noise", never "met"; a peer that did not run reads "not measured". Benchmarks, not tests.

# %%
from rope_kernels.study.targets import evaluate, summarize, targets_for

kernel_targets = targets_for("microbench")
verdicts = evaluate({"microbench": bench, "pr_table": pr}, kernel_targets)
display(summarize(verdicts, kernel_targets)[["target", "what", "rule", "regime", "verdict", "counts", "measured"]])
with_units(verdicts.drop(columns=["op", "threshold", "unit"])).round(3)

# %% [markdown]
# ## Qwen's towers: rotate-half
#
# Qwen3-VL (16 heads x 72) and Qwen2.5-VL (16 x 80) rotate x[j] with x[j + D/2]
# (`rotation="half"`); their token counts are 1, 4 and 16 images of 448x448 and 1024x1024 by
# each tower's image rule (`rope_kernels/towers.py`). Every variant that implements rotate-half
# ran (the others, and FlashInfer where its kernel is wrong, are listed as not run above).
# `lead` is the best same-kind peer's time over ours (out of place against `fused`, in place
# against `fused_inplace`), with the band from the p20/p80 times (worst case: ours at p80,
# the peer at p20).

# %%
# NBVAL_IGNORE_OUTPUT
if half.empty:
    print("No rotate-half rows in this grid (the GPU profile has Qwen3-VL's and Qwen2.5-VL's).")
else:
    plots.kernel_panels(half, "pct_of_same_bytes_copy", "rotate-half: of the same-bytes SM copy [%]",
                        hline=100.0, dtype=dtypes[0], variants=names)
    plt.show()
    from rope_kernels.catalogue import names as catalogued

    peers = set(catalogued("rope", peer=True))
    lead_rows = []
    for key, g in half.groupby(["tower", "tokens", "heads", "head_dim", "mode"]):
        for ours in ("fused", "fused_inplace"):
            mine = g[g["variant"] == ours]
            rivals = g[g["variant"].isin(peers) & (g["in_place"] == (ours == "fused_inplace"))]
            if mine.empty or rivals.empty:
                continue
            best = rivals.loc[rivals["median_us"].idxmin()]
            me = mine.iloc[0]
            lead_rows.append(dict(zip(["tower", "tokens", "heads", "head_dim", "mode"], key),
                                  ours=ours, best_peer=best["variant"], ours_us=me["median_us"],
                                  peer_us=best["median_us"], lead=best["median_us"] / me["median_us"],
                                  lead_worst=best["p20_us"] / me["p80_us"],
                                  ours_pct_of_same_bytes_copy=me["pct_of_same_bytes_copy"]))
    display(with_units(pd.DataFrame(lead_rows)).round(3))

# %% [markdown]
# ## Block sizes: the evidence behind the launch heuristic
#
# With `config_sweep=True` the fused rotation is timed under each launch candidate;
# `is_default` marks what `fused_qk_rope` launches by default (out of place, and in place as
# `fused_inplace`): whole-token rows (`rows`: a program owns a few tokens' complete q and k rows,
# `block_h` is then every head) filling 4 KB of q. Beside it, rows filling 1, 2 and 8 KB, the row
# as one padded block (`rows_padded`), and the strategies of
# `rope_kernels/bench/fused_candidates.py` (`strategy`): the earlier default, `tiles` (a
# program owns a few tokens x a group of heads; timed under each tokens/heads per program and
# warps of the block-size grid), on its tile a persistent grid (`programs_per_sm`) and angles
# computed in-kernel from each token's (row, column) instead of a cos/sin read; cache hints on
# the q/k loads and stores (`load_eviction_policy`, `store_cache_modifier`) on rows and tiles.
# Some run in place (`in_place`, on input sets of their own); the table compares the fastest of
# each kind with the default of the same kind.

# %%
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
        from rope_kernels.study.specs import FUSED_CONFIGS_CSV
        written = Path(data_dir) / FUSED_CONFIGS_CSV
        upsert_csv(written, sweep)  # key: specs.RESULT_FILES
        print(data_line(written))  # what this report wrote; tests compare it with the CSV
    kind_of_launch = ["tokens", "heads", "head_dim", "in_place"]
    best = sweep.loc[sweep.groupby(kind_of_launch).median_us.idxmin()]
    chosen = sweep[sweep.is_default]
    display(with_units(best.merge(chosen, on=kind_of_launch, suffixes=("_best", "_default"))[
        kind_of_launch + ["strategy_best", "programs_per_sm_best", "block_t_best", "block_h_best",
                          "num_warps_best", "load_eviction_policy_best", "store_cache_modifier_best",
                          "median_us_best", "pct_of_copy_best", "strategy_default", "block_t_default",
                          "block_h_default", "median_us_default", "pct_of_copy_default"]]).round(2))
else:
    print("config sweep skipped (config_sweep=False or no GPU)")

# %% [markdown]
# **Caveats.** Timings are of the RoPE call alone; in a model its inputs come from the qkv
# projection and may already sit in L2. `peak_mem_mb` is what one call allocates beyond its
# inputs (native's fp32 temporaries against a fused kernel's outputs; nothing in place).
# `compiled` is torch.compile with static shapes: one compile per shape, paid before timing.
