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
# Parameters (papermill)
data_root = "../data"  # merges data/<device>/*.csv across devices
device_folders = "committed"  # committed: devices git tracks (nbval's default); all: local runs too (the runner sets it)

# %% [markdown]
# # 6. Across devices
#
# Each device's runs land in `data/<device>/`; this notebook merges them, one row per device,
# so results from several GPUs and nodes form one comparison (the same table heads
# `reports/index.html`). Every figure comes from the committed CSVs, with the commit that made it.

# %%
# NBVAL_IGNORE_OUTPUT
# (output depends on the devices' data this checkout holds: a local CPU run adds data/cpu)
from pathlib import Path

import pandas as pd

from rope_kernels.study.devices import data_line
from rope_kernels.study.notebooks import check_parameters, report_display
from rope_kernels.study.plots import with_units
from rope_kernels.study.specs import (CORRECTNESS_CSV, ENCODER_LATENCY_CSV, FUSED_CONFIGS_CSV, LAUNCHES_CSV,
                                      MICROBENCH_CSV, QKV_GEMM_CSV)
from rope_kernels.study.summary import all_devices, load_device_tables

report_display()  # whole tables (no "..."), quiet known warnings, the report plot style
check_parameters("06_summary", globals())  # the runner's rules and messages, for plain papermill too
summary = all_devices(Path(data_root), device_folders)
with_units(summary.set_index("device")).T if len(summary) else "no device data yet"

# %% [markdown]
# Per vision tower (`rope_kernels/towers.py`: Kimi-K2.5 rotates interleaved pairs, Qwen3-VL and
# Qwen2.5-VL rotate halves), at the tower's largest timed token count (CUDA graphs, bf16): our
# fused kernel against the best engine kernel of the same kind (out of place against `fused`, in
# place against `fused_inplace`). `lead` is the peer's time over ours, `lead_worst` the peer's
# p20 over our p80 (above 1: ahead beyond noise).

# %%
from rope_kernels.study.summary import tower_rows

towers_table = tower_rows(load_device_tables(Path(data_root), MICROBENCH_CSV, device_folders))
with_units(towers_table).round(3) if len(towers_table) else "no tower rows yet"

# %% [markdown]
# Provenance of every CSV row, per device and file:

# %%
# NBVAL_IGNORE_OUTPUT
# (output depends on the devices' data this checkout holds: a local CPU run adds data/cpu)
frames = []
for name in (MICROBENCH_CSV, ENCODER_LATENCY_CSV, LAUNCHES_CSV, CORRECTNESS_CSV, FUSED_CONFIGS_CSV, QKV_GEMM_CSV):
    df = load_device_tables(Path(data_root), name, device_folders)
    if len(df):
        frames.append(df.groupby("device_folder").agg(
            rows=("device_name", "size"), device=("device_name", "first"), torch=("torch_version", "first"),
            triton=("triton_version", "first"), commits=("git_commit", lambda s: ", ".join(sorted(set(s))))
        ).assign(file=name).reset_index())
for folder in sorted(set(pd.concat(frames)["device_folder"])) if frames else []:
    for path in sorted((Path(data_root) / folder).glob("*.csv")):
        print(data_line(path))  # what this report read; tests compare it with the CSVs
pd.concat(frames, ignore_index=True) if frames else "no device data yet"

# %% [markdown]
# ## The study's targets, per device
#
# Every target the study judges, evaluated on each device's committed rows by
# `rope_kernels.study.targets` (the same table `python -m rope_kernels targets` prints and the
# README reports): met, missed, within noise, or not measured where the rows are absent.

# %%
# NBVAL_IGNORE_OUTPUT
# (output depends on the devices' data this checkout holds: a local CPU run adds data/cpu)
from rope_kernels.study import targets as study_targets

for folder in sorted(set(pd.concat(frames)["device_folder"])) if frames else []:
    verdicts = study_targets.evaluate(study_targets.load_tables(Path(data_root) / folder))
    print(folder)
    display(study_targets.summarize(verdicts)[["target", "what", "rule", "regime", "verdict", "counts",
                                               "measured"]])

# %% [markdown]
# ## Compiled for GPUs we could not run on
#
# The project's Triton kernels (the standalone RoPE kernels and the QKV GEMM: its TMA path with the
# NVIDIA config, its pointer path with the AMD config), compiled ahead of time on a CPU machine by Triton's own
# compiler for AMD gfx942 (MI300X) and gfx90a (MI250) and NVIDIA sm_90 and sm_100
# (`python -m rope_kernels compile-matrix`; `data/compile/compile_matrix.csv`). It proves the
# kernels compile there and what they use (registers, spills, shared memory), not that they run
# correctly or fast there.

# %%
from rope_kernels.bench.compile_matrix import compile_matrix_table
matrix_csv = Path(data_root) / "compile" / "compile_matrix.csv"
compile_matrix_table(matrix_csv) if matrix_csv.exists() else print(
    f"no {matrix_csv.name} under {data_root}/compile: python -m rope_kernels compile-matrix writes it")
