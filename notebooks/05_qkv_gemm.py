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
# Parameters (papermill). Defaults: the small CPU configuration nbval re-runs (on a CPU
# nothing is timed: the GEMMs are GPU-only).
device = "auto"
qkv_tokens = [37]  # token counts of the QKV projection benchmark (1152 -> 3456)
samples = 3
rounds = 5  # shuffled rounds the samples are taken in
qkv_compile_budget_s = 60  # torch.compile max-autotune gets at most this long, else recorded as skipped
progress = True
data_dir = ""  # where to upsert qkv_gemm.csv; empty: do not save

# %% [markdown]
# # 5. RoPE inside the QKV projection's epilogue (1152 -> 3456, bf16)
#
# **Question.** Can the rotation ride in the QKV projection's GEMM epilogue for less than
# cuBLAS followed by the best standalone RoPE kernel, and how close does that GEMM get to
# cuBLAS alone?
#
# **Method.** The best standalone RoPE still reads and writes q and k once more after the
# QKV projection wrote them. Here: cuBLAS alone (`cublas_linear`, the floor), cuBLAS then the
# fused RoPE in place (`cublas_linear+fused_rope`, today's best), torch.compile max-autotune of
# rope(linear(x)) (`compile_max_autotune`), this project's Triton GEMM rotating q/k in its
# epilogue from the cos/sin table (`qkv_rope_linear`) or with angles computed in the kernel from
# each token's patch coordinates (`qkv_rope_linear_angles`), the same kernel with the rotation
# compiled out (`qkv_gemm_rotation_compiled_out`: its mainloop, q/k not rotated), this
# project's CuTe DSL GEMM (`qkv_rope_linear_cute`, `kernels/qkv_cute.py`: a TMA producer warp
# and two consumer warp groups in ping-pong, W multicast over a 2x1 cluster, angles in-kernel;
# sm_90 GPUs with nvidia-cutlass-dsl only) and its rotation compiled out
# (`qkv_cute_rotation_compiled_out`), and QuACK's CuTe DSL GEMM with a bias epilogue
# (`quack_gemm`) and with Kimi's RoPE in its epilogue (`quack_gemm_rope`), where QuACK is
# installed. All of ours and QuACK's run through one entry point (`rope_kernels.qkv.qkv_rope`,
# one backend each), each at one fixed, named config (`config`): its backend's default, chosen
# from the committed sweep (`data/exploration/nvidia-h200/qkv_gemm_sweep.csv`; `docs/DECISIONS.md`), not
# from this run's samples. The inputs cover twice the L2 at every token count (`input_sets`);
# the variants are timed in `rounds` rounds of seeded shuffled order as CUDA-graph replays
# (median, p20/p80 of `samples` pooled over the rounds). Every variant's output is checked
# against float64 next to the native path's own error. Compute-bound: the roof is a large
# cuBLAS GEMM's rate.
#
# On a CPU nothing here is timed (the GEMMs are GPU-only); the GPU profile
# (`params/cuda.yaml`) times 1 to 16 images of 1024x1024.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from rope_kernels.study import plots
from rope_kernels.study.devices import data_line, provenance
from rope_kernels.study.notebooks import check_parameters, notebook_setup
from rope_kernels.study.results import upsert_csv
from rope_kernels.study.specs import QKV_GEMM_CSV
from rope_kernels.study.targets import evaluate, summarize, targets_for
from rope_kernels.variants import peer_status

kind, dev = notebook_setup(device)  # quiet known warnings, display and plot style
check_parameters("05_qkv_gemm", globals(), kind)  # the runner's rules and messages, for plain papermill too

# %% tags=["appendix"]
# NBVAL_IGNORE_OUTPUT
pd.Series(provenance(kind)).to_frame("this run")

# %% [markdown] tags=["appendix"]
# Which peers ran here (QuACK's GEMM among them), from which package, version and source hash,
# and why the others did not:

# %% tags=["appendix"]
# NBVAL_IGNORE_OUTPUT
pd.DataFrame(peer_status())[["name", "available", "package", "version", "origin", "sha256", "reason"]]

# %% [markdown]
# ## Times, ratios, configs and correctness

# %%
# NBVAL_IGNORE_OUTPUT
if kind != "cpu":
    from rope_kernels.bench.qkv_bench import peak_bf16_tflops, roofline, run_qkv_bench
    qkv = run_qkv_bench(qkv_tokens, device=dev, samples=samples, rounds=rounds,
                        compile_budget_s=qkv_compile_budget_s, progress=progress).rows
    if data_dir:
        written = Path(data_dir) / QKV_GEMM_CSV
        upsert_csv(written, qkv)  # key: specs.RESULT_FILES
        print(data_line(written))  # what this report wrote; tests compare it with the CSV
    display(qkv.pivot_table(index="tokens", columns="variant", values="median_us").round(1).rename_axis(columns="median [us]"))
    display(qkv.pivot_table(index="tokens", columns="variant", values="ratio_to_cublas").round(3).rename_axis(columns="time / cuBLAS [x]"))
    display(qkv.pivot_table(index="tokens", columns="variant", values="ratio_to_cublas_fused_rope").round(3).rename_axis(columns="time / (cuBLAS + fused RoPE) [x]"))
    display(qkv.pivot_table(index="tokens", columns="variant", values="tflops").round(0).rename_axis(columns="TFLOP/s"))
    display(qkv[qkv.config != ""].pivot_table(index="tokens", columns="variant", values="config", aggfunc="first").rename_axis(columns="config of the row"))
    display(qkv[["variant", "tokens", "reference", "max_abs_err", "native_max_abs_err", "error_tolerance", "matches_float64"]])
    display(qkv.pivot_table(index="tokens", columns="variant", values="p80_us").div(qkv.pivot_table(index="tokens", columns="variant", values="median_us")).round(3).rename_axis(columns="p80 / median [x]"))
    display(qkv[qkv.note != ""][["variant", "config", "tokens", "note"]])
else:
    print("QKV projection benchmark: GPU only (the CPU run times nothing here)")

# %% [markdown]
# ## Where the time goes, and the compute roof
#
# Each of our kernels runs at its default config; `qkv_gemm_rotation_compiled_out` runs at the
# angles path's (the encoder's). At that config, a kernel minus the
# compiled-out one is its epilogue's rotation (blank where the kernel's config is
# another); the compiled-out kernel over `cublas_linear` is the mainloop's deficit (or lead)
# against cuBLAS. The second table does the same for our CuTe DSL kernel
# (`qkv_cute_rotation_compiled_out` at `qkv_rope_linear_cute`'s config), where it ran.

# %%
# NBVAL_IGNORE_OUTPUT
if kind != "cpu":
    wide = qkv.pivot_table(index="tokens", columns="variant", values="median_us")
    if {"qkv_rope_linear", "qkv_gemm_rotation_compiled_out", "cublas_linear"} <= set(wide.columns):
        configs = qkv.pivot_table(index="tokens", columns="variant", values="config", aggfunc="first")
        out_config = configs["qkv_gemm_rotation_compiled_out"]

        def rotation(kernel):  # its time over the compiled-out kernel's, at the same config
            if kernel not in wide.columns:
                return float("nan")
            return (wide[kernel] - wide["qkv_gemm_rotation_compiled_out"]).where(configs[kernel] == out_config)

        display(pd.DataFrame({
            "config (compiled out)": out_config,
            "mainloop (rotation compiled out) [us]": wide["qkv_gemm_rotation_compiled_out"],
            "rotation, angles in-kernel [us]": rotation("qkv_rope_linear_angles"),
            "rotation, cos/sin table [us]": rotation("qkv_rope_linear"),
            "mainloop / cuBLAS [x]": wide["qkv_gemm_rotation_compiled_out"] / wide["cublas_linear"],
            "fused RoPE after cuBLAS [us]": wide.get("cublas_linear+fused_rope", float("nan")) - wide["cublas_linear"],
        }).round(3))
    if {"qkv_rope_linear_cute", "qkv_cute_rotation_compiled_out", "cublas_linear"} <= set(wide.columns):
        cute_configs = qkv.pivot_table(index="tokens", columns="variant", values="config", aggfunc="first")
        display(pd.DataFrame({
            "CuTe config": cute_configs["qkv_cute_rotation_compiled_out"],
            "mainloop (rotation compiled out) [us]": wide["qkv_cute_rotation_compiled_out"],
            "rotation, angles in-kernel [us]": wide["qkv_rope_linear_cute"] - wide["qkv_cute_rotation_compiled_out"],
            "mainloop / cuBLAS [x]": wide["qkv_cute_rotation_compiled_out"] / wide["cublas_linear"],
            "with rotation / cuBLAS [x]": wide["qkv_rope_linear_cute"] / wide["cublas_linear"],
        }).round(3))
    peak = peak_bf16_tflops(dev)
    roof = roofline(qkv, peak)
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, grp in roof.groupby("variant"):
        ax.plot(grp.tokens, grp.tflops, marker="o", label=name, color=plots.variant_color(name))
    ax.axhline(peak, color="k", ls="--", label=f"compute roof: cuBLAS 8192^3, {peak:.0f} TFLOP/s")
    gemm = f"{qkv.hidden.iloc[0]} x {3 * qkv.heads.iloc[0] * qkv.head_dim.iloc[0]}"  # K x N, from the rows
    ax.set_xscale("log"); ax.set_xlabel("tokens"); ax.set_ylabel(f"TFLOP/s (2 x T x {gemm} / time)")
    ax.set_ylim(0, peak * 1.1)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5)); plt.show()

# %% [markdown]
# ## The study's targets
#
# Judged from the rows above by `rope_kernels.study.targets` (the QKV-GEMM targets of issue 18);
# a variant that did not run reads "not measured". Benchmarks, not tests.

# %%
# NBVAL_IGNORE_OUTPUT
if kind != "cpu":
    qkv_targets = targets_for("qkv_gemm")
    qkv_verdicts = evaluate({"qkv_gemm": qkv}, qkv_targets)
    display(summarize(qkv_verdicts, qkv_targets)[["target", "what", "rule", "verdict", "counts", "measured"]])
    display(qkv_verdicts.drop(columns=["op", "threshold", "unit"]).round(3))

# %% [markdown]
# **Caveats.** The variants take turns in shuffled rounds, their calls rotating over input sets
# that cover twice the L2; in the encoder the projection's input comes from the previous layer.
# The configs are fixed before the run (a default tuned on an H200 at Kimi's shape may not be
# the best elsewhere: `tools/qkv_sweep.py` explores). `compile_max_autotune` compiles
# once per token count; once compiling has taken `qkv_compile_budget_s` in total, later token
# counts record it as skipped (largest first in the GPU profile, so the large shapes are covered).
