"""The study's plots and table headers, shared by the notebooks.

One colour per variant in every plot (the catalogue's; unknown names get a
stable fallback), one line style per image resolution, p20-p80 error bars,
legends outside the data, panels wrapped a few per row, and a caveat printed on
any plot of CPU (Triton interpreter, wall clock) timings. Every function plots
whatever variants the data holds.
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from rope_kernels.catalogue import CATALOGUE
from rope_kernels.study.targets import ENCODER_BUCKET

# One colour per variant, from the catalogue (distinct hues for the variants one plot shows
# together; a test keeps every pair of kernel, encoder and QKV-GEMM variants apart).
VARIANT_COLORS = {name: e.colour for name, e in CATALOGUE.items()}
_FALLBACK_COLORS = ("#637939", "#7b4173", "#843c39", "#3182bd", "#a55194", "#6b6ecf",
                    "#bd9e39", "#ad494a", "#5254a3", "#8ca252")
_LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
_MARKERS = ("o", "s", "^", "D", "v", "P")
CPU_CAVEAT = ("CPU run: Triton-interpreter / wall-clock timings. They say nothing about GPU "
              "speed; run the GPU profile for real numbers.")
REPORT_STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 10,
    "ytick.labelsize": 10, "legend.fontsize": 9, "figure.dpi": 100, "axes.grid": True,
    "grid.alpha": 0.3,
}

# Column -> header with its unit, for tables people read.
UNITS = {
    "median_us": "median [us]", "p20_us": "p20 [us]", "p80_us": "p80 [us]",
    "median_ms": "median [ms]", "p20_ms": "p20 [ms]", "p80_ms": "p80 [ms]",
    "pct_of_copy": "of copy bandwidth [%]", "pct_of_same_bytes_copy": "of same-bytes SM copy [%]",
    "gbps": "bandwidth [GB/s]", "copy_gbps": "copy ceiling [GB/s]",
    "same_bytes_copy_us": "same-bytes SM copy [us]", "speedup_vs_native": "speedup vs native [x]",
    "peak_mem_mb": "peak memory [MB]", "bytes": "minimal traffic [B]",
    "launches": "launches [per call]", "launches_per_call": "launches [per call]",
    "per_forward": "launches [per forward]", "device_time_us": "device time [us]",
    "max_abs_err": "max abs error", "native_max_abs_err": "native max abs error",
    "rel_err": "relative error", "tolerance": "tolerance (abs)",
    "vit_tokens": "vision tokens", "llm_tokens": "LLM tokens",
    "rope_share": "RoPE share [%]", "profiled_rope_share": "RoPE share [%]",
    "rope_device_ms": "RoPE device time [ms]", "rope_minimal_ms": "RoPE minimum [ms]",
    "paired_saving_pct": "saving vs native [%]", "paired_saving_pct_p20": "saving p20 [%]",
    "paired_saving_pct_p80": "saving p80 [%]", "paired_rope_cost_ms": "RoPE cost [ms]",
    "paired_rope_cost_ms_p20": "RoPE cost p20 [ms]", "paired_rope_cost_ms_p80": "RoPE cost p80 [ms]",
    "our_native_us": "our native [us]", "our_fused_us": "our fused [us]",
    "native_us": "PR native [us]", "fused_us": "PR fused [us]", "speedup": "PR speedup [x]",
    "our_speedup": "our speedup [x]",
}
_SUFFIX_UNITS = (("_speedup_vs_native", "speedup vs native [x]"),
                 ("_pct_of_copy", "of copy bandwidth [%]"), ("_saving_pct", "saving vs native [%]"), ("_saving_ms", "saving vs native [ms]"),
                 ("_rope_cost_ms", "RoPE cost [ms]"), ("_over_minimal", "/ minimum [x]"),
                 ("_ms", "[ms]"), ("_us", "[us]"), ("_pct", "[%]"), ("_mb", "[MB]"),
                 ("_gbps", "[GB/s]"))


def variant_color(name: str) -> str:
    """The variant's colour in every plot (the catalogue's); unknown names map to a stable
    fallback."""
    if name in CATALOGUE:
        return CATALOGUE[name].colour
    digest = int(hashlib.sha1(name.encode()).hexdigest(), 16)
    return _FALLBACK_COLORS[digest % len(_FALLBACK_COLORS)]


def resolution_style(resolution: str, resolutions: Sequence[str]) -> tuple[object, str]:
    """(line style, marker) of a resolution, by its position in ``resolutions``."""
    i = list(resolutions).index(resolution)
    return _LINE_STYLES[i % len(_LINE_STYLES)], _MARKERS[i % len(_MARKERS)]


def header(column: str) -> str:
    """A table header with its unit (``median_us`` -> ``median [us]``)."""
    if column in UNITS:
        return UNITS[column]
    for tag in ("_best", "_default"):  # a config sweep's best and default rows side by side
        if column.endswith(tag):
            return f"{header(column.removesuffix(tag))} ({tag[1:]})"
    for suffix, unit in _SUFFIX_UNITS:
        if column.endswith(suffix) and column != suffix.lstrip("_"):
            return f"{column.removesuffix(suffix)} {unit}"
    return column


def with_units(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every column (and column level) that has a unit renamed to show it."""
    return df.rename(columns=header)


def use_report_style() -> None:
    """Readable defaults for the notebooks' figures (10-11 pt text)."""
    plt.rcParams.update(REPORT_STYLE)


def is_cpu_run(df: pd.DataFrame) -> bool:
    """True when the rows were timed on a CPU (interpreter, wall clock)."""
    if "device_kind" in df and len(df):
        return bool((df["device_kind"] == "cpu").any())
    if "timer" in df and len(df):
        return bool(df["timer"].astype(str).str.contains("cpu").any())
    return False


def panel_grid(n: int, *, ncols: int = 3, width: float = 4.3, height: float = 3.3,
               sharey: bool = False):
    """A figure of ``n`` panels wrapped ``ncols`` per row; returns (fig, axes list)."""
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False, sharey=sharey, layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def spread(df: pd.DataFrame, value: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The p20 and p80 of ``value`` in each row, where the data allows.

    ``<value>_p20``/``_p80`` columns when present; for ``*_us``/``*_ms`` the row's
    ``p20_<unit>``/``p80_<unit>``; for rates (speedup, % of copy, GB/s), which scale as
    1/time, the row's own time spread applied to it (the baseline's spread is not in the row).
    """
    if f"{value}_p20" in df and f"{value}_p80" in df:
        return df[f"{value}_p20"].to_numpy(float), df[f"{value}_p80"].to_numpy(float)
    for unit in ("us", "ms"):
        if value == f"median_{unit}" and {f"p20_{unit}", f"p80_{unit}"} <= set(df.columns):
            return df[f"p20_{unit}"].to_numpy(float), df[f"p80_{unit}"].to_numpy(float)
    if value in ("speedup_vs_native", "pct_of_copy", "pct_of_same_bytes_copy", "gbps") and \
            {"median_us", "p20_us", "p80_us"} <= set(df.columns):
        v, med = df[value].to_numpy(float), df["median_us"].to_numpy(float)
        return v * med / df["p80_us"].to_numpy(float), v * med / df["p20_us"].to_numpy(float)
    return None


def _errorbar(ax, df: pd.DataFrame, x: str, value: str, **style):
    df = df.sort_values(x)
    y = df[value].to_numpy(float)
    bounds = spread(df, value)
    yerr = None
    if bounds is not None:
        lo, hi = bounds
        yerr = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
        yerr = np.nan_to_num(yerr)
    return ax.errorbar(df[x], y, yerr=yerr, capsize=2.5, lw=1.6, ms=4.5, elinewidth=1, **style)


def _variant_handles(variants: Sequence[str], floor: str | None = "none") -> list[Line2D]:
    return [Line2D([], [], color=variant_color(v), lw=2, marker="o", ms=5,
                   label=f"{v} (RoPE skipped: floor)" if v == floor else v) for v in variants]


# -- grouping: ours / the engines' / baselines / references, the ones that matter solid --------

MAX_SOLID = 6  # more lines than this in one panel: the rest are drawn faded
_FADED_NOTE = "; faded: the rest"


def grouped(names: Sequence[str]) -> list[str]:
    """``names`` in the catalogue's order: ours, the engines', baselines, references."""
    from rope_kernels import catalogue

    return sorted(dict.fromkeys(names), key=catalogue.order_key)


def emphasised(data: pd.DataFrame, names: Sequence[str], time: str, x: str) -> set[str]:
    """Which variants a crowded plot draws solid: every one when there are at most
    ``MAX_SOLID``; else ours, native, the floor, the RoPE each engine's Kimi-K2.5 tower calls
    (``summaries.SHIPPED``) and the fastest engine kernel (least ``time`` at the largest ``x``)."""
    from rope_kernels import catalogue
    from rope_kernels.study.summaries import SHIPPED

    names = list(names)
    if len(names) <= MAX_SOLID:
        return set(names)
    group = {n: (catalogue.entry(n).group if catalogue.entry(n) else "") for n in names}
    solid = {n for n in names if group[n] == "ours" or n in ("native", "none", *(v for _, v in SHIPPED))}
    engines = [n for n in names if group[n] == "engine"]
    if engines and time in data.columns and x in data.columns and len(data):
        at = data[data[x] == data[x].max()].groupby("variant")[time].median()
        ranked = [n for n in engines if n in at.index and np.isfinite(at[n])]
        if ranked:
            solid.add(min(ranked, key=lambda n: at[n]))
    return solid


def few_that_matter(data: pd.DataFrame, names: Sequence[str], time: str, x: str) -> set[str]:
    """The lines a plot of many near-equal curves draws (at most MAX_SOLID of them): native,
    the floor, the RoPE each engine's Kimi-K2.5 tower calls (``summaries.SHIPPED``), the fastest
    of ours and the fastest other engine kernel (least median ``time`` at the largest ``x``)."""
    from rope_kernels import catalogue
    from rope_kernels.study.summaries import SHIPPED

    names = list(names)
    if len(names) <= MAX_SOLID:
        return set(names)
    keep = {n for n in names if n in ("native", "none", *(v for _, v in SHIPPED))}
    at = data[data[x] == data[x].max()].groupby("variant")[time].median() if len(data) else pd.Series(dtype=float)
    for grp in ("ours", "engine"):
        ranked = [n for n in names if n not in keep and n in at.index and np.isfinite(at[n])
                  and (catalogue.entry(n).group if catalogue.entry(n) else "") == grp]
        if ranked:
            keep.add(min(ranked, key=lambda n: at[n]))
    return keep


def _faded(name: str, solid: set[str]) -> dict:
    return {} if name in solid else {"alpha": 0.25, "zorder": 1}


def grouped_handles(names: Sequence[str], solid: set[str], floor: str | None = "none") -> list[Line2D]:
    """Legend entries under a heading per group, faded ones faded."""
    from rope_kernels import catalogue

    out, last = [], None
    for v in names:
        e = catalogue.entry(v)
        g = e.group if e else "other"
        if g != last:
            out.append(Line2D([], [], color="none", label={"ours": "ours", "engine": "the engines' kernels",
                                                             "baseline": "baselines", "reference": "references"}
                              .get(g, g).upper()))
            last = g
        label = f"{v} (RoPE skipped: floor)" if v == floor else v
        out.append(Line2D([], [], color=variant_color(v), lw=2, marker="o", ms=5, label=label,
                          alpha=1.0 if v in solid else 0.3))
    return out


def finish(fig, data: pd.DataFrame, handles: Sequence[Line2D], *, title: str | None = None,
           extra: Sequence[Line2D] = ()):
    """Legend outside the panels (right), optional title, and the CPU caveat on CPU data."""
    legend = fig.legend(handles=list(handles) + list(extra), loc="outside right upper",
                        frameon=False)
    legend.set_in_layout(True)
    if is_cpu_run(data):  # below the panels, where neither the legend nor the title sits
        width = max(40, int(fig.get_figwidth() * 13))
        fig.supxlabel(textwrap.fill(CPU_CAVEAT, width), fontsize=10, color="#b00020")
    # last: everything that takes room is placed, so the wrapping sees the final layout
    _fit_text(fig, legend, fig.suptitle(title, fontsize=10, x=0.02, ha="left") if title else None)
    return fig


def _wrapped(text: str, size: float, room: float) -> str | None:
    """``text`` wrapped so its longest line, ``size`` long now, fits ``room``; None if it fits."""
    if size <= room:
        return None
    longest = max(len(line) for line in text.split("\n"))
    return textwrap.fill(text.replace("\n", " "), max(10, int(longest * room / max(size, 1)) - 1))


def _fit_x_labels(fig) -> bool:
    """Wrap each x label that reaches past the figure's left or right edge (it is centred
    under its axes, which start right of long y tick labels: saved without
    bbox_inches="tight", its ends were cut off). Draws; True if a label changed."""
    fig.canvas.draw()
    renderer, edge, changed = fig.canvas.get_renderer(), fig.bbox, False
    for ax in fig.axes:
        label = ax.xaxis.label
        if not (ax.get_visible() and label.get_text()):
            continue
        box = label.get_window_extent(renderer)
        centre = (box.x0 + box.x1) / 2
        new = _wrapped(label.get_text(), box.width, 2 * min(centre - edge.x0, edge.x1 - centre) - 8)
        if new is not None and new != label.get_text():
            label.set_text(new)
            changed = True
    return changed


def _fit_text(fig, legend, suptitle=None) -> None:
    """Wrap what would collide, until nothing does (each wrap moves the layout): a y label
    taller than its panel (it reaches into the title's line) and a figure title that runs
    into the legend (beside one or two narrow panels the legend's top reaches the title)."""
    renderer = fig.canvas.get_renderer()
    for _ in range(4):
        changed = _fit_x_labels(fig)  # draws
        for ax in fig.axes:
            label = ax.yaxis.label
            if ax.get_visible() and label.get_text():
                new = _wrapped(label.get_text(), label.get_window_extent(renderer).height,
                               ax.get_window_extent(renderer).height)
                if new is not None and new != label.get_text():
                    label.set_text(new)
                    changed = True
        if suptitle is not None:
            text, box = suptitle.get_window_extent(renderer), legend.get_window_extent(renderer)
            if text.overlaps(box):
                new = _wrapped(suptitle.get_text(), text.width, box.x0 - text.x0 - 8)
                if new is not None and new != suptitle.get_text():
                    suptitle.set_text(new)
                    changed = True
        if not changed:
            return


def _ordered(values, order: Sequence | None = None) -> list:
    seen = list(dict.fromkeys(values))
    if order:
        return [v for v in order if v in seen] + [v for v in seen if v not in order]
    return seen


def _tokens_label(value: float) -> str:
    """Short token labels: 256, 1k, 4k (powers of two in 1024s), 5.48k, 21.9k, 87.6k."""
    value = int(round(value))
    if value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}k"
    return f"{value / 1000:.3g}k" if value >= 1000 else str(value)


def _token_axis(ax, tokens):
    """Log-2 token axis labelled at the measured token counts (256, 1k, 4k, ...)."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(t) for t in tokens))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tokens_label(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    # Kimi's 21.9k, 43.8k, 87.6k are one octave apart: upright labels there touch.
    ax.tick_params(axis="x", rotation=90 if len(ticks) > 4 else 0)
    ax.set_xlabel("tokens")


def _log_axis(axis):
    """A log axis with plain-number labels: base 2 (0.5, 1, 2, 4, 8) over a narrow range,
    base 10 (0.001, 0.01, 0.1, 1) over a wide one."""
    low, high = axis.axes.dataLim.intervaly
    wide = low > 0 and high / low > 64
    axis.axes.set_yscale("log", base=10 if wide else 2)
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def kernel_panels(bench: pd.DataFrame, value: str, ylabel: str, *, mode: str | None = None,
                  dtype: str | None = None, hline: float | None = None, logy: bool = False,
                  variants: Sequence[str] | None = None, ncols: int = 3):
    """``value`` against tokens, one panel per head layout (heads x head_dim), one
    colour per variant, p20-p80 error bars. ``mode`` defaults to cudagraph if
    present, else eager; ``dtype`` to the first in the data."""
    if mode is None:
        mode = next(m for m in ("cudagraph", "eager", *bench["mode"].unique())
                    if m in set(bench["mode"]))
    dtype = dtype or bench["dtype"].iloc[0]
    sub = bench[(bench["mode"] == mode) & (bench["dtype"] == dtype)]
    layouts = sorted(sub.groupby(["heads", "head_dim"]).groups)
    names = grouped(_ordered(sub["variant"], variants))
    solid = emphasised(sub, names, "median_us", "tokens")
    fig, axes = panel_grid(len(layouts), ncols=ncols)
    for ax, (heads, head_dim) in zip(axes, layouts):
        panel = sub[(sub.heads == heads) & (sub.head_dim == head_dim)]
        for name in names:
            rows = panel[panel.variant == name]
            if len(rows):
                _errorbar(ax, rows, "tokens", value, color=variant_color(name), marker="o",
                          **_faded(name, solid))
        if hline is not None:
            ax.axhline(hline, color="k", lw=0.8, ls="--")
        _token_axis(ax, panel.tokens)
        if logy:
            _log_axis(ax.yaxis)
        ax.set_title(f"{heads} heads x {head_dim}")
        ax.set_ylabel(ylabel)
    return finish(fig, sub, grouped_handles(names, solid),
                  title=f"{dtype}, {mode}; bars: p20-p80" + _FADED_NOTE * (solid != set(names)))


def pr_table_plot(comparisons: dict[str, pd.DataFrame], data: pd.DataFrame | None = None):
    """Our fused time and speedup beside PR #50400's published ones, per L2 regime."""
    fig, axes = panel_grid(2, ncols=2, width=5.6)
    handles = []
    for (mode, cmp), marker in zip(comparisons.items(), ("o", "s")):
        labels = [f"{t}x{h}" for t, h in zip(cmp.tokens, cmp.heads)]
        style = dict(color=variant_color("fused"), marker=marker,
                     ls="-" if mode == "cudagraph" else "--")
        axes[0].plot(labels, cmp.our_fused_us, **style)
        axes[1].plot(labels, cmp.our_speedup, **style)
        handles.append(Line2D([], [], label=f"our fused ({mode})", **style))
    pr = dict(color="k", marker="x", ls=":")
    axes[0].plot(labels, cmp.fused_us, **pr)
    axes[1].plot(labels, cmp.speedup, **pr)
    handles.append(Line2D([], [], label="PR #50400 (published)", **pr))
    axes[0].set_ylabel("fused time per call [us]")
    axes[1].set_ylabel("fused speedup over native [x]")
    for ax in axes:
        ax.tick_params(axis="x", rotation=60)
        ax.set_xlabel("tokens x heads (head_dim 128)")
    return finish(fig, data if data is not None else pd.DataFrame(), handles)


TARGET_BUCKET = ENCODER_BUCKET  # where the encoder targets are judged


def _mark_target_bucket(ax):
    """A dotted vertical line at the target bucket's image count, labelled."""
    res, n = TARGET_BUCKET
    ax.axvline(n, color="#555555", lw=1, ls=":", zorder=0)
    ax.annotate(f"targets: {n} x {res}", xy=(n, 1), xycoords=("data", "axes fraction"),
                xytext=(-3, -3), textcoords="offset points", ha="right", va="top", fontsize=9,
                color="#555555")


def _image_axis(ax, images: Sequence[int]):
    ticks = sorted(set(int(i) for i in images))
    ax.set_xlim(0, max(ticks) + 1)
    ax.set_xticks(ticks)
    ax.set_xlabel("images per request")


def encoder_latency(ttft: pd.DataFrame, *, mode: str, resolutions: Sequence[str] | None = None,
                    variants: Sequence[str] | None = None, floor: str = "none", ncols: int = 3):
    """Encoder median latency [ms] against images per request on linear axes, one
    panel per resolution, p20-p80 error bars; the floor (RoPE skipped) dashed."""
    sub = ttft[ttft["mode"] == mode]
    res = _ordered(sub.resolution, resolutions)
    names = grouped(_ordered(sub.variant, variants))
    solid = emphasised(sub, names, "median_ms", "images")
    fig, axes = panel_grid(len(res), ncols=ncols)
    for ax, r in zip(axes, res):
        panel = sub[sub.resolution == r]
        for name in names:
            rows = panel[panel.variant == name]
            if len(rows):
                _errorbar(ax, rows, "images", "median_ms", color=variant_color(name),
                          marker="o", ls="--" if name == floor else "-", **_faded(name, solid))
        _image_axis(ax, panel.images)
        ax.set_ylim(bottom=0)
        if r == TARGET_BUCKET[0]:
            _mark_target_bucket(ax)
        ax.set_title(r)
        ax.set_ylabel("encoder forward [ms]")
    return finish(fig, sub, grouped_handles(names, solid, floor),
                  title=f"{mode}; median, bars: p20-p80 over rounds" + _FADED_NOTE * (solid != set(names)))


def saving_vs_native(ttft: pd.DataFrame, *, modes: Sequence[str] | None = None,
                     resolutions: Sequence[str] | None = None,
                     variants: Sequence[str] | None = None, baseline: str = "native",
                     ncols: int = 2):
    """Each variant's saving over ``baseline`` [%] against images per request: one panel
    per mode, colour per variant, line style per resolution. Uses the per-round paired
    saving (median, p20-p80 bars) when the rows carry it, else the ratio of medians."""
    modes = _ordered(ttft["mode"], modes)
    res = _ordered(ttft.resolution, resolutions)
    names = [v for v in _ordered(ttft.variant, variants) if v != baseline]
    paired = "paired_saving_pct" in ttft
    fig, axes = panel_grid(len(modes), ncols=ncols, width=5.4, height=3.6)
    for ax, mode in zip(axes, modes):
        sub = ttft[ttft["mode"] == mode]
        if not paired:
            base = sub[sub.variant == baseline].set_index(["resolution", "images"]).median_ms
            sub = sub.assign(paired_saving_pct=[
                100 * (base.get((r, n), np.nan) - ms) / base.get((r, n), np.nan)
                for r, n, ms in zip(sub.resolution, sub.images, sub.median_ms)])
        for name in names:
            for r in res:
                rows = sub[(sub.variant == name) & (sub.resolution == r)]
                if len(rows):
                    ls, marker = resolution_style(r, res)
                    _errorbar(ax, rows, "images", "paired_saving_pct",
                              color=variant_color(name), ls=ls, marker=marker)
        ax.axhline(0, color="k", lw=0.8)
        _image_axis(ax, sub.images)
        if TARGET_BUCKET[0] in res:
            _mark_target_bucket(ax)
        ax.set_title(mode)
        ax.set_ylabel(f"saving over {baseline} [%]")
    styles = [Line2D([], [], color="k", ls=resolution_style(r, res)[0],
                     marker=resolution_style(r, res)[1], label=r) for r in res]
    how = "per-round paired saving, median; bars: p20-p80" if paired else "ratio of medians"
    return finish(fig, ttft, _variant_handles(names), extra=styles, title=how)


def _ttft_lines(ax, panel: pd.DataFrame, names: Sequence[str], floor: str, ttft: str,
                prefill: str) -> pd.DataFrame:
    """A panel's TTFT against images: a line per variant (``floor`` dashed) from column
    ``ttft``, the prefill alone (column ``prefill``) dotted; returns the prefill's rows."""
    for name in names:
        rows = panel[panel.variant == name].sort_values("images")
        if len(rows):
            ax.plot(rows.images, rows[ttft], color=variant_color(name), marker="o", ms=4.5,
                    lw=1.6, ls="--" if name == floor else "-")
    rows = panel.drop_duplicates("images").sort_values("images")
    ax.plot(rows.images, rows[prefill], color="k", ls=":", lw=1.2)
    return rows


def time_to_first_token(ttft: pd.DataFrame, *, mode: str, resolutions: Sequence[str] | None = None,
                        variants: Sequence[str] | None = None, floor: str = "none",
                        ncols: int = 3):
    """Time to first token [ms] (measured encoder median + modelled prefill, central;
    ``prefill.add_ttft`` rows) against images per request, one panel per
    resolution; the prefill alone dotted, and its band (fast..slow) shaded."""
    sub = ttft[ttft["mode"] == mode]
    res = _ordered(sub.resolution, resolutions)
    names = _ordered(sub.variant, variants)
    fig, axes = panel_grid(len(res), ncols=ncols)
    for ax, r in zip(axes, res):
        panel = sub[sub.resolution == r]
        prefill = _ttft_lines(ax, panel, names, floor, "modelled_ttft_ms", "modelled_prefill_ms")
        ax.fill_between(prefill.images, prefill.modelled_prefill_fast_ms, prefill.modelled_prefill_slow_ms,
                        color="0.6", alpha=0.25, lw=0)
        _image_axis(ax, panel.images)
        ax.set_ylim(bottom=0)
        ax.set_title(r)
        ax.set_ylabel("time to first token [ms]")
    model = "; ".join(sorted(set(sub.get("prefill_model", pd.Series(dtype=str)))))
    extra = [Line2D([], [], color="k", ls=":", label="LLM prefill alone (modelled)"),
             Patch(color="0.6", alpha=0.25, label="prefill band (fast..slow)")]
    return finish(fig, sub, _variant_handles(names, floor), extra=extra,
                  title=textwrap.fill(f"{mode}; encoder median (measured) + prefill, modelled "
                                      f"({model})", max(40, int(fig.get_figwidth() * 7))))


def saving_pct_of_ttft(savings: pd.DataFrame, *, modes: Sequence[str] | None = None,
                       resolutions: Sequence[str] | None = None,
                       variants: Sequence[str] | None = None, ncols: int = 2):
    """What each variant's encoder saves over native, as % of native's time to first
    token (``prefill.rope_saving_pct_of_ttft`` rows), against images per request:
    one panel per mode, colour per variant, line style per resolution; bars: the
    prefill band's ends (slow prefill: a smaller share)."""
    modes = _ordered(savings["mode"], modes)
    res = _ordered(savings.resolution, resolutions)
    names = _ordered(savings.variant, variants)
    fig, axes = panel_grid(len(modes), ncols=ncols, width=5.4, height=3.6)
    for ax, mode in zip(axes, modes):
        sub = savings[savings["mode"] == mode]
        for name in names:
            for r in res:
                rows = sub[(sub.variant == name) & (sub.resolution == r)].sort_values("images")
                if len(rows):
                    ls, marker = resolution_style(r, res)
                    y = rows.saving_pct_of_ttft.to_numpy(float)
                    yerr = np.vstack([np.clip(y - rows.saving_pct_of_ttft_slow.to_numpy(float), 0, None),
                                      np.clip(rows.saving_pct_of_ttft_fast.to_numpy(float) - y, 0, None)])
                    ax.errorbar(rows.images, y, yerr=np.nan_to_num(yerr), capsize=2.5, lw=1.6,
                                ms=4.5, elinewidth=1, color=variant_color(name), ls=ls, marker=marker)
        ax.axhline(0, color="k", lw=0.8)
        _image_axis(ax, sub.images)
        ax.set_title(mode)
        ax.set_ylabel("encoder saving over native [% of TTFT]")
    styles = [Line2D([], [], color="k", ls=resolution_style(r, res)[0],
                     marker=resolution_style(r, res)[1], label=r) for r in res]
    return finish(fig, savings, _variant_handles(names), extra=styles,
                  title="bars: the prefill band's ends")


def headline_bars(values: pd.Series, xlabel: str, *, highlight: Sequence[str] = (), title: str = "",
                  reference: float | None = None, fmt: str = "{:.1f}"):
    """One horizontal bar per variant, grouped as the catalogue groups them (ours, the engines',
    baselines, references; a thin gap between groups), each in its catalogue colour; the
    ``highlight``ed variants solid and labelled with their value, the rest faded. A report's
    first figure: one number per variant at the shape that matters."""
    from rope_kernels import catalogue

    values = values[[v for v in values.index if pd.notna(values[v]) and np.isfinite(float(values[v]))]]
    order = sorted(values.index, key=catalogue.order_key)
    groups = [(catalogue.entry(v).group if catalogue.entry(v) else "other") for v in order]
    y, pos, last = [], 0.0, None
    for g in groups:
        if last is not None and g != last:
            pos += 0.6
        y.append(pos)
        pos, last = pos + 1, g
    fig, ax = plt.subplots(figsize=(8.6, 0.32 * len(order) + 1.3), layout="constrained")
    for v, yy in zip(order, y):
        solid = not highlight or v in highlight
        ax.barh(yy, float(values[v]), color=variant_color(v), alpha=1.0 if solid else 0.3, height=0.8)
        if solid:
            ax.annotate(fmt.format(float(values[v])), xy=(float(values[v]), yy), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=9)
    e = {v: catalogue.entry(v) for v in order}
    ax.set_yticks(y, [(e[v].label.replace("`", "") if e[v] else v) + ("" if e[v] is None else
                       f"  [{e[v].group}]") for v in order])
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    if reference is not None:
        ax.axvline(reference, color="k", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.margins(x=0.12)
    if title:  # above the bars' labels too, from the figure's left edge: never clipped by the axes
        fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    for _ in range(3):  # each wrap moves the layout
        if not _fit_x_labels(fig):
            break
    return fig


_ANCHOR_MARKERS = ("*", "P", "X", "D", "s")


def ttft_vs_images(ttft: pd.DataFrame, *, resolution: str = "1024x1024",
                   policies: Sequence[str] | None = None, variants: Sequence[str] | None = None,
                   anchors: pd.DataFrame | None = None, floor: str = "none",
                   show: Sequence[str] | None = None):
    """Time to first token [ms] (``prefill.ttft_rows``: encoder median + prefill)
    against images per request at one resolution, a line per RoPE choice, a panel per
    encoder policy (vLLM's default eager, vLLM's encoder graphs up to its budget, all
    graphs). The prefill alone is dotted; the hand model's band (its MFU ends, plus
    native's encoder) shaded, as the cross-check. ``anchors`` (``data/reference/
    ttft_anchors.csv``): the public absolute TTFTs drawn as labelled marks, as context."""
    sub = ttft[ttft["resolution"] == resolution]
    pols = _ordered(sub.encoder_policy, policies)
    names = _ordered(sub.variant, variants)
    # 13 lines within 2% of each other cannot be told apart: only the ones that matter are
    # drawn (``show``, default ``few_that_matter``); ttft_table gives every variant's numbers.
    solid = set(show) if show is not None else few_that_matter(sub, names, "ttft_ms", "images")
    hidden = [n for n in names if n not in solid]
    names = [n for n in names if n in solid]
    fig, axes = panel_grid(len(pols), ncols=3, sharey=True, height=4.8)
    marks = pd.DataFrame() if anchors is None else anchors[anchors["metric"].astype(str).str.startswith("ttft")
                                                          & anchors["after"].notna()
                                                          & (anchors["unit"] == "ms")]
    for ax, pol in zip(axes, pols):
        panel = sub[sub.encoder_policy == pol]
        prefill = _ttft_lines(ax, panel, names, floor, "ttft_ms", "prefill_ms")
        base = panel[panel.variant == "native"].sort_values("images")
        if len(base):
            ax.fill_between(base.images, base.encoder_ms + base.hand_prefill_fast_ms,
                            base.encoder_ms + base.hand_prefill_slow_ms, color="0.6", alpha=0.25, lw=0)
        for i, (_, a) in enumerate(marks.iterrows()):
            ax.plot([a["images"]], [a["after"]], marker=_ANCHOR_MARKERS[i % len(_ANCHOR_MARKERS)], ms=8,
                    color="#444444", mfc="none", ls="none")
        _image_axis(ax, panel.images)
        ax.set_ylim(bottom=0)
        ax.set_title(textwrap.fill(pol, 40))
        ax.set_ylabel("time to first token [ms]")
    source = "; ".join(sorted({" ".join(str(p) for p in parts if str(p).strip()) for parts in zip(
        sub.prefill_source, sub.prefill_package.fillna(""), sub.prefill_parallelism)}))
    extra = [Line2D([], [], color="k", ls=":", label="LLM prefill alone"),
             Patch(color="0.6", alpha=0.25, label="native + hand-model prefill band")]
    for i, (_, a) in enumerate(marks.iterrows()):  # other models, GPUs and loads: context
        extra.append(Line2D([], [], marker=_ANCHOR_MARKERS[i % len(_ANCHOR_MARKERS)], ms=8, color="#444444",
                            mfc="none", ls="none",
                            label=textwrap.fill(f"{a['source']} ({a['model']}, {a['hardware']}, {a['setup']}): "
                                                f"{a['metric']} {a['after']:g} ms", 48)))
    more = f"; {len(hidden)} more variants: the table below" if hidden else ""
    return finish(fig, sub, _variant_handles(names, floor), extra=extra,
                  title=textwrap.fill(f"{resolution}; prefill: {source}{more}", max(40, int(fig.get_figwidth() * 7))))


def ttft_table(ttft: pd.DataFrame, *, resolution: str = "1024x1024", value: str = "ttft_ms") -> pd.DataFrame:
    """Every variant's ``value`` at one resolution: a row per variant (the catalogue's order),
    a column per (encoder policy, images): what ``ttft_vs_images`` leaves out of its plot."""
    sub = ttft[ttft["resolution"] == resolution]
    table = sub.pivot_table(index="variant", columns=["encoder_policy", "images"], values=value, aggfunc="median")
    return table.reindex(grouped(table.index)).rename_axis(columns=["encoder policy", "images"]).round(1)
