"""Time to first token = measured encoder latency + a modelled prefill: the model's
arithmetic, its band, a user's measured throughput, and bad parameters."""

import numpy as np
import pandas as pd
import pytest

from rope_kernels.prefill import (PrefillModel, add_ttft, llm_prompt_tokens,
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


# -- the prefill from aiconfigurator-core, the TTFT rows per encoder policy ------------------

from rope_kernels import prefill as pf  # noqa: E402

needs_aic = pytest.mark.skipif(not pf.aiconfigurator_version(),
                               reason="aiconfigurator-core (the ttft extra) is not installed")


def _h200_rows(images=(1, 16), modes=("eager", "cudagraph"), device="NVIDIA H200"):
    rows = []
    for n in images:
        for mode in modes:
            for variant, ms in (("native", 25.0 * n), ("fused", 23.0 * n)):
                rows.append({"variant": variant, "resolution": "1024x1024", "images": n,
                             "vit_tokens": 5476 * n, "mode": mode,
                             "median_ms": ms + (1.0 if mode == "eager" else 0.0),
                             "device_name": device, "device_kind": "cuda", "git_commit": "abc",
                             "timer": f"cuda_events_{mode}"})
    return pd.DataFrame(rows)


def test_device_names_map_to_aiconfigurator_systems():
    assert pf.aic_system("NVIDIA H200") == "h200_sxm"
    assert pf.aic_system("nvidia-h200") == "h200_sxm"  # a data folder's name
    assert pf.aic_system("NVIDIA H100 80GB HBM3") == "h100_sxm"
    assert pf.aic_system("NVIDIA B200") == "b200_sxm"
    assert pf.aic_system("cpu") == "" and pf.aic_system("AMD Instinct MI300X") == ""
    with pytest.raises(TypeError, match="string"):
        pf.aic_system(None)


@needs_aic
@pytest.mark.parametrize("images, tables", [(1, "measured tables"), (16, "extrapolated")])
def test_prefill_agrees_with_aiconfigurator_run_by_hand(images, tables):
    """The TTFT rows of an H200's encoder rows (computed here, on whatever machine) carry the
    prefill aiconfigurator gives when called by hand with the same settings: Kimi-K2.5,
    h200_sxm, vLLM, TP8 + EP8, batch 1, 1369 merged tokens per image + 200 text tokens."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    handle = EngineHandle.compile("moonshotai/Kimi-K2.5", "h200_sxm", "vllm", tp_size=8,
                                  moe_tp_size=1, moe_ep_size=8)
    n = 1369 * images + 200
    by_hand = handle.predict_prefill_latency(1, n)
    # vLLM's chunks of 8192 (its OpenAI server's default on an H100/H200), each after its prefix
    chunked = sum(handle.predict_prefill_latency(1, min(p + 8192, n), p) for p in range(0, n, 8192))
    rows = pf.device_ttft(_h200_rows(), text_tokens=200, hand=PrefillModel())
    row = rows[(rows.images == images) & (rows.variant == "native") & (rows.encoder_policy == "eager")].iloc[0]
    assert row.prefill_unchunked_ms == pytest.approx(by_hand, rel=1e-9)
    assert row.prefill_ms == pytest.approx(chunked, rel=1e-9)
    assert row.prefill_chunks == -(-n // 8192) and row.prefill_chunk_tokens == 8192
    assert (row.prefill_ms == pytest.approx(by_hand)) == (images == 1)  # one chunk: the same prefill
    assert row.prefill_note.startswith("chunked (3 chunks of 8192, the last 5720)" if images == 16 else "one chunk")
    assert ("extrapolated past 16,384" in row.prefill_note) == (images == 16)
    assert row.ttft_unchunked_ms == pytest.approx(25.0 * images + 1.0 + by_hand)
    assert row.encoder_parallel == "1gpu" and row.comm_ms == 0.0
    by_hand = chunked
    assert row.llm_prefill_tokens == 1369 * images + 200
    assert row.prefill_source == "aiconfigurator" and row.prefill_system == "h200_sxm"
    assert row.prefill_backend == "vllm" and row.prefill_parallelism.startswith("TP8 + EP8")
    assert row.prefill_package == f"aiconfigurator-core {pf.aiconfigurator_version()}"
    assert row.prefill_tables.startswith(tables)
    assert row.ttft_ms == pytest.approx(25.0 * images + 1.0 + by_hand)  # eager native encoder + prefill
    # the hand band is beside it, as a cross-check, and is not what the TTFT used
    fast, central, slow = PrefillModel().prefill_ms(1369 * images + 200)
    assert (row.hand_prefill_fast_ms, row.hand_prefill_ms, row.hand_prefill_slow_ms) == \
        pytest.approx((fast, central, slow))
    assert not row.prefill_ms == pytest.approx(central)
    assert row.prefill_effective_mfu == pytest.approx(PrefillModel().flops(1369 * images + 200)
                                                      / (8 * 989e12 * by_hand / 1e3))
    assert 0.05 < row.prefill_effective_mfu < 0.25  # 9-18% (STUDY_FACTS), not the band's central 30%


@needs_aic
def test_aiconfigurator_settings_change_the_prefill_and_bad_ones_are_refused():
    one = pf.AIConfiguratorPrefill("h200_sxm")
    wider = pf.AIConfiguratorPrefill("h200_sxm", tp=4, moe_tp=1, moe_ep=4)
    assert one.prefill_ms(5000) != wider.prefill_ms(5000)
    assert one.prefill_ms(0) == 0.0
    assert "h200_sxm" in pf.aic_covered_systems("vllm")
    assert one.moe_tables_end() > 0
    assert one.coverage(one.moe_tables_end()) == "measured tables"
    assert one.coverage(one.moe_tables_end() + 1).startswith("extrapolated")


@pytest.mark.parametrize("kwargs, match", [
    ({"backend": "sglang"}, "128 heads"), ({"tp": 8, "moe_tp": 2, "moe_ep": 8}, "moe_tp x moe_ep"),
    ({"tp": 0}, "tp must be"), ({"batch": True}, "batch must be"), ({"system": ""}, "system"),
])
def test_bad_aiconfigurator_settings_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pf.AIConfiguratorPrefill(**{"system": "h200_sxm", **kwargs})


def test_where_aiconfigurator_cannot_run_the_hand_model_is_used_and_the_row_says_why(monkeypatch):
    cpu = pf.device_ttft(_h200_rows(device="cpu"), text_tokens=64, hand=PrefillModel())
    assert set(cpu.prefill_source) == {"hand model"}
    assert cpu.prefill_note.str.contains("no tables for 'cpu'|not installed").all()
    assert np.allclose(cpu.prefill_ms, cpu.hand_prefill_ms)
    with pytest.raises(ValueError, match="cannot run"):
        pf.choose_prefill("cpu", "aiconfigurator")
    asked = pf.device_ttft(_h200_rows(), text_tokens=64, hand=PrefillModel(), source="hand")
    assert set(asked.prefill_source) == {"hand model"} and asked.prefill_note.str.contains("asked").all()
    monkeypatch.setattr(pf, "aiconfigurator_version", lambda: "")  # as on a machine without the extra
    absent = pf.device_ttft(_h200_rows(), text_tokens=64, hand=PrefillModel())
    assert set(absent.prefill_source) == {"hand model"}
    assert absent.prefill_note.str.contains("not installed").all()
    with pytest.raises(ValueError, match="prefill source"):
        pf.choose_prefill("NVIDIA H200", "guess")
    with pytest.raises(ValueError, match="why_hand"):
        pf.ttft_rows(_h200_rows(), text_tokens=0, hand=PrefillModel())
    with pytest.raises(ValueError, match="one device"):
        pf.device_ttft(pd.concat([_h200_rows(), _h200_rows(device="cpu")]), text_tokens=0, hand=PrefillModel())


def test_encoder_policies_vllm_default_eager_graph_budget_and_all_graphs():
    """vLLM's encoder graphs cover up to its largest graph's merged tokens; more images run eager."""
    rows = pf.ttft_rows(_h200_rows(images=(1, 4)), text_tokens=0, hand=PrefillModel(tokens_per_s=1e4),
                        why_hand="test")
    mode = rows.set_index(["images", "variant", "encoder_policy"])["encoder_mode"]
    assert mode[(1, "native", "eager")] == "eager" and mode[(4, "native", "cudagraph")] == "cudagraph"
    assert mode[(1, "native", "vllm_encoder_graphs")] == "cudagraph"  # 1369 <= 5120 merged tokens
    assert mode[(4, "native", "vllm_encoder_graphs")] == "eager"  # 5476 > 5120
    enc = rows.set_index(["images", "variant", "encoder_policy"])["encoder_ms"]
    assert enc[(4, "fused", "vllm_encoder_graphs")] == 4 * 23.0 + 1.0
    assert enc[(4, "fused", "cudagraph")] == 4 * 23.0
    timer = rows.set_index(["images", "variant", "encoder_policy"])["timer"]
    assert timer[(1, "native", "vllm_encoder_graphs")] == "cuda_events_cudagraph"  # the row it ran
    assert timer[(4, "native", "vllm_encoder_graphs")] == "cuda_events_eager"
    # a policy whose mode was not timed is left out
    only_eager = pf.ttft_rows(_h200_rows(modes=("eager",)), text_tokens=0, hand=PrefillModel(), why_hand="t")
    assert set(only_eager.encoder_policy) == {"eager"}
    buys = pf.ttft_savings(rows)
    one = buys[(buys.images == 1) & (buys.encoder_policy == "eager")].iloc[0]
    ttft_native = 26.0 + 1369 / 1e4 * 1e3
    assert one.saving_ms == pytest.approx(2.0)
    assert one.saving_pct_of_ttft == pytest.approx(100 * 2.0 / ttft_native)
    assert one.encoder_share_pct == pytest.approx(100 * 24.0 / (24.0 + 136.9))
    with pytest.raises(ValueError, match="'liger' has no rows"):
        pf.ttft_savings(rows, baseline="liger")


def test_ttft_command_writes_the_file_from_committed_rows(tmp_path, capsys):
    from rope_kernels.__main__ import main
    from rope_kernels.study.results import read_table

    dev = tmp_path / "nvidia-h200"
    dev.mkdir()
    _h200_rows().to_csv(dev / "encoder_latency.csv", index=False)
    assert main(["ttft", "--data-root", str(tmp_path), "--prefill", "hand", "--write"]) == 0
    out = read_table(dev / "time_to_first_token.csv")
    assert len(out) == 2 * 2 * 3 and set(out.prefill_source) == {"hand model"}
    assert "data: nvidia-h200/time_to_first_token.csv" in capsys.readouterr().out
    assert main(["ttft", "--data-root", str(tmp_path), "--device", "absent"]) == 2


@pytest.mark.parametrize("override, match", [
    ('04_ttft.image_counts_by_resolution={"640x480": [1]}', "does not hold"),
    ('04_ttft.image_counts_by_resolution={"448x448": []}', "non-empty list"),
    ('04_ttft.image_counts_by_resolution={"448x448": [0]}', "ints >= 1"),
    ("04_ttft.llm_moe_ep=3", "must divide llm_tp"),
    ('04_ttft.prefill="magic"', "auto, aiconfigurator, hand"),
    ('04_ttft.llm_backend="sglang"', "vllm"),
])
def test_notebook_04s_ttft_parameters_are_checked_before_a_run(override, match):
    from pathlib import Path

    from rope_kernels.study.parameters import ParameterError, study_parameters

    root = Path(__file__).resolve().parents[1]
    study_parameters("cuda", root=root, notebooks=["04_ttft"])  # the H200 profile itself passes
    with pytest.raises(ParameterError, match=match):
        study_parameters("cuda", root=root, notebooks=["04_ttft"], overrides=[override])


def test_the_h200_profile_times_16_images_in_at_least_9_rounds_and_the_own_gemm_floor():
    from pathlib import Path

    from rope_kernels.study.parameters import study_parameters

    p = study_parameters("cuda", root=Path(__file__).resolve().parents[1], notebooks=["04_ttft"])["04_ttft"]
    assert p["samples"] >= 9 and 16 in p["image_counts"] and "1024x1024" in p["resolutions"]
    assert "1024x1024" not in p["image_counts_by_resolution"]
    assert {"gemm_epilogue_cute", "gemm_epilogue_cute_norot", "none"} <= set(p["variants"])
