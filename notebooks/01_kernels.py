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
rotations = ["pairs", "half"]  # Kimi's interleaved pairs, Qwen's rotate-half: every shape in each
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
from pathlib import Path

import pandas as pd
import torch
import triton
import triton.language as tl

from rope_kernels import VARIANTS, cos_sin_views, native_rope
from rope_kernels.correctness import check_variant
from rope_kernels.bench.correctness_sweep import absent, correctness_rows
from rope_kernels.bench.microbench import Shape, make_arg_sets, parse_dtype
from rope_kernels.bench.timing import time_fn
from rope_kernels.kernels.fused import (_fused_qk_rope_rows_kernel, _load_row_chunk, _row_cos_sin,
                                        _row_offsets, _rotate_halves_rows, _rotate_row_half,
                                        _rotate_row_pairs, _store_row_chunk, fused_launch_config,
                                        rows_launch_config)
from rope_kernels.study.devices import data_line, provenance
from rope_kernels.study.notebooks import check_parameters, notebook_setup, show_source
from rope_kernels.study.plots import with_units

kind, dev = notebook_setup(device)  # quiet known warnings, display and plot style
check_parameters("01_kernels", globals(), kind)  # the runner's rules and messages, for plain papermill too

# %% tags=["appendix"]
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
# One launch rotates q and k together. A program owns a few whole tokens: each token's q
# row and k row, every head (`heads x head_dim` elements, contiguous in a packed qkv), covered
# by two power-of-two chunks (16 x 72 = 1152 = 1024 + 128). A pair's cos/sin is fetched by its
# index within its head, straight from `freqs_cis` (strided views, no copy; cos and sin
# interleaved there, so one contiguous load), in q's own layout; every head re-reads the
# token's values from L1. The math is fp32 whatever the data type. Rotate-half (Qwen's towers,
# `rotation="half"`) tiles a token as every head's two halves at the same columns
# (`_rotate_halves_rows`), so a pair sits in one thread and its cos/sin are one load per column.
# Rendered from the library's source:

# %%
show_source(_rotate_row_pairs)
show_source(_row_offsets)
show_source(_row_cos_sin)
show_source(_load_row_chunk)
show_source(_store_row_chunk)
show_source(_fused_qk_rope_rows_kernel)
show_source(_rotate_row_half)
show_source(_rotate_halves_rows)

# %% [markdown]
# The launch settings come from a small documented heuristic, not autotuning, so one compile
# serves every token count: whole tokens filling 4 KB of q per program (the tile an
# exploration run on the H200 found fastest or within 1% of it at Kimi's shapes; the
# launch-config sweep of notebook 2 times it beside the other tiles and the earlier
# tiles-of-heads kernel, `bench/fused_candidates.py`):

# %%
show_source(rows_launch_config)
show_source(fused_launch_config)

# %% [markdown]
# ## Every variant, every dtype
#
# `launches` is the number of kernels one call makes (bf16 data), recorded beside each
# variant and checked against the profiler in notebook 3.

# %%
names = [n for n in variants or VARIANTS if n in VARIANTS]  # absent peers: see below
pd.DataFrame([{"variant": n, "launches": VARIANTS[n].launches,
               "launches_fp32": VARIANTS[n].launches_fp32,
               "description": VARIANTS[n].description} for n in names])

# %% [markdown]
# ## Peers: the engines' own code at pinned versions
#
# A peer is someone else's shipped code, run from their package (or from the few files it
# runs, fetched from the pinned wheel by `python -m rope_kernels peers fetch` and checked
# against pinned sha256s). Which ran here, and why the others did not:

# %%
# NBVAL_IGNORE_OUTPUT
from rope_kernels.variants import peer_status
pd.DataFrame(peer_status())[["name", "available", "package", "version", "origin", "sha256", "reason"]]

# %% [markdown]
# Every registered variant against float64 on every dtype and shape, every encoder-only RoPE
# mode notebook 4 times (the QKV projection with q and k rotated in its epilogue, its
# rotation-free floor, checked at the encoder's head_dim 72; `none` has nothing to check; in
# rotate-half the Triton QKV kernel reads cos/sin from the table, the CuTe and QuACK ones rotate
# pairs only), and every peer or mode that cannot run here, recorded with the reason (not run)
# instead of left out:

# %%
correctness = pd.DataFrame(correctness_rows(variants, dtypes, shapes, device=dev, seed=seed,
                                            rotations=rotations))
shown = correctness[~absent(correctness)][["variant", "rotation", "dtype", "tokens", "heads", "head_dim", "max_abs_err",
                     "native_max_abs_err", "tolerance", "rel_err", "inputs_intact", "passed",
                     "reason"]]
errors = ["max_abs_err", "native_max_abs_err", "tolerance", "rel_err"]
with_units(shown).style.format({header: "{:.1e}" for header in with_units(shown[errors]).columns}).hide(
    axis="index")

# %% [markdown]
# Peers that could not run here (their rows are recorded, not run; the reason depends on this
# machine):

# %%
# NBVAL_IGNORE_OUTPUT
correctness[absent(correctness)].groupby("variant", sort=False)[["peer_package", "reason"]].first()

# %% [markdown]
# Per variant, rotation and dtype: `pass`, `FAIL`, or `n/a` where the implementation does not
# take those inputs or cannot run here (its row above says why; such rows are recorded, not run);
# `n/a, pass` where it does not take some of the shapes (FlashInfer at head_dim 72; rotate-half
# also at 80). "pairs" is Kimi's interleaved rotation, "half" Qwen's rotate-half (x[j] with
# x[j + D/2]), against the float64 reference in the same layout.

# %%
outcome = correctness.passed.map({True: "pass", False: "FAIL"}).where(correctness.supported, "n/a")
correctness.assign(outcome=outcome).groupby(["variant", "rotation", "dtype"], sort=False).outcome.agg(
    lambda o: ", ".join(sorted(set(o)))).unstack()

# %%
ran = correctness[correctness.supported]
assert ran.passed.all(), ran[~ran.passed]
if data_dir:
    from rope_kernels.study.results import upsert_csv
    from rope_kernels.study.specs import CORRECTNESS_CSV
    written = Path(data_dir) / CORRECTNESS_CSV
    upsert_csv(written, correctness.assign(**provenance(kind)))  # key: specs.RESULT_FILES
    print(data_line(written))  # what this report wrote; tests compare it with the CSV


# %% [markdown]
# ## Try your own variant
#
# A kernel written here, in the notebook, goes through the same harness as the library's:
# checked against the float64 reference on fresh random data (poisoned outputs, strided q/k
# views of a packed qkv buffer), then timed beside native and the library's fused kernel (on a
# GPU also under CUDA graphs). The example is deliberately simple: one program per token
# rotates every head of that token, one launch for q and one for k, out of place. Edit it.

# %%
@triton.jit
def _my_rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, heads, half,
                    stride_xt, stride_xh, stride_ct, stride_cp,
                    BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)  # int64 before pointer math: large T stays in range
    h = tl.arange(0, BLOCK_H)[:, None]
    p = tl.arange(0, BLOCK_P)[None, :]
    mask = (h < heads) & (p < half)
    # One cos/sin row per token, broadcast over the heads; fp32 math whatever the data type.
    cos = tl.load(cos_ptr + t * stride_ct + p * stride_cp, mask=p < half)
    sin = tl.load(sin_ptr + t * stride_ct + p * stride_cp, mask=p < half)
    x = x_ptr + t * stride_xt + h * stride_xh + 2 * p
    x_even = tl.load(x, mask=mask).to(tl.float32)
    x_odd = tl.load(x + 1, mask=mask).to(tl.float32)
    out = out_ptr + (t * heads + h) * (2 * half) + 2 * p
    tl.store(out, (x_even * cos - x_odd * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 1, (x_even * sin + x_odd * cos).to(out_ptr.dtype.element_ty), mask=mask)


def my_rope(xq, xk, freqs_cis):
    """(xq, xk, freqs_cis) -> new contiguous (q, k); xq/xk may be strided views."""
    cos, sin = cos_sin_views(freqs_cis)  # fp32 views into the complex table, no copy
    tokens, heads, head_dim = xq.shape
    rotated = []
    for x in (xq, xk):
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _my_rope_kernel[(tokens,)](x, cos, sin, out, heads, head_dim // 2,
                                   x.stride(0), x.stride(1), cos.stride(0), cos.stride(1),
                                   BLOCK_H=triton.next_power_of_2(heads),
                                   BLOCK_P=triton.next_power_of_2(head_dim // 2))
        rotated.append(out)
    return tuple(rotated)


def my_rope_turned_backwards(xq, xk, freqs_cis):
    """The same kernel fed conjugated angles: a wrong answer the checker must reject."""
    return my_rope(xq, xk, freqs_cis.conj().resolve_conj())


checked = pd.DataFrame([
    check_variant(fn, tokens=tokens, heads=heads, head_dim=head_dim, dtype=parse_dtype(dt),
                  device=dev, seed=seed, name=fn.__name__).as_dict()
    for fn in (my_rope, my_rope_turned_backwards)
    for dt in dtypes for tokens, heads, head_dim in shapes])
assert checked[checked.variant == "my_rope"].passed.all(), "my_rope is wrong: see the table"
assert not checked[checked.variant == "my_rope_turned_backwards"].passed.any(), "checker missed it"
checked.groupby(["variant", "dtype"]).passed.all().unstack()

# %% [markdown]
# Timed beside the library's kernels on the first shape (bf16):

# %%
# NBVAL_IGNORE_OUTPUT
tokens, heads, head_dim = shapes[0]
sets = make_arg_sets(Shape(tokens, heads, head_dim), torch.bfloat16, dev, 2)
modes = ["eager"] + (["cudagraph"] if dev.type == "cuda" else [])
timed = []
for label, fn in [("native", VARIANTS["native"]), ("fused", VARIANTS["fused"]), ("my_rope", my_rope)]:
    for mode in modes:
        t = time_fn(fn, sets, mode=mode, samples=20 if dev.type == "cuda" else 3)
        timed.append({"variant": label, "mode": mode, "timer": t.timer, "median_us": t.median_us,
                      "p20_us": t.p20_us, "p80_us": t.p80_us})
if dev.type == "cpu":
    print("CPU: Triton-interpreter / wall-clock timings, not GPU predictions.")
with_units(pd.DataFrame(timed)).round(2)

# %% [markdown]
# **Caveats.** On a CPU the Triton kernels run in Triton's interpreter, which this project
# patches to round fp32 to bf16 to nearest even as GPUs do (the interpreter truncates); CPU
# timings say nothing about GPU speed. `fused_inplace` rotates the caller's q/k in place
# (inside the packed qkv buffer); the checker verifies v is untouched.
