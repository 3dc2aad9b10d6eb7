"""Time to first token = measured encoder latency + a modelled prefill: the model's
arithmetic, its band, a user's measured throughput, and bad parameters."""

import numpy as np
import pandas as pd
import pytest

from rope_kernels.model.prefill import (PrefillModel, add_ttft, llm_prompt_tokens,
                                           rope_saving_pct_of_ttft)


def test_prefill_grows_with_tokens_and_counts_attention_quadratically():
    m = PrefillModel()
    times = [m.prefill_ms(n) for n in (0, 1, 100, 1369, 5476, 21904, 87616)]
    for a, b in zip(times, times[1:]):
        assert all(x < y for x, y in zip(a, b))  # strictly monotonic, each end of the band
    assert m.prefill_ms(0) == (0.0, 0.0, 0.0)
    # weights: 2 x active params per token; attention: layers x heads x (qk + v) x n^2
    n = 10_000
    assert m.flops(n) == pytest.approx(2 * 32e9 * n + 61 * 64 * (192 + 128) * n**2)
    linear = PrefillModel(layers=1, heads=1, qk_head_dim=1, v_head_dim=1)
    assert linear.flops(2 * n) / linear.flops(n) == pytest.approx(2, rel=1e-6)
    assert m.flops(2 * n) / m.flops(n) > 2  # attention's n^2 shows


def test_band_is_ordered_and_scales_with_gpus_and_mfu():
    m = PrefillModel(mfu=(0.1, 0.2, 0.4))
    fast, central, slow = m.prefill_ms(4096)
    assert fast < central < slow
    assert slow / fast == pytest.approx(4) and central / fast == pytest.approx(2)
    expected = m.flops(4096) / (8 * 989e12 * 0.2) * 1e3
    assert central == pytest.approx(expected)
    assert PrefillModel(gpus=16, mfu=(0.1, 0.2, 0.4)).prefill_ms(4096)[1] == pytest.approx(central / 2)
    one = PrefillModel(mfu=(0.3, 0.3, 0.3)).prefill_ms(4096)
    assert one[0] == one[1] == one[2]


def test_a_measured_throughput_replaces_the_model():
    m = PrefillModel(tokens_per_s=20_000.0)
    assert m.measured and m.prefill_ms(5000) == (250.0, 250.0, 250.0)
    assert m.prefill_ms(np.int64(10_000)) == (500.0, 500.0, 500.0)
    assert "measured" in m.assumptions().to_string()
    assert not PrefillModel().measured
    assert "MFU" in PrefillModel().assumptions().to_string()


def test_prompt_tokens_are_the_merged_vision_tokens_plus_text():
    assert llm_prompt_tokens(16 * 5476, 0) == 16 * 1369
    assert llm_prompt_tokens(5476, 100) == 1369 + 100
    with pytest.raises(ValueError, match="multiple of 4"):
        llm_prompt_tokens(5477, 0)


@pytest.mark.parametrize("kwargs, match", [
    ({"active_params": 0}, "active_params"), ({"active_params": float("nan")}, "active_params"),
    ({"peak_tflops": -1.0}, "peak_tflops"), ({"layers": 0}, "layers"), ({"heads": 2.5}, "heads"),
    ({"gpus": True}, "gpus"), ({"mfu": (0.5, 0.3, 0.6)}, "low <= central"),
    ({"mfu": (0.0, 0.3, 0.6)}, "0 < low"), ({"mfu": (0.2, 0.3, 1.5)}, "high <= 1"),
    ({"mfu": (0.2, 0.3)}, "three numbers"), ({"mfu": 0.3}, "three numbers"),
    ({"tokens_per_s": -5.0}, "tokens_per_s"), ({"tokens_per_s": float("inf")}, "tokens_per_s"),
])
def test_bad_parameters_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrefillModel(**kwargs)


def test_bad_token_counts():
    m = PrefillModel()
    with pytest.raises(ValueError, match=">= 0"):
        m.prefill_ms(-1)
    with pytest.raises(TypeError, match="ints"):
        m.prefill_ms(10.5)
    with pytest.raises(TypeError, match="ints"):
        llm_prompt_tokens(True, 0)


def _encoder_rows():
    rows = []
    for images, vit in ((1, 5476), (4, 4 * 5476)):
        for variant, ms in (("native", 30.0 * images), ("fused", 28.0 * images)):
            rows.append({"variant": variant, "resolution": "1024x1024", "images": images,
                         "vit_tokens": vit, "mode": "cudagraph", "median_ms": ms})
    return pd.DataFrame(rows)


def test_add_ttft_and_the_saving_as_a_share_of_it():
    m = PrefillModel(tokens_per_s=10_000.0)
    ttft = add_ttft(_encoder_rows(), m, text_tokens=31)
    one = ttft[(ttft.variant == "native") & (ttft.images == 1)].iloc[0]
    assert one.llm_prefill_tokens == 1369 + 31 and one.modelled_prefill_ms == pytest.approx(140.0)
    assert one.modelled_ttft_ms == pytest.approx(30.0 + 140.0)
    assert one.prefill_model == "measured: 10000 tokens/s" and one.text_tokens == 31
    saving = rope_saving_pct_of_ttft(ttft, "fused")
    first = saving[saving.images == 1].iloc[0]
    assert first.saving_ms == pytest.approx(2.0)
    assert first.saving_pct_of_ttft == pytest.approx(100 * 2.0 / 170.0)
    banded = add_ttft(_encoder_rows(), PrefillModel(), text_tokens=0)
    s = rope_saving_pct_of_ttft(banded, "fused")
    assert (s.saving_pct_of_ttft_fast > s.saving_pct_of_ttft).all()
    assert (s.saving_pct_of_ttft > s.saving_pct_of_ttft_slow).all()
    assert (banded.modelled_ttft_fast_ms < banded.modelled_ttft_ms).all()
    assert (banded.modelled_ttft_ms < banded.modelled_ttft_slow_ms).all()
    assert banded.prefill_model.iloc[0] == "FLOPs: 32B active, 61 layers x 64 heads x (qk 192 + v 128), " \
                                          "8 x 989 TFLOP/s, MFU 15%/30%/45%"
    with pytest.raises(ValueError, match="median_ms"):
        add_ttft(_encoder_rows().drop(columns="median_ms"), m, 0)
    with pytest.raises(ValueError, match="'liger' has no rows"):
        rope_saving_pct_of_ttft(ttft, "liger")


def test_the_modelled_columns_are_the_ones_results_declares():
    """encoder_latency.csv declares the modelled TTFT columns so older files migrate:
    a column add_ttft writes and results.TABLES lacks would make the next upsert fail."""
    from rope_kernels.study.results import MODELLED_TTFT_COLUMNS, TABLES

    added = set(add_ttft(_encoder_rows(), PrefillModel(), 0).columns) - set(_encoder_rows().columns)
    assert added == set(MODELLED_TTFT_COLUMNS)
    assert set(MODELLED_TTFT_COLUMNS) <= set(TABLES["encoder_latency.csv"].added)
