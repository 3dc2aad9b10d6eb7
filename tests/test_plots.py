"""The study's plots: fixed colours per variant, error bars, legends outside the data,
wrapped panels, linear image axes, readable ticks, units in headers, the CPU caveat."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from rope_kernels import catalogue  # noqa: E402
from rope_kernels.study import plots  # noqa: E402

NAMED = ["native", "fused", "fused_inplace", "vllm_packed_qk", "sglang_vision", "vllm_merged",
         "vllm_merged_recreated", "compiled", "liger", "flashinfer", "quack_qkv", "quack_rotary",
         "sglang_kimi_k25", "none",
         "gemm_epilogue", "copy", "cublas_linear", "cublas_linear+fused_rope",
         "compile_max_autotune", "qkv_rope_linear", "qkv_rope_linear_angles"]


@pytest.fixture(autouse=True)
def _close_figures():
    plots.use_report_style()
    yield
    plt.close("all")


def _bench(kind="cuda"):
    rows = []
    for heads, head_dim in ((2, 72), (4, 72), (16, 72), (3, 128), (6, 128), (12, 128)):
        for tokens in (256, 1024, 4096):
            for variant, scale in (("native", 6.0), ("fused", 1.0), ("my_new_peer", 3.0)):
                med = scale * tokens / 100
                rows.append({"variant": variant, "tokens": tokens, "heads": heads,
                             "head_dim": head_dim, "dtype": "bfloat16", "mode": "cudagraph",
                             "median_us": med, "p20_us": 0.9 * med, "p80_us": 1.2 * med,
                             "speedup_vs_native": 6.0 / scale, "pct_of_copy": 80 / scale,
                             "device_kind": kind})
    return pd.DataFrame(rows)


def _ttft(kind="cuda"):
    rows = []
    for mode in ("eager", "cudagraph"):
        for res, per_image in (("448x448", 5.0), ("1024x1024", 22.0)):
            for images in (1, 2, 4, 8, 16, 32):
                for variant, factor, saving in (("native", 1.0, 0.0), ("fused", 0.93, 7.0),
                                                ("none", 0.92, 8.0)):
                    ms = per_image * images * factor
                    rows.append({"variant": variant, "resolution": res, "images": images,
                                 "mode": mode, "median_ms": ms, "p20_ms": 0.98 * ms,
                                 "p80_ms": 1.03 * ms, "paired_saving_pct": saving,
                                 "paired_saving_pct_p20": saving - 0.5,
                                 "paired_saving_pct_p80": saving + 0.4, "device_kind": kind})
    return pd.DataFrame(rows)


def _line_colours(fig) -> dict[str, set]:
    """Legend label -> colours of the data lines drawn in that colour."""
    drawn = {matplotlib.colors.to_hex(line.get_color()) for ax in fig.axes for line in ax.lines}
    out = {}
    for legend in fig.legends:
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            colour = matplotlib.colors.to_hex(handle.get_color())
            out[text.get_text().split(" (")[0]] = colour if colour in drawn else None
    return out


def test_every_named_variant_has_its_own_colour():
    colours = [plots.variant_color(v) for v in NAMED]
    assert len(set(colours)) == len(NAMED)
    unknown = plots.variant_color("someone_elses_kernel")
    assert unknown == plots.variant_color("someone_elses_kernel")  # stable
    assert matplotlib.colors.is_color_like(unknown)


def test_a_variant_keeps_its_colour_across_plots():
    kernel = _line_colours(plots.kernel_panels(_bench(), "speedup_vs_native", "x", logy=True))
    encoder = _line_colours(plots.encoder_latency(_ttft(), mode="eager"))
    assert kernel["fused"] == encoder["fused"] == plots.variant_color("fused")
    assert kernel["native"] == encoder["native"] == plots.variant_color("native")
    assert kernel["my_new_peer"] == plots.variant_color("my_new_peer")  # unknown names plotted


def test_panels_wrap_and_legend_sits_outside_the_data():
    fig = plots.kernel_panels(_bench(), "median_us", "median [us]")
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 6
    rows = {round(ax.get_position().y0, 3) for ax in axes}
    assert len(rows) == 2  # 3 per row, not 6 in one
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend_box = fig.legends[0].get_window_extent(renderer)
    for ax in axes:
        assert not legend_box.overlaps(ax.get_window_extent(renderer))


def test_error_bars_come_from_p20_p80():
    fig = plots.kernel_panels(_bench(), "median_us", "median [us]")
    ax = fig.axes[0]
    assert ax.containers, "no error bars drawn"
    from matplotlib.colors import to_hex

    native = next(c for c in ax.containers if to_hex(c.lines[0].get_color()) == plots.variant_color("native"))
    segments = native.lines[2][0].get_segments()  # variants are drawn in the catalogue's group order
    low, high = segments[0][:, 1]
    rows = _bench()
    first = rows[(rows.variant == "native") & (rows.heads == 2) & (rows.tokens == 256)].iloc[0]
    assert (low, high) == pytest.approx((first.p20_us, first.p80_us))


def test_image_axis_is_linear_and_ticks_readable():
    fig = plots.saving_vs_native(_ttft())
    for ax in fig.axes:
        assert ax.get_xscale() == "linear"
        assert list(ax.get_xticks()) == [1, 2, 4, 8, 16, 32]
        assert min(t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels()) >= 9
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"448x448", "1024x1024"} <= labels  # line style per resolution explained


def test_cpu_plots_carry_the_caveat_and_gpu_plots_do_not():
    cpu = plots.encoder_latency(_ttft("cpu"), mode="eager")
    gpu = plots.encoder_latency(_ttft("cuda"), mode="eager")
    assert cpu._supxlabel.get_text().replace("\n", " ") == plots.CPU_CAVEAT
    assert gpu._supxlabel is None


def test_table_headers_carry_units():
    table = plots.with_units(_bench()[["variant", "tokens", "median_us", "pct_of_copy",
                                       "speedup_vs_native"]])
    assert list(table.columns) == ["variant", "tokens", "median [us]", "of copy bandwidth [%]",
                                   "speedup vs native [x]"]
    assert plots.header("fused_saving_pct") == "fused saving vs native [%]"
    assert plots.header("median_us_best") == "median [us] (best)"


def test_rate_error_bars_follow_the_time_spread():
    rows = _bench().iloc[:1]
    low, high = plots.spread(rows, "speedup_vs_native")
    value = rows.speedup_vs_native.iloc[0]
    assert low[0] == pytest.approx(value / 1.2) and high[0] == pytest.approx(value / 0.9)
    assert plots.spread(rows.drop(columns=["p20_us", "p80_us"]), "speedup_vs_native") is None
    assert np.all(low <= value) and np.all(high >= value)


# Variants one plot shows together: each pair must look different.
# What one plot shows together: the catalogue's names of each kind (kernel plots add the copies).
PLOT_GROUPS = {
    "kernel": list(catalogue.names("rope") + catalogue.names("copy")),
    "encoder": list(catalogue.names("encoder")),
    "qkv": list(catalogue.names("qkv")),
}


def _alike(a: str, b: str) -> bool:
    """Two colours a reader confuses: near hue (< 15 degrees) and near saturation and
    value; greys by lightness alone."""
    import colorsys

    (h1, s1, v1), (h2, s2, v2) = (colorsys.rgb_to_hsv(*matplotlib.colors.to_rgb(c)) for c in (a, b))
    if s1 < 0.15 or s2 < 0.15:
        return s1 < 0.15 and s2 < 0.15 and abs(v1 - v2) < 0.2
    hue = min(abs(h1 - h2), 1 - abs(h1 - h2)) * 360
    return hue < 15 and abs(s1 - s2) + abs(v1 - v2) < 0.4


def test_variants_plotted_together_have_distinct_colours():
    assert _alike("#1f4e9c", "#4a90d9")  # the two blues vLLM's variants once had
    for group, names in PLOT_GROUPS.items():
        colours = {v: plots.variant_color(v) for v in names}
        assert all(v in plots.VARIANT_COLORS for v in names), group
        confused = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if _alike(colours[a], colours[b])]
        assert not confused, (group, confused)


def test_token_tick_labels_never_collide():
    tokens = (256, 1024, 5476, 21904, 43808, 87616)
    bench = _bench()
    rows = []
    for t in tokens:
        for v in ("native", "fused"):
            rows.append(dict(bench.iloc[0], tokens=t, variant=v))
    fig = plots.kernel_panels(pd.DataFrame(rows), "median_us", "median [us]")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in labels] == ["256", "1k", "5.48k", "21.9k", "43.8k", "87.6k"]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_the_target_bucket_is_marked_on_encoder_plots():
    for fig in (plots.encoder_latency(_ttft(), mode="eager"), plots.saving_vs_native(_ttft())):
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert any(t.startswith("targets: 16 x 1024x1024") for t in texts)


def test_crowded_plots_group_variants_and_fade_all_but_the_ones_that_matter():
    """More than MAX_SOLID variants: ours, native, the floor, the engines' shipped Kimi RoPE and the
    fastest engine kernel solid,
    the rest faded; variants and legend in the catalogue's group order, a heading per group."""
    rows = []
    for v, us in (("native", 600.0), ("fused", 100.0), ("fused_inplace", 105.0), ("vllm_packed_qk", 250.0),
                  ("sglang_vision", 120.0), ("liger", 500.0), ("compiled", 160.0), ("vllm_merged", 800.0)):
        rows.append({"variant": v, "tokens": 87616, "median_us": us})
        rows.append({"variant": v, "tokens": 1024, "median_us": 10.0})
    data = pd.DataFrame(rows)
    names = plots.grouped(data["variant"])
    assert names[:2] == ["fused", "fused_inplace"] and names.index("native") > names.index("liger")
    solid = plots.emphasised(data, names, "median_us", "tokens")
    assert solid == {"fused", "fused_inplace", "native", "sglang_vision", "vllm_packed_qk"}
    labels = [h.get_label() for h in plots.grouped_handles(names, solid)]
    assert labels[0] == "OURS" and labels.index("THE ENGINES' KERNELS") < labels.index("BASELINES")
    assert plots.emphasised(data[data.variant.isin(names[:5])], names[:5], "median_us", "tokens") == set(names[:5])


def _one_policy_ttft():
    """ttft_vs_images rows as a CPU run has them: one encoder policy, one resolution, 1-2 images."""
    rows = []
    for variant, enc in (("native", 20.0), ("fused", 15.0), ("vllm_packed_qk", 230.0), ("none", 14.0),
                         ("sglang_vision", 80.0), ("vllm_merged", 600.0), ("gemm_epilogue", 70.0)):
        for images in (1, 2):
            rows.append({"variant": variant, "resolution": "56x56", "encoder_policy": "eager",
                         "images": images, "encoder_ms": enc * images, "prefill_ms": 5.0 * images,
                         "ttft_ms": (enc + 5.0) * images, "hand_prefill_fast_ms": 3.0 * images,
                         "hand_prefill_slow_ms": 9.0 * images, "prefill_source": "hand model",
                         "prefill_package": "", "prefill_parallelism": "8 GPUs", "device_kind": "cpu"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("draw", ["ttft_vs_images", "saving_vs_native", "encoder_latency", "kernel_panels"])
def test_titles_and_legends_never_overlap(draw):
    """A figure title never runs into the legend, even beside one narrow panel (a CPU run's
    TTFT and saving plots: one mode, one resolution, one encoder policy), and no y label
    reaches above its panel into the title's line."""
    one = _ttft("cpu")
    one = one[(one["resolution"] == "448x448") & (one["images"] <= 2) & (one["variant"] == "fused")]
    one = pd.concat([one.assign(variant=v) for v in _one_policy_ttft()["variant"].unique()])
    if draw == "ttft_vs_images":
        fig = plots.ttft_vs_images(_one_policy_ttft(), resolution="56x56")
    elif draw == "saving_vs_native":
        fig = plots.saving_vs_native(one, modes=["eager"])
    elif draw == "encoder_latency":
        fig = plots.encoder_latency(one, mode="eager")
    else:
        fig = plots.kernel_panels(_bench()[lambda d: d["heads"] == 2], "pct_of_copy",
                                  "of device-to-device copy bandwidth [%]")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle
    assert fig.legends
    for ax in fig.axes:  # a y label no taller than its panel: it stays out of the title's line
        if ax.get_visible() and ax.yaxis.label.get_text():
            assert ax.yaxis.label.get_window_extent(renderer).height <= ax.get_window_extent(renderer).height
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        if title is not None and title.get_text():
            assert not title.get_window_extent(renderer).overlaps(box), title.get_text()
        for ax in fig.axes:
            assert not ax.title.get_window_extent(renderer).overlaps(box), ax.title.get_text()


def _cut_at_the_edge(fig) -> list[str]:
    """The texts of a saved figure (savefig without bbox_inches="tight", as the reports'
    headline figure is) that reach past its edge: they would be cut off."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    texts = [fig._suptitle, fig._supxlabel]
    for ax in fig.axes:
        if ax.get_visible():
            (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
            texts += [ax.xaxis.label, ax.yaxis.label, ax.title]
            texts += [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]  # drawn ones
            texts += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
    cut = []
    for text in texts:
        if text is None or not text.get_visible() or not text.get_text():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < edge.x0 - 0.5 or box.x1 > edge.x1 + 0.5 or box.y0 < edge.y0 - 0.5 or box.y1 > edge.y1 + 0.5:
            cut.append(text.get_text())
    return cut


@pytest.mark.parametrize("xlabel", [
    "encoder time saved over native at 16 x 1024x1024, CUDA graphs [%]",
    "time per call at 87,616 tokens x 16 x 72 (16 images), CUDA graphs, cold L2 [us]",
    "a label far longer than any figure is wide, so it must wrap onto more lines to stay inside the figure [us]",
])
def test_headline_bars_keep_their_labels_inside_the_figure(xlabel):
    """The reports' first figure (02, 04, 06): the x label sits under the axes, which start
    right of the variants' long names; it reached past the figure's right edge (lost "[us]")."""
    values = pd.Series({v: float(i + 1) for i, v in enumerate(catalogue.CATALOGUE)})
    fig = plots.headline_bars(values, xlabel, highlight=["native", "fused"], title="solid: ours")
    assert _cut_at_the_edge(fig) == []
    assert "[" not in xlabel or xlabel[xlabel.rindex("["):] in fig.axes[0].get_xlabel().replace("\n", " ")


@pytest.mark.parametrize("draw", ["ttft_vs_images", "encoder_latency", "kernel_panels"])
def test_no_label_is_cut_at_the_figure_edge(draw):
    if draw == "ttft_vs_images":
        fig = plots.ttft_vs_images(_one_policy_ttft(), resolution="56x56")
    elif draw == "encoder_latency":
        fig = plots.encoder_latency(_ttft("cpu"), mode="eager")
    else:
        fig = plots.kernel_panels(_bench(), "pct_of_copy", "of device-to-device copy bandwidth [%]")
    assert _cut_at_the_edge(fig) == []


def test_ttft_plot_draws_the_few_that_matter_and_the_table_has_every_variant():
    """13 TTFT lines in one panel could not be told apart (H200 04): only the emphasised
    ones are drawn; ttft_table holds every variant's numbers."""
    base = _one_policy_ttft()
    names = list(catalogue.CATALOGUE)[:12] + ["native"]
    many = pd.concat([base[base.variant == "native"].assign(variant=v, ttft_ms=base.ttft_ms + i)
                      for i, v in enumerate(names)])
    fig = plots.ttft_vs_images(many, resolution="56x56")
    drawn = {line.get_color() for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() in ("-", "--")}
    solid = plots.few_that_matter(many, names, "ttft_ms", "images")
    assert len(solid) <= plots.MAX_SOLID < len(names)
    assert {"native", names[0]} <= solid  # names[0], the fastest of ours (least ttft_ms)
    assert drawn == {matplotlib.colors.to_hex(plots.variant_color(v)) for v in solid} or \
        drawn == {plots.variant_color(v) for v in solid}
    assert "more variants" in fig._suptitle.get_text()
    table = plots.ttft_table(many, resolution="56x56")
    assert sorted(table.index) == sorted(names)
    want = many[(many.variant == names[3]) & (many.images == 2)].ttft_ms.iloc[0]
    assert table.loc[names[3], ("eager", 2)] == pytest.approx(want, abs=0.05)
