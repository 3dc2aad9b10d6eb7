"""The study's targets (rope_kernels.study.targets) judged on synthetic result rows:
met, missed, within noise, exact boundaries, missing rows, in-place pairing."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from rope_kernels.study import targets as T
from rope_kernels.study.targets import (KIMI_SHAPES, TARGETS, Target, evaluate, judge_against_minimum,
                                        overall, summarize)

CEILING = 4000.0  # GB/s


def target(tid: str) -> Target:
    return next(t for t in TARGETS if t.id == tid)


def micro(times: dict[str, float | dict], *, mode="cudagraph", shapes=KIMI_SHAPES, in_place=None,
          nbytes=None, bands=None) -> pd.DataFrame:
    """Microbench rows: variant -> one median (us) for every shape, or {shape: us};
    ``bands``: variant -> (p20, p80) as fractions of the median (default: no spread)."""
    rows = []
    for variant, t in times.items():
        for shape in shapes:
            us = t.get(shape) if isinstance(t, dict) else t
            if us is None:
                continue
            row = {"variant": variant, "tokens": shape[0], "heads": shape[1], "head_dim": shape[2],
                   "dtype": "bfloat16", "mode": mode, "median_us": us, "copy_gbps": CEILING,
                   "bytes": nbytes if nbytes is not None else 1.0e6}
            lo, hi = (bands or {}).get(variant, (1.0, 1.0))
            row["p20_us"], row["p80_us"] = us * lo, us * hi
            if in_place is not None:
                row["in_place"] = in_place[variant]
            rows.append(row)
    return pd.DataFrame(rows)


PLACE = {"fused": False, "fused_inplace": True, "vllm_packed_qk": True, "sglang_vision": False,
         "compiled": False, "liger": False, "flashinfer": True}


def verdicts_of(tid: str, tables: dict) -> pd.DataFrame:
    return evaluate(tables, [target(tid)])


# --- ratio targets: exact boundaries, like for like --------------------------------
def test_boundary_is_exact_1_0483_misses_1_05():
    tables = {"microbench": micro({"fused": 100.0, "fused_inplace": 100.0, "sglang_vision": 104.83},
                                  in_place=PLACE)}
    v = verdicts_of("kimi_1.05x_sglang_vision", tables)
    assert len(v) == len(KIMI_SHAPES) and set(v.verdict) == {"missed"}
    assert v.value.iloc[0] == pytest.approx(1.0483)
    tables = {"microbench": micro({"fused": 100.0, "fused_inplace": 100.0, "sglang_vision": 105.0},
                                  in_place=PLACE)}
    assert set(verdicts_of("kimi_1.05x_sglang_vision", tables).verdict) == {"met"}  # >= is inclusive


def test_a_ratio_is_met_only_beyond_the_noise_bands():
    """The issue-35 rule on synthetic rows: met when the peer's p20 over our p80 meets
    the threshold, within noise when only the medians do, missed when they do not."""
    base = {"fused": 100.0, "fused_inplace": 100.0, "sglang_vision": 110.0}  # medians: 1.10x
    cases = {"met": {"fused": (0.99, 1.02), "sglang_vision": (0.98, 1.01)},  # 107.8 / 102 = 1.057
             "within noise": {"fused": (0.99, 1.06), "sglang_vision": (0.98, 1.01)}}  # 107.8/106 = 1.017
    for expected, bands in cases.items():
        v = verdicts_of("kimi_1.05x_sglang_vision",
                        {"microbench": micro(base, in_place=PLACE, bands=bands)})
        assert set(v.verdict) == {expected}, (expected, v.detail.iloc[0])
        assert v.value.iloc[0] == pytest.approx(1.10)  # the value shown is still the medians'
    assert v.band_value.iloc[0] == pytest.approx(107.8 / 106)
    assert "beyond noise" in v.detail.iloc[0]
    # medians that miss are missed, however wide the bands (the peer's p80 over our p20 passes)
    wide = {"fused": (0.8, 1.2), "sglang_vision": (0.8, 1.2)}
    v = verdicts_of("kimi_1.05x_sglang_vision",
                    {"microbench": micro(dict(base, sglang_vision=104.0), in_place=PLACE, bands=wide)})
    assert set(v.verdict) == {"missed"}
    # rows without p20/p80 cannot show a pass beyond noise
    rows = micro(base, in_place=PLACE).drop(columns=["p20_us", "p80_us"])
    v = verdicts_of("kimi_1.05x_sglang_vision", {"microbench": rows})
    assert set(v.verdict) == {"within noise"} and v.detail.str.contains("no p20/p80").all()


def test_the_issue_35_cases_turn_within_noise():
    """vLLM 2x at 43808 x 16 read 1.987 on the bands: medians 2.0x pass, bands do not."""
    shape = (43808, 16, 72)
    tables = {"microbench": micro({"fused": 100.0, "fused_inplace": 100.0, "vllm_packed_qk": 205.0},
                                  shapes=[shape], in_place=PLACE,
                                  bands={"fused_inplace": (0.99, 1.03), "vllm_packed_qk": (0.998, 1.004)})}
    v = verdicts_of("vllm_2x_16_heads", tables)
    row = v[v["shape"] == "43808x16x72"].iloc[0]
    assert row.verdict == "within noise" and row.band_value == pytest.approx(205 * 0.998 / 103)


def test_faster_is_strict():
    tables = {"microbench": micro({"fused": 10.0, "fused_inplace": 10.0, "vllm_packed_qk": 10.0},
                                  in_place=PLACE)}
    assert set(verdicts_of("vllm_faster_4_2_heads", tables).verdict) == {"missed"}  # level is not faster


def test_in_place_peer_is_paired_with_our_in_place_kernel():
    # Out of place ours is 2.5x faster, in place only 1.9x: vLLM (in place) is judged against in place.
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 52.63, "vllm_packed_qk": 100.0},
                                  in_place=PLACE)}
    v = verdicts_of("vllm_2x_16_heads", tables)
    assert set(v.ours) == {"fused_inplace"} and set(v.verdict) == {"missed"}
    assert v.value.iloc[0] == pytest.approx(100 / 52.63)
    # ... and an out-of-place peer with our out-of-place kernel.
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 100.0, "sglang_vision": 50.0},
                                  in_place=PLACE)}
    v = verdicts_of("kimi_1.05x_sglang_vision", tables)
    assert set(v.ours) == {"fused"} and set(v.verdict) == {"met"}


def test_in_place_column_wins_over_the_registry():
    # The rows say vllm_packed_qk ran out of place (a deliberately different row): pair with fused.
    place = dict(PLACE, vllm_packed_qk=False)
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 60.0, "vllm_packed_qk": 100.0},
                                  in_place=place)}
    assert set(verdicts_of("vllm_2x_16_heads", tables).ours) == {"fused"}


def test_without_an_in_place_column_the_registry_decides():
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 52.63, "vllm_packed_qk": 100.0})}
    v = verdicts_of("vllm_2x_16_heads", tables)
    assert set(v.ours) == {"fused_inplace"}  # the registry's Variant.inplace of vllm_packed_qk
    # A known peer pairs the same way on every machine, installed here or not
    # (vocabulary.IN_PLACE_VARIANTS, no registry built): FlashInfer rotates in place.
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 52.63, "flashinfer": 100.0})}
    v = verdicts_of("kimi_1.05x_flashinfer", tables)
    assert set(v.ours) == {"fused_inplace"}
    from rope_kernels.study.targets import in_place
    assert in_place(tables["microbench"], "someone_else") is None  # a name nobody knows


def test_missing_rows_are_not_measured_shape_by_shape():
    some = {s: 100.0 for s in KIMI_SHAPES[:2]}
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 40.0, "vllm_packed_qk": some},
                                  in_place=PLACE)}
    v = verdicts_of("vllm_2x_16_heads", tables)
    assert v.verdict.tolist() == ["met", "met"] + ["not measured"] * (len(v) - 2)
    assert len(v) == 5  # 16 heads at the five Kimi token counts
    assert overall(v.verdict) == "not measured"
    # No rows at all: every target still yields rows, all not measured.
    v = evaluate({})
    assert len(v) and set(v.verdict) == {"not measured"}
    assert set(summarize(v).verdict) == {"not measured"}


def test_a_peer_without_rows_says_why_where_its_correctness_rows_do():
    """FlashInfer 0.7.4 refuses head_dim 72: its Kimi verdicts carry the reason the
    correctness rows give; a peer with no reason anywhere says only that no row exists."""
    why = "flashinfer 0.7.4 cannot rotate head_dim 72 correctly (pos_enc.cuh overrun)"
    correctness = pd.DataFrame([{"variant": "flashinfer", "tokens": 4099, "heads": 16,
                                 "head_dim": 72, "dtype": "float32", "supported": False,
                                 "reason": "flashinfer supports bfloat16, float16 only"},
                                {"variant": "flashinfer", "tokens": 4099, "heads": 16,
                                 "head_dim": 72, "dtype": "bfloat16", "supported": False,
                                 "reason": why},
                                {"variant": "flashinfer", "tokens": 256, "heads": 3,
                                 "head_dim": 128, "supported": True, "reason": ""}])
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 40.0}, in_place=PLACE),
              "correctness": correctness}
    v = verdicts_of("kimi_1.05x_flashinfer", tables)
    assert set(v.verdict) == {"not measured"}
    assert all(d.endswith(why) and d.startswith("no flashinfer row") for d in v.detail)
    v = verdicts_of("kimi_1.05x_flashinfer", {"microbench": tables["microbench"]})
    assert set(v.detail) == {"no flashinfer row"}


def test_a_peer_that_fails_float64_carries_it_beside_its_time():
    """vllm_rotary_qkv rotates with bf16 cos/sin: where its correctness rows failed the
    float64 rule, every ratio against it says so (and by how much); where they passed, not."""
    def correctness(passed):
        return pd.DataFrame([{"variant": "vllm_rotary_qkv", "tokens": 4099, "heads": 16, "head_dim": 72,
                              "dtype": "bfloat16", "supported": True, "passed": passed,
                              "max_abs_err": 0.025 if not passed else 0.01, "tolerance": 0.0156,
                              "reason": ""}])
    micro_rows = micro({"fused": 40.0, "fused_inplace": 40.0, "vllm_rotary_qkv": 100.0},
                       in_place=dict(PLACE, vllm_rotary_qkv=True))
    v = verdicts_of("kimi_1.05x_vllm_rotary_qkv", {"microbench": micro_rows, "correctness": correctness(False)})
    assert v.peer_fails_float64.all() and v.detail.str.contains("fails the float64 rule").all()
    assert v.detail.str.contains("0.025 > tolerance 0.0156").all()
    v = verdicts_of("kimi_1.05x_vllm_rotary_qkv", {"microbench": micro_rows, "correctness": correctness(True)})
    assert not v.peer_fails_float64.any() and not v.detail.str.contains("float64").any()


def test_warm_rows_do_not_answer_cold_targets():
    tables = {"microbench": micro({"fused": 40.0, "fused_inplace": 40.0, "vllm_packed_qk": 100.0},
                                  mode="cudagraph_warm", in_place=PLACE)}
    assert set(verdicts_of("vllm_2x_16_heads", tables).verdict) == {"not measured"}


def test_overall_precedence():
    assert overall(["met", "met"]) == "met"
    assert overall(["met", "within noise"]) == "within noise"
    assert overall(["met", "not measured", "within noise"]) == "not measured"
    assert overall(["met", "missed", "not measured"]) == "missed"
    assert overall([]) == "not measured"


# --- against the physical minimum ----------------------------------------------------
def test_copy_fraction_met_missed_and_within_noise():
    nbytes = 4.0e6  # at 4000 GB/s: 1.0 us minimum
    shapes = [(21904, 16, 72), (43808, 16, 72), (87616, 16, 72)]
    tables = {"microbench": micro({"fused": {shapes[0]: 1.0 / 0.9, shapes[1]: 1.0 / 0.8999,
                                             shapes[2]: 0.97}}, shapes=shapes, nbytes=nbytes)}
    v = verdicts_of("copy_90pct_kimi_16_heads", tables)
    assert v.verdict.tolist() == ["met", "missed", "within noise"]
    assert v.value.iloc[0] == pytest.approx(90.0)


def test_copy_fraction_reads_a_renamed_ceiling_column():
    tables = {"microbench": micro({"fused": 1.0}, shapes=[(87616, 16, 72)], nbytes=4.0e6)
              .rename(columns={"copy_gbps": "copy_ceiling_gbps"})}
    v = verdicts_of("copy_90pct_kimi_16_heads", tables)
    assert v.value.dropna().tolist() == [pytest.approx(100.0)]


def test_judge_against_minimum():
    verdict, reason = judge_against_minimum(5.3, 5.32, 1.2)
    assert verdict == "within noise" and "minimum" in reason and "0.996x" in reason
    assert judge_against_minimum(6.21, 5.32, 1.2)[0] == "met"
    assert judge_against_minimum(5.32, 5.32, 1.2)[0] == "met"  # exactly the minimum is possible
    assert judge_against_minimum(5.32 * 1.2, 5.32, 1.2)[0] == "met"
    assert judge_against_minimum(7.0, 5.32, 1.2)[0] == "missed"
    assert judge_against_minimum(float("nan"), 5.32, 1.2)[0] == "not measured"
    with pytest.raises(ValueError, match="target_ratio"):
        judge_against_minimum(1.0, 1.0, 0.9)
    with pytest.raises(ValueError, match="minimum"):
        judge_against_minimum(1.0, 0.0, 1.2)


def test_pr_table_cold_below_minimum_is_within_noise():
    pr = pd.DataFrame({"tokens": [8192, 4096, 1024], "heads": [12, 12, 12], "head_dim": [128] * 3,
                       "native_us": [50.0] * 3, "fused_us": [30.0, 5.0, 10.0], "speedup": [5.0] * 3})
    shapes = [(8192, 12, 128), (4096, 12, 128)]
    rows = micro({"fused": {shapes[0]: 29.0, shapes[1]: 4.0}}, shapes=shapes, nbytes=20.0e6)  # min 5 us
    v = verdicts_of("pr_table_cold", {"microbench": rows, "pr_table": pr})
    assert v.verdict.tolist() == ["met", "within noise", "not measured"]
    warm = rows.assign(mode="cudagraph_warm")
    v = verdicts_of("pr_table_warm", {"microbench": warm, "pr_table": pr})
    assert v.verdict.tolist() == ["met", "met", "not measured"]  # warm L2 has no DRAM minimum


# --- encoder --------------------------------------------------------------------------
def encoder(medians: dict[str, float], rounds: dict[str, list[float]] | None = None, *,
            mode="cudagraph", ceiling=4000.0) -> pd.DataFrame:
    rows = []
    for v, ms in medians.items():
        row = {"variant": v, "resolution": "1024x1024", "images": 16, "vit_tokens": 87616, "mode": mode,
               "median_ms": ms, "copy_gbps": ceiling, "layers": 27, "encoder": "kimi_k25",
               "in_place": PLACE.get(v, False)}
        if rounds is not None:
            row["round_ms"] = ";".join(str(x) for x in rounds[v])
        rows.append(row)
    return pd.DataFrame(rows)


def test_encoder_paired_met_within_noise_missed():
    base = [100.0, 100.0, 100.0, 100.0, 100.0]
    cases = {"met": [99.0, 99.5, 98.0, 99.2, 99.1],          # faster in every round
             "within noise": [99.0, 101.0, 98.0, 100.5, 99.5],  # faster by median, p20 below 0
             "missed": [101.0, 100.5, 99.0, 100.2, 100.1]}
    for expected, mine in cases.items():
        rounds = {"vllm_packed_qk": base, "fused_inplace": mine, "fused": [200.0] * 5}
        tables = {"encoder": encoder({v: 1.0 for v in rounds}, rounds)}
        v = verdicts_of("encoder_vs_vllm", tables)
        cold = v[v["mode"] == "cudagraph"]
        assert cold.verdict.tolist() == [expected], (expected, cold.detail.tolist())
        assert cold.ours.tolist() == ["fused_inplace"]  # vLLM's path is in place
        assert v[v["mode"] == "eager"].verdict.tolist() == ["not measured"]


def test_encoder_rows_without_round_times_are_not_measured():
    tables = {"encoder": encoder({"fused": 1.0, "fused_inplace": 1.0, "vllm_packed_qk": 2.0})}
    v = verdicts_of("encoder_vs_vllm", tables)
    assert set(v.verdict) == {"not measured"} and v.detail.str.contains("round_ms|no vllm").all()


def test_encoder_floor_gap():
    rounds = {"none": [100.0] * 5, "gemm_epilogue": [100.3] * 5}
    v = verdicts_of("gemm_epilogue_near_floor", {"encoder": encoder({"none": 1, "gemm_epilogue": 1}, rounds)})
    assert v[v["mode"] == "cudagraph"].verdict.tolist() == ["met"]  # 0.3% slower: at the limit
    rounds = {"none": [100.0] * 5, "gemm_epilogue": [100.31] * 5}
    v = verdicts_of("gemm_epilogue_near_floor", {"encoder": encoder({"none": 1, "gemm_epilogue": 1}, rounds)})
    assert v[v["mode"] == "cudagraph"].verdict.tolist() == ["missed"]
    assert v[v["mode"] == "cudagraph"].detail.iloc[0].startswith("slower by 0.31% per round")
    # under the floor: faster, said without a double negative
    rounds = {"none": [100.0] * 5, "gemm_epilogue": [99.5] * 5}
    v = verdicts_of("gemm_epilogue_near_floor", {"encoder": encoder({"none": 1, "gemm_epilogue": 1}, rounds)})
    row = v[v["mode"] == "cudagraph"].iloc[0]
    # two-sided: 0.5% under the floor is not near it either
    assert row.verdict == "missed" and row.detail.startswith("faster by 0.50% per round")
    rounds = {"none": [100.0] * 5, "gemm_epilogue": [99.8] * 5}
    v = verdicts_of("gemm_epilogue_near_floor", {"encoder": encoder({"none": 1, "gemm_epilogue": 1}, rounds)})
    assert v[v["mode"] == "cudagraph"].verdict.tolist() == ["met"]
    # median within +-0.3%, but a round's band reaches past it: within noise, on either side
    for mine in ([100.0, 100.1, 100.2, 100.6, 100.7], [100.0, 99.9, 99.8, 99.4, 99.3]):
        rounds = {"none": [100.0] * 5, "gemm_epilogue": mine}
        v = verdicts_of("gemm_epilogue_near_floor",
                        {"encoder": encoder({"none": 1, "gemm_epilogue": 1}, rounds)})
        assert v[v["mode"] == "cudagraph"].verdict.tolist() == ["within noise"], mine


def test_gemm_epilogue_targets_take_the_faster_of_our_two_kernels():
    """gemm_epilogue (Triton) and gemm_epilogue_cute (CuTe DSL): the one with the lower
    median is judged, the other's rows change nothing; one alone is judged alone."""
    rounds = {"fused": [100.0] * 5, "none": [98.0] * 5, "gemm_epilogue": [101.0] * 5,
              "gemm_epilogue_cute": [99.0, 98.9, 99.1, 99.0, 98.8]}
    medians = {"fused": 100.0, "none": 98.0, "gemm_epilogue": 101.0, "gemm_epilogue_cute": 99.0}
    v = verdicts_of("gemm_epilogue_vs_fused", {"encoder": encoder(medians, rounds)})
    cold = v[v["mode"] == "cudagraph"]
    assert cold.ours.tolist() == ["gemm_epilogue_cute"] and cold.verdict.tolist() == ["met"]
    del rounds["gemm_epilogue_cute"], medians["gemm_epilogue_cute"]
    v = verdicts_of("gemm_epilogue_vs_fused", {"encoder": encoder(medians, rounds)})
    cold = v[v["mode"] == "cudagraph"]
    assert cold.ours.tolist() == ["gemm_epilogue"] and cold.verdict.tolist() == ["missed"]
    v = verdicts_of("gemm_epilogue_vs_fused", {"encoder": encoder({"fused": 1.0}, {"fused": [1.0] * 5})})
    assert v[v["mode"] == "cudagraph"].verdict.tolist() == ["not measured"]


def test_encoder_saving_on_per_round_pairs():
    native = [100.0] * 5
    cases = {"met": [93.0] * 5,                                  # 7.00% every round
             "within noise": [92.0, 92.5, 93.0, 93.5, 94.0],     # median 7.0%, p20 6.4%
             "missed": [93.05] * 5}
    for expected, fused in cases.items():
        rounds = {"native": native, "fused": fused}
        v = verdicts_of("encoder_saving_7pct", {"encoder": encoder({"native": 100.0, "fused": 93.0}, rounds)})
        assert v[v["mode"] == "cudagraph"].verdict.tolist() == [expected], expected
    v = verdicts_of("encoder_saving_7pct", {"encoder": encoder({"native": 100.0, "fused": 93.0})})
    assert v[v["mode"] == "cudagraph"].verdict.tolist() == ["not measured"]  # no rounds, no pairs


def test_encoder_cost_against_the_physical_minimum():
    minimal = T.encoder_minimal_ms(encoder({"none": 1.0}))
    from rope_kernels.bench.encoder_bench import rope_minimal_ms
    assert minimal == pytest.approx(rope_minimal_ms(87616, 16, 72, 27, 4000.0))
    for cost, expected in ((1.1 * minimal, "met"), (1.25 * minimal, "missed"), (0.9 * minimal, "within noise")):
        rounds = {"none": [300.0] * 5, "fused": [300.0 + cost] * 5}
        tables = {"encoder": encoder({"none": 300.0, "fused": 300.0 + cost}, rounds)}
        v = verdicts_of("encoder_cost_1.2x", tables)
        assert v[v["mode"] == "cudagraph"].verdict.tolist() == [expected]
    # median cost 1.1x, but the rounds' p80 1.3x: within noise
    costs = [1.0, 1.05, 1.1, 1.4, 1.5]
    rounds = {"none": [300.0] * 5, "fused": [300.0 + c * minimal for c in costs]}
    v = verdicts_of("encoder_cost_1.2x", {"encoder": encoder({"none": 300.0, "fused": 301.0}, rounds)})
    assert v[v["mode"] == "cudagraph"].verdict.tolist() == ["within noise"]


# --- host time per eager call -----------------------------------------------------------
def test_host_time_target_judges_each_of_ours_beyond_noise():
    shapes = [(1024, 16, 72)]
    rows = micro({"fused": 20.0, "fused_inplace": 25.0, "vllm_packed_qk": 20.0}, shapes=shapes,
                 in_place=PLACE)
    rows["host_us"] = rows["variant"].map({"fused": 22.0, "fused_inplace": 23.0, "vllm_packed_qk": 19.0})
    rows["host_p20_us"], rows["host_p80_us"] = rows["host_us"] * 0.99, rows["host_us"] * 1.01
    def at_1024(tables):
        v = verdicts_of("host_1.2x_vllm", tables)
        assert len(v) == 2 * len(KIMI_SHAPES)  # each of ours on every Kimi shape
        return v[v["shape"] == "1024x16x72"]

    v = at_1024({"microbench": rows})
    # fused 22/19 = 1.158, band 22.22/18.81 = 1.181: met; in place 23/19 = 1.21: missed
    assert v.ours.tolist() == ["fused", "fused_inplace"]
    assert v.verdict.tolist() == ["met", "missed"]
    rows["host_p80_us"] = rows["host_us"] * 1.04  # 22.88 / 18.81 = 1.216: only the medians pass
    v = at_1024({"microbench": rows})
    assert v.verdict.tolist() == ["within noise", "missed"]
    v = verdicts_of("host_1.2x_vllm", {"microbench": rows.drop(columns=["host_us"])})
    assert set(v.verdict) == {"not measured"} and v.detail.str.contains("host_us").all()


# --- QKV GEMM ---------------------------------------------------------------------------
def test_qkv_best_of_ours_against_cublas_plus_rope():
    rows = []
    for t in (21904, 43808, 87616):
        for v, us in (("cublas_linear", 100.0), ("cublas_linear+fused_rope", 120.0),
                      ("qkv_rope_linear", 130.0), ("qkv_rope_linear_angles", 119.0 if t != 87616 else 121.0)):
            rows.append({"variant": v, "tokens": t, "mode": "cudagraph", "median_us": us,
                         "p20_us": us, "p80_us": us})
    v = verdicts_of("qkv_vs_cublas_fused_rope", {"qkv_gemm": pd.DataFrame(rows)})
    assert v.verdict.tolist() == ["met", "met", "missed"]
    # lower is better: our p80 over the peer's p20; 119 +2% over 120 -0.5% = 1.017: within noise
    banded = pd.DataFrame(rows).assign(
        p80_us=lambda d: d.median_us * 1.02, p20_us=lambda d: d.median_us * 0.995)
    v = verdicts_of("qkv_vs_cublas_fused_rope", {"qkv_gemm": banded})
    assert v.verdict.tolist() == ["within noise", "within noise", "missed"]
    assert set(v.ours) == {"qkv_rope_linear_angles"}
    v = verdicts_of("qkv_vs_quack", {"qkv_gemm": pd.DataFrame(rows)})
    assert set(v.verdict) == {"not measured"}  # no quack_gemm_rope rows
    # an absent peer's row (no time, its reason in the note) is not measured either, never missed
    absent = [{"variant": "quack_gemm_rope", "tokens": t, "mode": "cudagraph", "median_us": math.nan}
              for t in (21904, 43808, 87616)]
    v = verdicts_of("qkv_vs_quack", {"qkv_gemm": pd.DataFrame(rows + absent)})
    assert set(v.verdict) == {"not measured"}
    assert set(verdicts_of("qkv_vs_cublas", {}).verdict) == {"not measured"}


# --- the table itself ------------------------------------------------------------------
def test_targets_are_unique_and_well_formed():
    ids = [t.id for t in TARGETS]
    assert len(ids) == len(set(ids))
    with pytest.raises(ValueError, match="kind"):
        Target("x", "x", "x", "no_such_kind", "microbench", "m", ("fused",), "p", ">=", 1.0)
    with pytest.raises(ValueError, match="op"):
        Target("x", "x", "x", "time_ratio", "microbench", "m", ("fused",), "p", "=>", 1.0)
    with pytest.raises(ValueError, match="threshold"):
        Target("x", "x", "x", "time_ratio", "microbench", "m", ("fused",), "p", ">=", math.nan)
    with pytest.raises(TypeError, match="tables"):
        evaluate([])


def test_committed_device_folders_evaluate(tmp_path):
    """Every committed device folder evaluates (a table renamed by a later run included)."""
    from rope_kernels.study.devices import REPO_ROOT

    for folder in sorted((REPO_ROOT / "data").iterdir()):
        if folder.name in ("reference", "compile", "cpu") or not folder.is_dir():
            continue
        v = evaluate(T.load_tables(folder))
        assert set(v.verdict) <= set(T.VERDICTS)
        assert set(summarize(v).target) == {t.id for t in TARGETS}
        assert "|" in T.report(folder)
    with pytest.raises(ValueError, match="no result folder"):
        T.load_tables(tmp_path / "absent")


def test_cli_prints_the_table_and_refuses_an_unknown_folder(tmp_path, capsys):
    from rope_kernels.__main__ import main

    dev = tmp_path / "gpu-x"
    dev.mkdir()
    micro({"fused": 40.0, "fused_inplace": 52.63, "vllm_packed_qk": 100.0}, in_place=PLACE).to_csv(
        dev / "microbench.csv", index=False)
    assert main(["targets", "--data-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Targets judged on gpu-x" in out and "| vllm_2x_16_heads |" in out and "not measured" in out
    assert main(["targets", "--data-root", str(tmp_path), "--device", "absent"]) == 2
    assert "no result folder" in capsys.readouterr().err


def test_rows_without_a_column_read_not_measured():
    rows = micro({"fused": 10.0}, shapes=[(87616, 16, 72)]).drop(columns=["bytes"])
    v = verdicts_of("copy_90pct_kimi_16_heads", {"microbench": rows})
    assert v.verdict.tolist() == ["not measured"] and "bytes" in v.detail.iloc[0]


def test_a_ratio_beyond_the_same_bytes_copy_is_named_out_of_reach():
    """peer / same-bytes copy bounds what any kernel moving our bytes can reach: a miss
    whose bound is below the threshold says so (still missed); one within reach does not."""
    tables = {"microbench": micro({"fused": 100.0, "fused_inplace": 100.0, "sglang_vision": 103.0},
                                  in_place=PLACE)}
    m = tables["microbench"]
    m["same_bytes_copy_us"] = 99.0  # the copy is only 1.040x the peer
    v = verdicts_of("kimi_1.05x_sglang_vision", tables)
    assert set(v.verdict) == {"missed"}
    assert v["limit"].iloc[0] == pytest.approx(103.0 / 99.0)
    assert v["out_of_reach"].all() and v["detail"].str.contains("out of reach").all()
    m["same_bytes_copy_us"] = 90.0  # 1.144x: reachable, a plain miss
    v = verdicts_of("kimi_1.05x_sglang_vision", tables)
    assert set(v.verdict) == {"missed"} and not v["out_of_reach"].any()
    assert not v["detail"].str.contains("out of reach").any()
    del m["same_bytes_copy_us"]  # rows without the column: no bound, no claim
    v = verdicts_of("kimi_1.05x_sglang_vision", tables)
    assert v["limit"].isna().all() and not v["detail"].str.contains("out of reach").any()
