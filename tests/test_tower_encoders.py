"""Issue 43, notebook 04's further towers: Qwen2.5-VL's encoder with window attention
(against a float64 reference written here), its config from the catalogue, tower rows keyed
by encoder in the result files, and each tower's language model for time to first token."""

import math
from dataclasses import replace

import pandas as pd
import pytest
import torch

from rope_kernels import prefill as pf
from rope_kernels.encoder_config import EncoderConfig
from rope_kernels.model.vit import MoonViTEncoder, encoder_inputs, window_partition
from rope_kernels.towers import TOWERS


def _seed() -> int:
    return int(torch.randint(0, 2**31, ()).item())


def _attention64(q, k, v):
    """Softmax attention over one sequence, float64: (s, h, d) -> (s, h, d)."""
    q, k, v = (t.double().transpose(0, 1) for t in (q, k, v))
    w = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
    return (w @ v).transpose(0, 1)


@pytest.mark.parametrize("grids, window", [([(1, 6, 10)], 4), ([(1, 4, 4), (1, 10, 6)], 4), ([(1, 8, 8)], 8)])
def test_a_windowed_layer_is_attention_within_each_window(grids, window):
    """Each token attends to the tokens of its window only: windows of ``window`` patches a
    side over each image (the edge ones smaller), compared per window with float64."""
    gen = torch.Generator().manual_seed(_seed())
    tokens = sum(t * h * w for t, h, w in grids)
    q, k, v = (torch.randn(tokens, 2, 8, generator=gen) for _ in range(3))
    win = window_partition(grids, window)
    got = MoonViTEncoder._window_attention(q[win.order], k[win.order], v[win.order], win)
    got = got.view(tokens, 2, 8)[win.restore]  # back to the image's raster order

    want = torch.empty(tokens, 2, 8, dtype=torch.float64)
    start = 0
    for t, h, w in grids:
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        cell = (rows // window) * ((w + window - 1) // window) + cols // window  # the window of each patch
        for c in cell.unique():
            idx = start + torch.nonzero(cell.reshape(-1) == c).reshape(-1)
            want[idx] = _attention64(q[idx], k[idx], v[idx])
        start += t * h * w
    assert (got.double() - want).abs().max() < 1e-5
    # a negative control: attention over a whole image wider than a window differs; one no
    # wider than a window is a single window (the same)
    start = 0
    for t, h, w in grids:
        sl = slice(start, start + t * h * w)
        gap = (got[sl].double() - _attention64(q[sl], k[sl], v[sl])).abs().max()
        assert gap > 1e-2 if max(h, w) > window else gap < 1e-5
        start += t * h * w


def test_window_partition_matches_vllms_windows_at_1024():
    """1024x1024 under Qwen2.5-VL's rule is 74 x 74 patches: windows of 8 (vLLM: 112 px //
    2 // 14 = 4 merged tokens a side), so 9 full windows a side and a 2-patch edge."""
    win = window_partition([(1, 74, 74)], 8)
    assert [(count, size) for _, count, size in win.groups] == [(1, 4), (18, 16), (81, 64)]
    assert win.max_seqlen == 64 and win.cu_seqlens[-1] == 74 * 74
    assert sorted(win.order.tolist()) == list(range(74 * 74))
    assert torch.equal(win.order[win.restore], torch.arange(74 * 74))
    with pytest.raises(ValueError, match="window"):
        window_partition([(1, 8, 8)], 0)


def test_qwen25_vl_config_comes_from_the_catalogue():
    t = TOWERS["qwen25_vl"]
    cfg = EncoderConfig.qwen25_vl()
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.head_dim, cfg.mlp, cfg.patch, cfg.merge) == \
        (t.layers, t.hidden, t.heads, t.head_dim, t.mlp, t.patch_size, t.merge_size) == (32, 1280, 16, 80, 3420, 14, 2)
    assert cfg.rotation == "half" and cfg.tower == "qwen25_vl" and cfg.gated_mlp and cfg.pos_grid == 0
    assert cfg.window == 112 // 14 == 8 and cfg.full_attention_layers == (7, 15, 23, 31)
    assert [i for i in range(cfg.layers) if not cfg.windowed(i)] == [7, 15, 23, 31]
    assert t.windowed_layers == 28
    assert not any(EncoderConfig.for_encoder(n).windowed(0) for n in ("small", "kimi_k25", "qwen3_vl"))
    with pytest.raises(ValueError, match="unknown encoder"):
        EncoderConfig.for_encoder("qwen2_vl")
    with pytest.raises(ValueError, match="multiple of the merge"):
        replace(cfg, window=3)


def _tiny(window=4, full=(1,)):
    return EncoderConfig(hidden=64, heads=4, layers=3, mlp=96, text_hidden=48, pos_grid=0, patch=14,
                         rotation="half", tower="qwen25_vl", window=window, full_attention_layers=full,
                         gated_mlp=True)


def test_the_window_gathers_change_nothing_when_every_layer_is_full():
    """Tokens gathered window by window and back: with every layer full attention, the
    output equals the same encoder without windows (the gathers are exact)."""
    from rope_kernels.bench.encoder_bench import make_bucket

    grids = make_bucket("112x84", 2, tower="qwen25_vl").grids
    seed = _seed()
    windowed = MoonViTEncoder(_tiny(full=(0, 1, 2)), dtype=torch.float32, seed=seed)
    plain = MoonViTEncoder(_tiny(window=0, full=()), dtype=torch.float32, seed=seed)
    inp = encoder_inputs(grids, windowed.cfg, dtype=torch.float32, seed=seed)
    a = windowed(inp.patches, inp.grids, rope="native")
    b = plain(inp.patches, inp.grids, rope="native")
    assert (a - b).abs().max() < 1e-4 * b.abs().max()
    # windowed layers do change it (the windows are smaller than the 6 x 8 images)
    c = MoonViTEncoder(_tiny(), dtype=torch.float32, seed=seed)(inp.patches, inp.grids, rope="native")
    assert (c - b).abs().max() > 1e-3 * b.abs().max()


def test_a_windowed_encoder_agrees_with_native_in_bf16():
    from rope_kernels.bench.encoder_bench import make_bucket, native_agreement

    model = MoonViTEncoder(_tiny(), dtype=torch.bfloat16)
    inp = encoder_inputs(make_bucket("112x84", 2, tower="qwen25_vl").grids, model.cfg, dtype=torch.bfloat16,
                         seed=_seed())
    agreement = native_agreement(model, inp, "sdpa_per_image", ["native", "fused", "none"])
    for v in ("native", "fused"):
        assert agreement[v]["max_rel_err_vs_fp32"] <= agreement[v]["agreement_tol_rel"], v
    assert agreement["none"]["max_rel_err_vs_fp32"] > agreement["none"]["agreement_tol_rel"]


def _latency(encoder, device="NVIDIA H200"):
    rows = []
    for n, tokens in ((1, 4096), (4, 4 * 4096)):
        for mode in ("eager", "cudagraph"):
            for variant, ms in (("native", 10.0 * n), ("fused", 9.5 * n)):
                rows.append({"variant": variant, "resolution": "1024x1024", "images": n, "vit_tokens": tokens,
                             "mode": mode, "median_ms": ms, "device_name": device, "device_kind": "cuda",
                             "git_commit": "abc", "timer": f"cuda_events_{mode}", "encoder": encoder,
                             "encoder_parallel": "1gpu"})
    return pd.DataFrame(rows)


def test_each_tower_prefills_its_own_language_model():
    hand = pf.PrefillModel()
    k_hand, k_settings, k_llm = pf.tower_prefill_settings("kimi_k25", hand, tp=8, moe_tp=1, moe_ep=8)
    assert k_hand is hand and k_settings == {"tp": 8, "moe_tp": 1, "moe_ep": 8} and k_llm == pf.AIC_MODEL
    assert pf.tower_prefill_settings("small", hand, tp=8)[2] == pf.AIC_MODEL  # the CPU twin stands for Kimi
    q_hand, q_settings, q_llm = pf.tower_prefill_settings("qwen3_vl", hand, tp=8, moe_tp=1, moe_ep=8)
    assert q_llm == TOWERS["qwen3_vl"].llm_model == "Qwen/Qwen3-VL-8B-Instruct"
    assert q_settings == {"tp": 1, "moe_tp": 1, "moe_ep": 1, "model": q_llm}
    assert q_hand.active_params == pytest.approx(8.2e9)
    assert (q_hand.gpus, q_hand.layers, q_hand.heads, q_hand.qk_head_dim) == (1, 36, 32, 128)
    assert q_hand.prefill_ms(4096)[1] < hand.prefill_ms(4096)[1] * 8  # one GPU, but a quarter the FLOPs
    assert pf.towers_without_ttft(["kimi_k25", "qwen3_vl", "qwen25_vl"]) == {
        "qwen25_vl": TOWERS["qwen25_vl"].llm_note}
    with pytest.raises(ValueError, match="no language model"):
        pf.tower_prefill_settings("qwen25_vl", hand)


def test_tower_ttft_rows_name_their_encoder_and_language_model_on_a_cpu():
    """Without aiconfigurator's tables (a CPU device), each encoder's rows get its own hand
    model; Qwen2.5-VL's rows get none (no model), Kimi's are as before."""
    latency = pd.concat([_latency("kimi_k25", "cpu"), _latency("qwen3_vl", "cpu"), _latency("qwen25_vl", "cpu")])
    rows = pf.tower_ttft(latency, text_tokens=64, hand=pf.PrefillModel())
    assert set(rows.encoder) == {"kimi_k25", "qwen3_vl"}
    assert set(rows[rows.encoder == "qwen3_vl"].prefill_llm) == {"Qwen/Qwen3-VL-8B-Instruct"}
    assert set(rows[rows.encoder == "kimi_k25"].prefill_llm) == {pf.AIC_MODEL}
    kimi = pf.device_ttft(_latency("kimi_k25", "cpu"), text_tokens=64, hand=pf.PrefillModel())
    pd.testing.assert_frame_equal(rows[rows.encoder == "kimi_k25"].reset_index(drop=True), kimi)
    q = rows[(rows.encoder == "qwen3_vl") & (rows.variant == "native") & (rows.encoder_policy == "eager")]
    k = rows[(rows.encoder == "kimi_k25") & (rows.variant == "native") & (rows.encoder_policy == "eager")]
    assert (q.prefill_ms.values != k.prefill_ms.values).all()
    assert (q.hand_model.str.contains("8.2B active")).all()
    with pytest.raises(ValueError, match="no encoder rows"):
        pf.tower_ttft(_latency("qwen25_vl", "cpu"), text_tokens=64, hand=pf.PrefillModel())


@pytest.mark.skipif(not pf.aiconfigurator_version(), reason="aiconfigurator-core not installed")
def test_qwen3_vl_prefill_runs_on_aiconfigurators_h200_tables():
    rows = pf.tower_ttft(pd.concat([_latency("kimi_k25"), _latency("qwen3_vl")]), text_tokens=200,
                         hand=pf.PrefillModel(), tp=8, moe_tp=1, moe_ep=8)
    q = rows[rows.encoder == "qwen3_vl"]
    assert set(q.prefill_source) == {"aiconfigurator"} and set(q.prefill_system) == {"h200_sxm"}
    assert set(q.prefill_parallelism) == {"TP1, batch 1"}
    by_tokens = q.drop_duplicates("llm_prefill_tokens").sort_values("llm_prefill_tokens").prefill_ms.tolist()
    assert 0 < by_tokens[0] < by_tokens[1]
    k = rows[rows.encoder == "kimi_k25"]
    assert set(k.prefill_parallelism) == {"TP8 + EP8 (MoE TP1), batch 1"}


def test_tower_rows_are_keyed_by_encoder_in_the_result_files(tmp_path):
    from rope_kernels.study.results import read_table, upsert_csv
    from rope_kernels.study.specs import ENCODER_LATENCY_CSV, RESULT_FILES, TIME_TO_FIRST_TOKEN_CSV

    assert "encoder" in RESULT_FILES[ENCODER_LATENCY_CSV].key
    assert "encoder" in RESULT_FILES[TIME_TO_FIRST_TOKEN_CSV].key
    path = tmp_path / ENCODER_LATENCY_CSV
    upsert_csv(path, _latency("kimi_k25"))
    upsert_csv(path, pd.concat([_latency("qwen3_vl"), _latency("qwen25_vl")]))
    got = read_table(path)
    assert got.groupby("encoder").size().to_dict() == {"kimi_k25": 8, "qwen25_vl": 8, "qwen3_vl": 8}
    # an old TTFT file (no encoder, no prefill_llm) reads as Kimi-K2.5's and takes tower rows beside it
    ttft = tmp_path / TIME_TO_FIRST_TOKEN_CSV
    old = pf.tower_ttft(_latency("kimi_k25", "cpu"), text_tokens=64, hand=pf.PrefillModel())
    old.drop(columns=["encoder", "prefill_llm"]).to_csv(ttft, index=False)
    assert set(read_table(ttft).encoder) == {"kimi_k25"}
    upsert_csv(ttft, pf.tower_ttft(_latency("qwen3_vl", "cpu"), text_tokens=64, hand=pf.PrefillModel()))
    both = read_table(ttft)
    assert both.groupby("encoder").size().to_dict() == {"kimi_k25": len(old), "qwen3_vl": len(old)}
    assert both.groupby("encoder").prefill_llm.unique().map(list).to_dict() == {
        "kimi_k25": [pf.AIC_MODEL], "qwen3_vl": ["Qwen/Qwen3-VL-8B-Instruct"]}


@pytest.mark.parametrize("values, match", [
    ({"towers": ["qwen2_vl"]}, "unknown tower 'qwen2_vl'"),
    ({"towers": ["qwen3_vl", "qwen3_vl"]}, "more than once"),
    ({"encoder": "qwen3_vl", "towers": ["qwen3_vl"]}, "main encoder"),
    ({"tower_image_counts": {"1024x1024": []}}, "non-empty"),
    ({"tower_samples": -1}, "tower_samples"),
    ({"tower_variants": ["nope"]}, "unknown variant"),
])
def test_bad_tower_parameters_are_refused(values, match):
    from rope_kernels.study.notebooks import check_parameters
    from rope_kernels.study.parameters import ParameterError

    with pytest.raises(ParameterError, match=match):
        check_parameters("04_ttft", values, "cpu")
    check_parameters("04_ttft", {"towers": ["qwen3_vl", "qwen25_vl"], "tower_image_counts": {"56x56": [1]},
                                 "tower_samples": 3}, "cpu")  # good values pass


def test_the_tower_parameters_default_to_none_and_the_gpu_profile_names_the_qwen_towers():
    import yaml

    from rope_kernels.study.devices import REPO_ROOT
    from rope_kernels.study.specs import SPECS

    params = SPECS["04_ttft"].parameters
    assert params["towers"].default == [] and params["tower_image_counts"].default == {}
    cuda = yaml.safe_load((REPO_ROOT / "params" / "cuda.yaml").read_text())["04_ttft"]
    assert cuda["towers"] == ["qwen3_vl", "qwen25_vl"]
    assert set(cuda["tower_image_counts"]) <= set(cuda["resolutions"])


def test_the_memory_bound_counts_the_towers_buckets_by_their_image_rule():
    """bounds.working_set sizes 04's buckets: the towers' too (Qwen2.5-VL's 16 x 1024x1024 is
    87,616 tokens of a 1280-wide, gated-MLP layer: larger than Kimi's), and a Qwen main encoder
    (it failed with a KeyError before)."""
    from rope_kernels.study import bounds

    base = {"encoder": "kimi_k25", "resolutions": ["1024x1024"], "image_counts": [16]}
    kimi, _ = bounds.working_set("04_ttft", base)
    both, what = bounds.working_set("04_ttft", {**base, "towers": ["qwen3_vl", "qwen25_vl"],
                                                "tower_image_counts": {"1024x1024": [16]}})
    assert both > kimi and what.startswith("qwen25_vl: 16 images of 1024x1024 (87616")
    _, what = bounds.working_set("04_ttft", {"encoder": "qwen3_vl", "resolutions": ["1024x1024"],
                                             "image_counts": [1]})
    assert "(4096 vision tokens)" in what


def test_the_towers_rows_leave_kimis_findings_targets_and_summary_as_they_were(tmp_path):
    """The committed H200 rows with tower rows beside them (as 04 with `towers` writes them):
    the findings, the targets' verdicts and the summary read Kimi's rows only, unchanged."""
    import shutil

    from rope_kernels.study import findings, summary, targets as T
    from rope_kernels.study.devices import REPO_ROOT
    from rope_kernels.study.specs import ENCODER_LATENCY_CSV, TIME_TO_FIRST_TOKEN_CSV

    src = REPO_ROOT / "data" / "nvidia-h200"
    if not (src / ENCODER_LATENCY_CSV).exists():
        pytest.skip("no committed H200 encoder rows")
    dst = tmp_path / "nvidia-h200"
    shutil.copytree(src, dst)
    for name in (ENCODER_LATENCY_CSV, TIME_TO_FIRST_TOKEN_CSV):
        rows = pd.read_csv(dst / name)
        rows = rows if "encoder" in rows else rows.assign(encoder="kimi_k25")
        tower = rows.assign(encoder="qwen3_vl")
        for col in ("median_ms", "ttft_ms"):
            if col in tower:
                tower[col] = tower[col] * 0.5  # different numbers: mixing them in would show
        pd.concat([rows, tower]).to_csv(dst / name, index=False)
    assert findings.render_findings(dst) == findings.render_findings(src)
    before = T.evaluate(T.load_tables(src))
    after = T.evaluate(T.load_tables(dst))
    pd.testing.assert_frame_equal(before.reset_index(drop=True), after.reset_index(drop=True))
    assert set(pd.read_csv(dst / ENCODER_LATENCY_CSV).encoder) == {"kimi_k25", "qwen3_vl"}
    one = summary.all_devices(tmp_path, "all")
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    pd.testing.assert_frame_equal(one, summary.all_devices(tmp_path, "all"))
