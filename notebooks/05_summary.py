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

# %% [markdown]
# # 5. Across devices
#
# Each device's runs land in `data/<device>/`; this notebook merges them, one row per device,
# so results from several GPUs and nodes form one comparison (the same table heads
# `reports/index.html`). Every figure comes from the committed CSVs, with the commit that made it.

# %%
# NBVAL_IGNORE_OUTPUT
# (output depends on the devices' data this checkout holds: a local CPU run adds data/cpu)
from pathlib import Path

import pandas as pd

from rope_kernels.study.plots import with_units
from rope_kernels.study.summary import all_devices, load_device_tables

pd.set_option("display.width", 200)
summary = all_devices(Path(data_root))
with_units(summary).T if len(summary) else "no device data yet"

# %% [markdown]
# Provenance of every CSV row, per device and file:

# %%
# NBVAL_IGNORE_OUTPUT
# (output depends on the devices' data this checkout holds: a local CPU run adds data/cpu)
frames = []
for name in ("microbench.csv", "ttft.csv", "launches.csv", "correctness.csv", "fused_configs.csv"):
    df = load_device_tables(Path(data_root), name)
    if len(df):
        frames.append(df.groupby("device_folder").agg(
            rows=("device_name", "size"), device=("device_name", "first"), torch=("torch_version", "first"),
            triton=("triton_version", "first"), commits=("git_commit", lambda s: ", ".join(sorted(set(s))))
        ).assign(file=name).reset_index())
pd.concat(frames, ignore_index=True) if frames else "no device data yet"
