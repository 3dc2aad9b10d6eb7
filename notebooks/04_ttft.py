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
encoder = "small"  # small (CPU-sized) | kimi_k25 (27 layers, 1152 wide, 16 x 72) | qwen3_vl (27 x 1152, 16 x 72, rotate-half, 16-px patches)
layers = 0  # 0: the encoder's own depth
dtype = "bfloat16"
resolutions = ["56x56", "112x84"]
image_counts = [1, 2]
variants = ["native", "fused", "fused_inplace", "vllm_packed_qk", "sglang_vision", "vllm_merged",
            "gemm_epilogue", "none"]  # names in rope_kernels.VARIANTS, plus gemm_epilogue and none
modes = ["eager"]  # eager | cudagraph
samples = 2
attention = "auto"  # auto | sdpa_cudnn_batched | sdpa_batched | varlen_attn | sdpa_per_image
max_tokens = 400000  # skip buckets with more vision tokens than this (memory)
# time to first token = encoder latency (measured) + the language model's prefill (modelled):
text_tokens = 64  # text tokens of the prompt besides the images
prefill_tokens_per_s = 0.0  # > 0: your measured prefill throughput replaces the FLOP model below
llm_active_params_b = 32.0  # billions of parameters per token (Kimi-K2.5's LLM: 32B of 1.04T, MoE)
llm_gpus = 8  # GPUs the language model is served on
llm_peak_tflops = 989.0  # dense bf16 TFLOP/s per GPU (H200)
llm_mfu = [0.15, 0.30, 0.45]  # assumed model FLOPs utilisation: low, central, high
# the prefill from aiconfigurator-core (the `ttft` extra) for the device that timed the encoder:
prefill = "auto"  # auto (aiconfigurator where installed, with tables) | aiconfigurator | hand
llm_backend = "vllm"  # aiconfigurator's tables (its SGLang/TRT-LLM paths mis-size Kimi's attention)
llm_tp = 8  # tensor parallel of attention and dense layers
llm_moe_ep = 8  # expert parallel of the routed experts (MoE TP: llm_tp / llm_moe_ep)
encoder_graph_tokens = 5120  # vLLM's largest encoder CUDA graph, in merged tokens
# how the encoder is spread over 8 GPUs: 1gpu (whole), tp8 (weights split: one GPU's shard,
# 2 of 16 heads), dp8 (images split: the slowest GPU's share); collectives modelled (comm_ms)
encoder_parallel = ["1gpu"]
sharded_buckets = {}  # resolution -> image counts where tp8/dp8 are timed; empty: every bucket
sharded_variants = []  # the variants tp8's shard times (empty: variants)
image_counts_by_resolution = {}  # resolution -> image counts, in place of image_counts there
# further vision towers (rope_kernels.towers: kimi_k25 | qwen3_vl | qwen25_vl), timed after the main
# encoder on one GPU, each mode of `modes`, rows keyed by `encoder` = the tower (section "Other vision towers")
towers = []
tower_variants = ["native", "fused", "fused_inplace", "none"]  # variants that do not rotate its way are skipped, saying why
tower_image_counts = {}  # resolution -> image counts (resolutions among `resolutions`); empty: the main encoder's
tower_samples = 0  # rounds per tower bucket; 0: samples
seed = 0
progress = True
data_dir = ""  # where to upsert encoder_latency.csv; empty: do not save

# %% [markdown]
# # 4. The vision encoder: latency and time to first token versus image count
#
# **Question.** Users feel a kernel as time-to-first-token of a multimodal request. How much
# does the RoPE choice change the Kimi-K2.5 vision encoder's latency as images per request
# grow, how close does each variant get to the floor (the same encoder with RoPE skipped), and
# what share of the time to first token is that?
#
# What is measured here is **encoder latency** (`encoder_latency.csv`). Time to first token adds
# the language model's prefill of the tokens it sees, which is modelled, not measured (last
# section; its assumptions are printed there, and a measured prefill throughput can replace them).
#
# **Method.** A MoonViT-shaped encoder with the real dimensions (27 layers, hidden 1152, 16 heads
# x 72, MLP 4304 with tanh GELU, LayerNorms, qkv/out projections with bias, 2x2 patch merge and
# projector to 7168), seeded random bf16 weights. Images are turned into patch grids by Kimi's
# resize rule, the 2D RoPE table is built once per forward and shared by all layers, attention
# is block-diagonal per image with the best kernel available here (named in every row). Only
# the RoPE step differs between variants. All variants of a bucket are timed round-robin
# (drift hits them alike), eager and as one CUDA graph of the whole encoder per bucket. Besides
# each variant's median, every round is compared within itself (`paired_saving_pct`: native's
# time minus the variant's over native's, that round; `paired_rope_cost_ms`: the variant minus
# the floor, that round), and those per-round numbers are summarised (median, p20, p80): the
# pairing cancels drift that moves a whole round, which separate medians keep.

# %%
from pathlib import Path

import pandas as pd
import torch

from rope_kernels.study.devices import data_line, provenance
from rope_kernels.study.notebooks import check_parameters, notebook_setup
from rope_kernels.study.plots import with_units

import matplotlib.pyplot as plt

from rope_kernels.bench.encoder_bench import (agrees_with_native, bucket_rounds, bucket_rows, forward_peak_mb,
                                              make_bucket, native_agreement, paired_gain_pct, rope_minimal_ms,
                                              rope_profile)
from rope_kernels.bench.microbench import parse_dtype
from rope_kernels.bench.timing import copy_bandwidth_gbps
from rope_kernels.prefill import PrefillModel, add_ttft, rope_saving_pct_of_ttft
from rope_kernels.model.vit import EncoderConfig, MoonViTEncoder, encoder_inputs, pick_attention
from rope_kernels.study import plots

kind, dev = notebook_setup(device)  # quiet known warnings, display and plot style
check_parameters("04_ttft", globals(), kind)  # the runner's rules and messages, for plain papermill too
cfg = EncoderConfig.for_encoder(encoder)
if layers:
    cfg = cfg.with_layers(layers)
model = MoonViTEncoder(cfg, device=dev, dtype=parse_dtype(dtype), seed=seed)
from rope_kernels.encoder_parallel import gpu_images, parallel_columns
# one GPU's encoder per parallel mode: tp8's shard of every layer, the whole encoder otherwise
models = {p: model if p != "tp8" else MoonViTEncoder(cfg, device=dev, dtype=parse_dtype(dtype), seed=seed,
                                                     encoder_parallel=p) for p in encoder_parallel}
prefill_model = PrefillModel(active_params=llm_active_params_b * 1e9, gpus=llm_gpus,
                             peak_tflops=llm_peak_tflops, mfu=tuple(llm_mfu), tokens_per_s=prefill_tokens_per_s)
from rope_kernels import VARIANTS
from rope_kernels.bench.encoder_bench import encoder_not_run
not_run = encoder_not_run(variants, cfg.head_dim, parse_dtype(dtype), cfg.rotation)  # absent, or not this head_dim/dtype/rotation
for v, why in not_run.items():
    print(f"{v}: not run here ({why})")
variants = [v for v in variants if v not in not_run]

# %% tags=["appendix"]
# NBVAL_IGNORE_OUTPUT
pd.Series(provenance(kind)).to_frame("this run")

# %% [markdown]
# Patch grids and token counts per bucket (vision tokens before the merge; the LLM sees a quarter):

# %%
buckets = [make_bucket(r, n, tower=cfg.tower) for r in resolutions
           for n in image_counts_by_resolution.get(r, image_counts)]
skipped = [b for b in buckets if b.vit_tokens > max_tokens]
buckets = [b for b in buckets if b.vit_tokens <= max_tokens]
pd.DataFrame([{"resolution": b.resolution, "images": b.images, "grid (t,h,w)": b.grids[0],
               "vit_tokens": b.vit_tokens, "llm_tokens": b.llm_tokens} for b in buckets])

# %%
# NBVAL_IGNORE_OUTPUT
copy_gbps = copy_bandwidth_gbps(dev)
print(f"copy ceiling {copy_gbps:.0f} GB/s; skipped (over max_tokens): {[(b.resolution, b.images) for b in skipped]}")

# %%
# NBVAL_IGNORE_OUTPUT
from tqdm import tqdm
rows = []
round_times = {}  # (resolution, images, mode) -> per-variant forward times, round by round (1gpu)
sharded = lambda b: not sharded_buckets or b.images in sharded_buckets.get(b.resolution, [])  # noqa: E731
work = [(b, p, m) for b in buckets for p in encoder_parallel if p == "1gpu" or sharded(b) for m in modes]
one_gpu_rows = {}  # (resolution, images, mode) -> the whole encoder's rows of that bucket
for b, par, mode in tqdm(work, desc="encoder buckets", disable=not progress):
    # the work one GPU does: dp8's slowest GPU encodes ceil(images / 8) images, tp8's its shard
    timed = make_bucket(b.resolution, gpu_images(par, b.images))
    parallel = parallel_columns(par, images=b.images, vit_tokens=b.vit_tokens, gpu_vit_tokens=timed.vit_tokens,
                                hidden=cfg.hidden, layers=cfg.layers, merged_hidden=cfg.text_hidden, merge=cfg.merge)
    if par == "dp8" and (b.resolution, timed.images, mode) in one_gpu_rows:
        # the slowest GPU's share is the whole encoder on gpu_images images: timed already (1gpu)
        rows += [dict(r, **parallel) for r in one_gpu_rows[(b.resolution, timed.images, mode)]]
        continue
    net = models[par]
    timed_variants = [v for v in (sharded_variants or variants) if v in variants] if par == "tp8" else variants
    inp = encoder_inputs(timed.grids, cfg, device=dev, dtype=parse_dtype(dtype), seed=seed)
    att = pick_attention(timed.grids, dev) if attention == "auto" else attention
    if mode == modes[0]:  # properties of the kernels, not of the launch mode
        agreement = native_agreement(net, inp, att, timed_variants)  # every timed output vs native's
        profiled = {v: rope_profile(net, inp, v, att) for v in timed_variants}  # (rope ms, all ms)
        peaks = {v: forward_peak_mb(net, inp, v, att) for v in timed_variants}
    # every round runs the variants in its own seeded shuffled order (recorded in the rows)
    rounds = bucket_rounds(net, inp, timed_variants, mode, att, samples=samples,
                           seed=f"{seed}/{b.resolution}/{b.images}/{mode}" + ("" if par == "1gpu" else f"/{par}"))
    bucket = bucket_rows(timed, mode, att, rounds, profiled=profiled, peaks=peaks, agreement=agreement,
                         copy_gbps=copy_gbps, layers=cfg.layers, encoder=encoder)
    if par == "1gpu":
        round_times[(b.resolution, b.images, mode)] = rounds.times
        one_gpu_rows[(b.resolution, b.images, mode)] = bucket
    rows += [dict(r, **parallel) for r in bucket]
    del inp
# further vision towers (`towers`): the whole encoder on one GPU at the main encoder's resolutions,
# each mode, round-robin as above; not profiled (profiled_ columns empty) to keep the run short
from rope_kernels.model.vit import windows_kernel
from rope_kernels.prefill import tower_prefill_settings, towers_without_ttft
tower_rows = []
for tower in tqdm(towers, desc="towers", disable=not progress):
    tcfg = EncoderConfig.for_encoder(tower)
    tcfg = tcfg.with_layers(layers) if layers else tcfg
    tnet = MoonViTEncoder(tcfg, device=dev, dtype=parse_dtype(dtype), seed=seed)
    skipped_here = encoder_not_run(tower_variants, tcfg.head_dim, parse_dtype(dtype), tcfg.rotation)
    for v, why in skipped_here.items():
        print(f"{tower} {v}: not run here ({why})")
    t_variants = [v for v in tower_variants if v not in skipped_here]
    t_buckets = [make_bucket(r, n, tower=tcfg.tower) for r in resolutions if not tower_image_counts
                 or r in tower_image_counts
                 for n in tower_image_counts.get(r, image_counts_by_resolution.get(r, image_counts))]
    for b in [b for b in t_buckets if b.vit_tokens <= max_tokens]:
        inp = encoder_inputs(b.grids, tcfg, device=dev, dtype=parse_dtype(dtype), seed=seed)
        att = pick_attention(b.grids, dev) if attention == "auto" else attention
        windows_kernel(dev, tcfg.head_dim)  # probed here, eager, before any graph capture
        agreement = native_agreement(tnet, inp, att, t_variants)
        nan = float("nan")
        for mode in modes:
            rounds = bucket_rounds(tnet, inp, t_variants, mode, att, samples=tower_samples or samples,
                                   seed=f"{seed}/{tower}/{b.resolution}/{b.images}/{mode}")
            bucket = bucket_rows(b, mode, att + (f" + windows: {windows_kernel(dev, tcfg.head_dim)}"
                                                 if tcfg.window else ""),
                                 rounds, profiled={v: (nan, nan) for v in t_variants},
                                 peaks={v: nan for v in t_variants}, agreement=agreement,
                                 copy_gbps=copy_gbps, layers=tcfg.layers, encoder=tower)
            one = parallel_columns("1gpu", images=b.images, vit_tokens=b.vit_tokens, gpu_vit_tokens=b.vit_tokens,
                                   hidden=tcfg.hidden, layers=tcfg.layers, merged_hidden=tcfg.text_hidden,
                                   merge=tcfg.merge)
            tower_rows.append(pd.DataFrame([dict(r, **one) for r in bucket]))
        del inp
    del tnet
# measured encoder latency (one GPU's work per mode), plus the modelled time to first token
# (modelled_ columns, each tower's language model; see below)
latency_all = add_ttft(pd.DataFrame(rows).assign(**provenance(kind)), prefill_model, text_tokens)
no_llm = towers_without_ttft(towers)
for part in tower_rows:
    name = part.encoder.iloc[0]
    part = part.assign(**provenance(kind))
    if name not in no_llm:  # modelled_ columns from the tower's own LLM (hand model)
        part = add_ttft(part, tower_prefill_settings(name, prefill_model)[0], text_tokens)
    latency_all = pd.concat([latency_all, part], ignore_index=True)
if data_dir:
    from rope_kernels.study.results import upsert_csv
    from rope_kernels.study.specs import ENCODER_LATENCY_CSV
    written = Path(data_dir) / ENCODER_LATENCY_CSV
    upsert_csv(written, latency_all)  # key: specs.RESULT_FILES
    print(data_line(written))  # what this report wrote; tests compare it with the CSV
# the main encoder on one GPU: the sections below (the towers' rows: "Other vision towers")
latency = latency_all[(latency_all.encoder_parallel == "1gpu") & (latency_all.encoder == encoder)]
latency.pivot_table(index=["resolution", "images", "mode"], columns="variant", values="median_ms").rename_axis(
    columns="encoder median [ms]").round(2)

# %% [markdown]
# Every timed variant's encoder output on every bucket of this run, against a float32 copy of
# the same encoder running native RoPE (the kernel checker's rule, applied to the whole encoder):
# `max_rel_err_vs_fp32` (max |out - reference| / max |reference|, in the rows) must be at most
# twice the native bf16 encoder's own (`agreement_tol_rel`); `max_rel_err_vs_native` says how far
# each is from native's output. The floors (`none`, and `gemm_epilogue_cute_norot`: our CuTe QKV
# GEMM with its rotation compiled out) skip RoPE and must fail: the check can fail.

# %%
from rope_kernels.vocabulary import ROPE_FREE_FLOORS
agreed = latency_all[latency_all["mode"] == modes[0]].assign(agrees=lambda d: agrees_with_native(d))
floors = agreed.variant.isin(ROPE_FREE_FLOORS)
assert agreed[~floors].agrees.all(), agreed[~agreed.agrees]
assert not agreed[floors].agrees.any(), "skipping RoPE agreed with native"
agreed.pivot_table(index=["resolution", "images", "encoder_parallel"], columns="variant", values="agrees",
                   aggfunc="all")

# %% [markdown]
# ## Encoder latency versus image count
#
# Linear axes: latency grows with the images (tokens); the floor (RoPE skipped) is dashed.
# The few-percent gaps between variants are easier to read as savings, in the next plot.

# %%
# NBVAL_IGNORE_OUTPUT
for mode in modes:
    plots.encoder_latency(latency, mode=mode, resolutions=resolutions, variants=variants)
    plt.show()

# %% [markdown]
# ## What the RoPE choice saves over native, and what it costs over the floor

# %%
# NBVAL_IGNORE_OUTPUT
wide = latency.pivot_table(index=["resolution", "images", "vit_tokens", "mode"], columns="variant",
                        values="median_ms").reset_index()
for v in variants:
    if v in ("native",) or v not in wide:
        continue
    if "native" in wide:  # a run without native has no saving over it
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
with_units(wide[cols]).round(2)

# %%
# NBVAL_IGNORE_OUTPUT
plots.saving_vs_native(latency, modes=modes, resolutions=resolutions, variants=variants)
plt.show()

# %% [markdown]
# ## RoPE's share of encoder time (profiler: its kernels' device time over all device time)

# %%
# NBVAL_IGNORE_OUTPUT
latency[latency["mode"] == modes[0]].pivot_table(index=["resolution", "images"], columns="variant",
                                          values="profiled_rope_share").mul(100).rename_axis(
    columns="RoPE share of device time [%]").round(2)

# %% [markdown]
# RoPE's device time in one forward, measured in place, against the physical minimum of its bytes:

# %%
# NBVAL_IGNORE_OUTPUT
in_place = latency[latency["mode"] == modes[0]].pivot_table(index=["resolution", "images", "vit_tokens"],
                                                      columns="variant", values="profiled_rope_device_ms").reset_index()
in_place["rope_minimal_ms"] = [rope_minimal_ms(t, cfg.heads, cfg.head_dim, cfg.layers, copy_gbps)
                               for t in in_place.vit_tokens]
for v in variants:
    if v in in_place and v != "none":
        in_place[f"{v}_over_minimal"] = in_place[v] / in_place["rope_minimal_ms"]
with_units(in_place.rename(columns={v: f"{v}_ms" for v in variants})).round(3)

# %% [markdown]
# ## RoPE's cost at 16 images of 1024x1024 (GPU profile)
#
# The fused encoder's RoPE cost (fused minus none) against the physical minimum (27 layers x
# RoPE's minimal bytes / copy bandwidth), by medians and per round, and its saving over native.
# RoPE's cost is about 1.5% of this encoder's time while one forward varies by about 1% from
# round to round, so "fused minus none" resolves it only to a few ms; the in-place device time
# from the profiler (printed below the tables) measures the same cost directly.

# %%
# NBVAL_IGNORE_OUTPUT
t16 = wide[(wide.resolution == "1024x1024") & (wide.images == 16)]
if len(t16) and "fused_rope_cost_ms" in t16:
    display(with_units(t16[["mode", "native", "fused", "none", "fused_rope_cost_ms", "rope_minimal_ms",
                            "fused_cost_over_minimal", "fused_saving_pct"]].rename(
        columns={"native": "native_ms", "fused": "fused_ms", "none": "none_ms"})).round(3))
    p16 = latency[(latency.resolution == "1024x1024") & (latency.images == 16) & (latency.variant == "fused")]
    minimal = rope_minimal_ms(int(p16.vit_tokens.iloc[0]), cfg.heads, cfg.head_dim, cfg.layers, copy_gbps)
    print("per-round (paired) estimates, median [p20, p80]:")
    display(with_units(p16[["mode", "paired_saving_pct", "paired_saving_pct_p20", "paired_saving_pct_p80",
                            "paired_rope_cost_ms", "paired_rope_cost_ms_p20", "paired_rope_cost_ms_p80"]].assign(
        rope_minimal_ms=minimal, cost_over_minimal=p16.paired_rope_cost_ms / minimal)).round(3))
    in_place = p16.profiled_rope_device_ms.iloc[0]
    print(f"RoPE measured in place (profiler, fused kernels' device time in one forward): "
          f"{in_place:.3f} ms = {in_place / minimal:.3f}x the {minimal:.3f} ms minimum")
else:
    print("the cost at 16 images of 1024x1024 is measured in the GPU profile")

# %% [markdown]
# ## Against what the engines ship, and RoPE inside the QKV projection
#
# Per round, how much faster each variant ran than another in the same round (median
# [p20, p80] over rounds): the fused encoder against vLLM's in-place path
# (`vllm_packed_qk`), SGLang's, and the merged PR path; `gemm_epilogue` (RoPE in the QKV
# GEMM's epilogue, our Triton kernel) and `gemm_epilogue_cute` (our CuTe DSL kernel, sm_90
# only) against the floor (RoPE skipped) and against fused, out of and in place; and
# `gemm_epilogue_cute` against the same CuTe GEMM with its rotation compiled out
# (`gemm_epilogue_cute_norot`): RoPE's own cost there, apart from the GEMM's speed (the floor
# `none` runs its projection on cuBLAS, which `gemm_epilogue_cute_norot` against `none` shows).

# %%
# NBVAL_IGNORE_OUTPUT
pairs = [("fused", "vllm_packed_qk"), ("fused_inplace", "vllm_packed_qk"), ("fused", "sglang_vision"),
         ("fused", "vllm_merged"), ("fused", "native"), ("gemm_epilogue", "none"),
         ("gemm_epilogue", "fused"), ("gemm_epilogue", "fused_inplace"),
         ("gemm_epilogue_cute", "none"), ("gemm_epilogue_cute", "fused"),
         ("gemm_epilogue_cute", "fused_inplace"), ("gemm_epilogue_cute", "gemm_epilogue_cute_norot"),
         ("gemm_epilogue_cute_norot", "none")]
gains = []
for (res, n, mode), times in round_times.items():
    for a, b in pairs:
        if a in times and b in times:
            mid, lo, hi = paired_gain_pct(times, a, b)
            gains.append({"resolution": res, "images": n, "mode": mode, "variant": a, "against": b,
                          "faster_by_pct": mid, "p20_pct": lo, "p80_pct": hi})
gains = pd.DataFrame(gains)
if len(gains):
    display(with_units(gains[(gains.resolution == gains.resolution.iloc[-1])]).round(2))

# %% [markdown]
# ## Time to first token
#
# The first token waits for the encoder and then for the language model to prefill what it
# sees: the vision tokens after the 2x2 merge (`vit_tokens / 4`) plus `text_tokens` of text.
# TTFT = encoder median (measured above) + prefill (modelled: `rope_kernels/prefill.py`;
# set `prefill_tokens_per_s` to your measured prefill throughput to replace the model). The rows
# carry it in `modelled_` columns with `prefill_model` naming the model. Its assumptions, and the
# band its uncertain ones (MFU) give:

# %%
prefill_model.assumptions()

# %%
# NBVAL_IGNORE_OUTPUT
for mode in modes:
    plots.time_to_first_token(latency, mode=mode, resolutions=resolutions, variants=variants)
    plt.show()
latency.pivot_table(index=["resolution", "images", "llm_prefill_tokens", "mode"], columns="variant",
                    values="modelled_ttft_ms").rename_axis(columns="time to first token [ms]").round(1)

# %% [markdown]
# What each RoPE choice saves over native, as a share of native's time to first token (bars:
# the prefill band's ends; the share shrinks as prefill grows with the images):

# %%
# NBVAL_IGNORE_OUTPUT
compared = [v for v in variants if v != "native" and v in set(latency.variant)]
if "native" in set(latency.variant) and compared:  # a single-variant run has no saving
    savings = pd.concat([rope_saving_pct_of_ttft(latency, v) for v in compared], ignore_index=True)
    plots.saving_pct_of_ttft(savings, modes=modes, resolutions=resolutions, variants=variants)
    plt.show()
    display(with_units(savings.pivot_table(index=["resolution", "images", "mode"], columns="variant",
                                           values="saving_pct_of_ttft")).round(2))
else:
    print(f"no saving over native to show: this run timed {', '.join(variants)}")

# %% [markdown]
# ## Time to first token as a serving engine sees it
#
# The prefill above is a hand model with an assumed MFU. Here it comes from NVIDIA's
# aiconfigurator-core where it is installed (the `ttft` extra) and has tables for the device
# that timed the encoder (an H200's rows get its `h200_sxm` tables on any machine; `python -m
# rope_kernels ttft --device nvidia-h200 --write` recomputes the file from committed rows on a
# CPU): Kimi-K2.5's language model with vLLM's tables at `llm_tp` / `llm_moe_ep`, batch 1, input
# = merged vision tokens + `text_tokens`, the system matching the GPU that timed the encoder (an
# H100 SXM's rows get `h100_sxm`). The prefill is run as vLLM runs it: chunked prefill, each step at
# most vLLM's default `max_num_batched_tokens` (its OpenAI server's on an H100 or H200, read from
# the pinned source below), each chunk priced from the tables attending to the prefix before it
# (`prefill_ms`, and `ttft_ms` with it); the one unchunked prefill is beside it
# (`prefill_unchunked_ms`, `ttft_unchunked_ms`), and `prefill_note` says how many chunks ran and
# where the unchunked prompt lies past the MoE tables' last token count (then extrapolated).
# Every row names the prefill's source, backend, system,
# parallelism, package version and whether its MoE tables cover the tokens ("measured tables")
# or not ("extrapolated"); where aiconfigurator cannot run the hand model's central value is
# used and the row says why. The hand model's band stays in every row as the cross-check.
#
# Encoder policies: `eager` is vLLM's default (encoder CUDA graphs off); `vllm_encoder_graphs`
# is vLLM with encoder CUDA graphs on, whose largest graph covers `encoder_graph_tokens` merged
# tokens (about 3.7 images of 1024x1024; more images run eager); `cudagraph` is all graphs.

# %%
# NBVAL_IGNORE_OUTPUT
from rope_kernels.prefill import aic_covered_systems, device_ttft, ttft_savings
from rope_kernels.study.results import upsert_csv
from rope_kernels.study.specs import TIME_TO_FIRST_TOKEN_CSV

from rope_kernels.prefill import tower_ttft

# per encoder: Kimi-K2.5's LLM at llm_tp / llm_moe_ep for the main encoder, each tower's own LLM
# (towers.py llm_model, llm_tp) for its rows; a tower without one gets no TTFT rows
ttft_every = tower_ttft(latency_all, text_tokens=text_tokens, hand=prefill_model, source=prefill,
                        graph_tokens=encoder_graph_tokens, backend=llm_backend, tp=llm_tp,
                        moe_tp=max(1, llm_tp // llm_moe_ep), moe_ep=llm_moe_ep)
if data_dir:
    written = Path(data_dir) / TIME_TO_FIRST_TOKEN_CSV
    upsert_csv(written, ttft_every)  # key: specs.RESULT_FILES
    print(data_line(written))  # what this report wrote; tests compare it with the CSV
ttft_all = ttft_every[ttft_every.encoder == encoder]  # the main encoder (the towers': "Other vision towers")
ttft = ttft_all[ttft_all.encoder_parallel == "1gpu"]  # the whole encoder on one GPU (next sections)
first = ttft.iloc[0]
print(f"prefill: {first.prefill_source}; {first.prefill_package or first.hand_model}; "
      f"{first.prefill_system} {first.prefill_backend} {first.prefill_tables_version} "
      f"{first.prefill_parallelism}; {first.prefill_note}")
print(f"aiconfigurator's vLLM tables for Kimi-K2.5 cover: {', '.join(aic_covered_systems()) or '(not installed)'}")
ttft.drop_duplicates(["resolution", "images"])[["resolution", "images", "llm_prefill_tokens", "prefill_ms",
                                                "prefill_unchunked_ms", "prefill_note", "prefill_tables",
                                                "prefill_effective_mfu", "hand_prefill_fast_ms", "hand_prefill_ms",
                                                "hand_prefill_slow_ms"]].round(3).reset_index(drop=True)

# %% [markdown]
# TTFT against images per request, a line per RoPE choice that matters (the table under each
# plot has every variant), a panel per encoder policy; the
# public anchors (`data/reference/ttft_anchors.csv`) are other models, GPUs and loads: context,
# not like for like (their setups are in the table below the plot).

# %%
# NBVAL_IGNORE_OUTPUT
from rope_kernels.study.devices import REPO_ROOT
anchors = pd.read_csv(REPO_ROOT / "data" / "reference" / "ttft_anchors.csv")
for r in resolutions:
    if r in set(ttft.resolution):
        plots.ttft_vs_images(ttft, resolution=r, variants=variants,
                             anchors=anchors if r == "1024x1024" else None)
        plt.show()
        display(plots.ttft_table(ttft, resolution=r).rename_axis(index=f"TTFT [ms], {r}"))
anchors[["source", "hardware", "model", "setup", "metric", "before", "after", "unit"]]

# %% [markdown]
# vLLM's default (encoder eager) beside encoder CUDA graphs as vLLM captures them (up to
# `encoder_graph_tokens` merged tokens) and all graphs: TTFT with native RoPE and with ours, and
# the change graphs make (vLLM PR #41992 reported -16.4% mean TTFT on Kimi-VL, RTX 4090):

# %%
# NBVAL_IGNORE_OUTPUT
graphs = ttft[ttft.variant.isin(["native", "fused"])].pivot_table(
    index=["resolution", "images", "variant"], columns="encoder_policy", values="ttft_ms")
for policy in ("vllm_encoder_graphs", "cudagraph"):
    if {"eager", policy} <= set(graphs.columns):
        graphs[f"{policy} vs eager [%]"] = 100 * (graphs[policy] - graphs["eager"]) / graphs["eager"]
graphs.round(2)

# %% [markdown]
# What each RoPE choice buys in TTFT over native (ms and % of native's TTFT), and the encoder's
# share of TTFT, per encoder policy:

# %%
# NBVAL_IGNORE_OUTPUT
if "native" in set(ttft.variant):  # a run without native has no saving over it
    buys = ttft_savings(ttft)
    display(with_units(buys.pivot_table(index=["resolution", "images", "encoder_policy"], columns="variant",
                                        values=["saving_ms", "saving_pct_of_ttft"])).round(2))
else:
    print(f"no saving over native to show: this run timed {', '.join(variants)}")

# %%
# NBVAL_IGNORE_OUTPUT
ttft.pivot_table(index=["resolution", "images"], columns=["encoder_policy", "variant"],
                 values="encoder_share_pct").rename_axis(columns=["encoder share of TTFT [%]", ""]).round(1)

# %% [markdown]
# ## Time to first token as Kimi-K2.5 is served: the encoder over 8 GPUs
#
# The sections above run the whole encoder on one GPU. A serving engine runs it on the language
# model's 8 GPUs, in one of two modes: `tp8` (vLLM's `mm_encoder_tp_mode="weights"`: every layer's
# weights split 8 ways, each GPU 2 of the 16 heads, its QKV and first MLP GEMM with an eighth of
# the output columns, its output projection and second MLP GEMM with an eighth of the input
# columns, two all-reduces of tokens x 1152 per layer) or `dp8` (`"data"`: the images split over
# the GPUs, full weights on each, one all-gather of the outputs). Each mode's encoder time here is
# **measured**: the shard one GPU runs (tp8) or the slowest GPU's share of the images (dp8),
# timed on this GPU. The collectives are **modelled** (`comm_ms`, named in `comm_model`), not
# measured. What vLLM supports for Kimi-K2.5 and what it picks by default, read from its source:

# %%
from rope_kernels.encoder_parallel import (COMM_MODEL, VLLM_DEFAULT_ENCODER_PARALLEL, VLLM_FACTS,
                                                 VLLM_MODE_NAMES)
display(pd.DataFrame([{"fact": f.what, "value": f.value, "where": f.where, "source line": f.quote}
                      for f in VLLM_FACTS.values()]))
print(f"vLLM's modes as this study names them: {VLLM_MODE_NAMES}; a default deployment gets "
      f"{VLLM_DEFAULT_ENCODER_PARALLEL}. Collectives: {COMM_MODEL.describe()}")
timed_parallel = [p for p in encoder_parallel if p in set(ttft_all.encoder_parallel)]
print(f"encoder parallel modes timed in this run: {', '.join(timed_parallel)}")

# %% [markdown]
# TTFT against images per request, a panel per encoder parallel mode (the encoder eager, vLLM's
# default), and what the RoPE choice buys there, in ms and % of native's TTFT:

# %%
# NBVAL_IGNORE_OUTPUT
per_mode = ttft_all[ttft_all.encoder_policy == "eager"].assign(
    encoder_policy=lambda d: d.encoder_parallel + " (encoder eager)")
for r in resolutions:
    if r in set(per_mode.resolution):
        plots.ttft_vs_images(per_mode, resolution=r, variants=variants,
                             policies=[f"{p} (encoder eager)" for p in timed_parallel])
        plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
if "native" in set(ttft_all.variant):  # a run without native has no saving over it
    buys_all = ttft_savings(ttft_all)
    buys_all = buys_all[buys_all.encoder_policy == "eager"].merge(
        ttft_all[(ttft_all.variant == "native") & (ttft_all.encoder_policy == "eager")][
            ["resolution", "images", "encoder_parallel", "ttft_ms", "comm_ms"]].rename(
            columns={"ttft_ms": "native_ttft_ms"}), on=["resolution", "images", "encoder_parallel"])
    display(with_units(buys_all.pivot_table(
        index=["resolution", "images", "encoder_parallel", "native_ttft_ms", "comm_ms"],
        columns="variant", values=["saving_ms", "saving_pct_of_ttft"])).round(2))
else:
    print(f"no saving over native to show: this run timed {', '.join(variants)}")

# %% [markdown]
# ## The study's targets
#
# Judged from this run's rows by `rope_kernels.study.targets` (one tested table of every target;
# `python -m rope_kernels targets` prints it for the committed data): at 16 x 1024x1024, in both
# modes, the encoder with our RoPE faster than with vLLM's per round (p20 above zero, our
# in-place kernel against its in-place one), at least 7% faster than native, RoPE's cost at most
# 1.2x (notebook) and 1.1x (issue 17) its physical minimum, and RoPE in the QKV GEMM (the faster
# of `gemm_epilogue` and `gemm_epilogue_cute` by median) faster than fused and within 0.3% of the
# floor. A bucket this run did not time reads "not measured".

# %%
from rope_kernels.study.targets import evaluate, summarize, targets_for

encoder_targets = targets_for("encoder")
verdicts = evaluate({"encoder": latency}, encoder_targets)
display(summarize(verdicts, encoder_targets)[["target", "what", "rule", "regime", "verdict", "counts", "measured"]])
with_units(verdicts.drop(columns=["op", "threshold", "unit"])).round(3)

# %% [markdown]
# ## Other vision towers
#
# The towers of `towers` (their geometry from `rope_kernels/towers.py`, below), timed in the same
# run as the main encoder: the whole encoder on one GPU, every round all of a bucket's variants
# (those that rotate the tower's way; the others are named above with why). Windowed layers attend
# within windows (`rope_kernels/model/vit.py`: tokens gathered window by window once, as vLLM
# runs Qwen2.5-VL; the attention kernel is named in each row). Encoder median per tower, variant
# and images, and what `fused` saves over `native` per tower (from these rows):

# %%
# NBVAL_IGNORE_OUTPUT
from rope_kernels.towers import get_tower
others = latency_all[(latency_all.encoder != encoder) & (latency_all.encoder_parallel == "1gpu")]
if len(others):
    display(pd.DataFrame([{"tower": t.name, "layers": t.layers, "heads x head_dim": f"{t.heads} x {t.head_dim}",
                           "rotation": t.rotation, "windowed layers": t.windowed_layers,
                           "window [px]": t.window_px, "TTFT language model": t.llm_model or t.llm_note}
                          for t in map(get_tower, towers)]))
    display(others.pivot_table(index=["encoder", "resolution", "images", "mode"], columns="variant",
                               values="median_ms").rename_axis(columns="encoder median [ms]").round(2))
    tw = others.pivot_table(index=["encoder", "resolution", "images", "vit_tokens", "mode"], columns="variant",
                            values="median_ms").reset_index()
    for v in ("fused", "fused_inplace"):
        if {"native", v} <= set(tw.columns):
            tw[f"{v}_saving_ms"] = tw["native"] - tw[v]
            tw[f"{v}_saving_pct"] = 100 * (tw["native"] - tw[v]) / tw["native"]
    display(with_units(tw[[c for c in tw.columns if c in ("encoder", "resolution", "images", "vit_tokens", "mode")
                           or c.endswith(("_saving_ms", "_saving_pct"))]]).round(2))
    sat = tw[tw.images == tw.images.max()]
    for _, r in sat.iterrows():
        if "fused_saving_pct" in sat:
            print(f"{r.encoder} {r.resolution} x {r.images} ({r['mode']}): fused saves {r.fused_saving_ms:.3f} ms "
                  f"= {r.fused_saving_pct:.2f}% of native's {r.native:.2f} ms")
    tower_ttft_rows = ttft_every[(ttft_every.encoder != encoder) & (ttft_every.encoder_parallel == "1gpu")]
    for name, why in towers_without_ttft(towers).items():
        print(f"{name}: no time to first token ({why})")
    if len(tower_ttft_rows):
        first_tower = tower_ttft_rows.iloc[0]
        print(f"{first_tower.encoder} prefill: {first_tower.prefill_llm}, {first_tower.prefill_source} "
              f"{first_tower.prefill_system} {first_tower.prefill_parallelism}; {first_tower.prefill_note}")
        display(tower_ttft_rows.pivot_table(index=["encoder", "resolution", "images", "llm_prefill_tokens"],
                                            columns=["encoder_policy", "variant"], values="ttft_ms").round(1))
else:
    print("no further towers in this run (parameter towers)")

# %% [markdown]
# **Caveats.** Random weights: the latency is the real model's (same shapes, same kernels), the
# outputs are not. Attention uses PyTorch's kernels (no flash_attn package on the H200 here).
# Time to first token is encoder latency (measured) plus a prefill that is predicted, not
# measured: by aiconfigurator-core from per-operation tables measured on the device's GPUs (vLLM's
# chunks, each after its prefix, beside one unchunked prefill, at batch 1: no queueing, no other
# requests; beyond its MoE tables the unchunked prefill is extrapolated, and the rows say so), or by the hand model from the language
# model's size, attention, GPUs and an assumed MFU band, or from the prefill throughput a user
# measured (`prefill_tokens_per_s`). The public anchors are other GPUs, precisions and loads.
# The tp8 and dp8 rows time one GPU's work on one GPU; their collectives are modelled from a
# bus bandwidth with no latency term (a lower bound), not measured on 8 GPUs.
