"""The MoonViT-shaped encoder: token counts, variants agree, RoPE time attribution."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from rope_kernels.bench.encoder_bench import (AGREE_RATIO, attribute_rope_time, bucket_rounds,
                                              make_bucket, native_agreement, paired_stats,
                                              rope_minimal_ms, rope_profile)
from rope_kernels.kernels.fused import DEFAULT_TRITON_KERNEL
from rope_kernels.model.vit import (EncoderConfig, MoonViTEncoder, encoder_inputs, pick_attention,
                                    rope_variants)
from rope_kernels.vocabulary import ENCODER_ONLY_ROPE, ROPE_FREE_FLOORS


@pytest.fixture(scope="module")
def small(device):
    """The small encoder on the tier's device (GPU machines run these tests compiled)."""
    cfg = EncoderConfig.small()
    return cfg, MoonViTEncoder(cfg, device=device, dtype=torch.bfloat16, seed=1)


def test_kimi_dimensions():
    cfg = EncoderConfig.kimi_k25()
    assert (cfg.hidden, cfg.heads, cfg.head_dim, cfg.layers, cfg.mlp, cfg.text_hidden) == \
        (1152, 16, 72, 27, 4304, 7168)


def test_buckets_follow_kimis_resize_rule():
    b = make_bucket("1024x1024", 16)
    assert b.grids[0] == (1, 74, 74) and b.vit_tokens == 16 * 5476 and b.llm_tokens == 16 * 1369
    with pytest.raises(ValueError, match="1024x1024"):
        make_bucket("1024*1024", 1)
    with pytest.raises(ValueError, match="positive"):
        make_bucket("448x448", 0)


def test_variants_agree_and_none_differs(small, device):
    cfg, model = small
    inp = encoder_inputs([(1, 4, 6), (1, 2, 2)], cfg, device=device, seed=3)
    att = pick_attention(inp.grids, device)
    timed = [v for v in rope_variants() if v != "compiled"]  # Inductor's CPU build: slow
    agree = native_agreement(model, inp, att, timed)
    assert set(agree) == set(timed) and agree["native"]["max_rel_err_vs_native"] == 0.0
    native_err = agree["native"]["max_rel_err_vs_fp32"]
    assert 0 < native_err < 0.05  # bf16 against the float32 encoder: small, not zero
    for v in timed:
        assert agree[v]["agreement_tol_rel"] == pytest.approx(AGREE_RATIO * native_err, rel=1e-3)
        if v not in ROPE_FREE_FLOORS:
            assert agree[v]["max_rel_err_vs_fp32"] <= agree[v]["agreement_tol_rel"], (v, agree[v])
    # the floors skip RoPE: the wrong twins the check must catch, by far
    for v in set(ROPE_FREE_FLOORS) & set(timed):
        assert agree[v]["max_rel_err_vs_fp32"] > 3 * agree[v]["agreement_tol_rel"], v
    assert "none" in timed
    ref = model(inp.patches, inp.grids, rope="native", attention=att)
    assert ref.shape == (6 + 1, cfg.text_hidden) and torch.isfinite(ref).all()


def test_encoder_rejects_bad_input(small, device):
    cfg, model = small
    inp = encoder_inputs([(1, 4, 4)], cfg, device=device)
    with pytest.raises(ValueError, match="rope must be one of"):
        model(inp.patches, inp.grids, rope="neox")
    with pytest.raises(ValueError, match="patches must have shape"):
        model(inp.patches[:3], inp.grids)
    with pytest.raises(ValueError, match="multiples of the 2x2 merge"):
        model(encoder_inputs([(1, 3, 4)], cfg, device=device).patches, [(1, 3, 4)])


def test_bucket_rounds(small, device):
    cfg, model = small
    inp = encoder_inputs([(1, 2, 2)], cfg, device=device)
    modes = [v for v in rope_variants() if v != "compiled"]  # Inductor's CPU build: slow, tested elsewhere
    r = bucket_rounds(model, inp, modes, "eager", "sdpa_per_image", samples=1, warmup=0)
    assert set(r.times) == set(modes) and all(ts[0] > 0 for ts in r.times.values())
    if device == "cpu":
        with pytest.raises(ValueError, match="GPU"):
            bucket_rounds(model, inp, ["native"], "cudagraph", "sdpa_per_image")
    else:
        g = bucket_rounds(model, inp, ["native", "fused"], "cudagraph", "sdpa_per_image", samples=2)
        assert g.timer == "cuda_events_cudagraph"
    with pytest.raises(ValueError, match="mode"):
        bucket_rounds(model, inp, ["native"], "graph", "sdpa_per_image")
    with pytest.raises(ValueError, match="samples"):
        bucket_rounds(model, inp, ["native"], "eager", "sdpa_per_image", samples=0)
    r = bucket_rounds(model, inp, ["native", "none"], "eager", "sdpa_per_image", samples=3, warmup=0)
    assert r.timer == ("wall_clock_cpu" if device == "cpu" else "cuda_events_eager")
    assert [len(ts) for ts in r.times.values()] == [3, 3]
    assert len(r.orders) == 3 and all(sorted(o) == ["native", "none"] for o in r.orders)


def test_paired_stats_compare_within_rounds():
    # Round 2 is slow for every variant (drift): pairing cancels it, medians apart would not.
    times = {"native": [100.0, 100.0, 200.0, 100.0, 100.0],
             "fused": [90.0, 92.0, 180.0, 91.0, 90.0],
             "none": [88.0, 88.0, 176.0, 88.0, 88.0]}
    p = paired_stats(times, "fused")
    assert p["saving_pct"] == pytest.approx(10.0)
    assert p["saving_pct_p20"] == pytest.approx(8.8) and p["saving_pct_p80"] == pytest.approx(10.0)
    assert p["rope_cost_ms"] == pytest.approx(3e-3)  # microseconds in, milliseconds out
    assert paired_stats(times, "native")["saving_pct"] == 0.0
    assert math.isnan(paired_stats({"fused": [1.0]}, "fused")["saving_pct"])  # native not timed
    with pytest.raises(ValueError, match="not timed"):
        paired_stats(times, "liger")


def test_rope_minimal_time():
    # 27 layers x (8 bytes per q/k element pair in bf16 + 4 per cos/sin element) / 4000 GB/s
    ms = rope_minimal_ms(5476, 16, 72, 27, 4000.0)
    assert ms == pytest.approx(27 * (8 * 5476 * 1152 + 4 * 5476 * 72) / 4e12 * 1e3)


# --- attributing device time to RoPE from profiler events (synthetic events) ----
@dataclass
class Span:
    us: float

    def elapsed_us(self):
        return self.us


@dataclass
class Kernel:
    name: str
    duration: float


@dataclass
class Event:
    name: str
    device_type: str
    us: float = 0.0
    kernels: list = field(default_factory=list)
    cpu_children: list = field(default_factory=list)

    @property
    def time_range(self):
        return Span(self.us)


def _profile(attached: tuple[bool, bool]):
    """A forward: a GEMM, two RoPE ranges (aten copy + a Triton kernel each),
    attention. ``attached`` says per range whether the profiler attached the Triton
    kernel to its launch. The GPU-side copies of the 'rope' ranges are device events too."""
    cpu, device = [Event("aten::mm", "DeviceType.CPU", kernels=[Kernel("gemm", 500.0)])], []
    for i, att in enumerate(attached):
        us = 30.0 + i  # the two Triton launches differ, so a dropped one shows
        copy = Event("aten::_to_copy", "DeviceType.CPU", kernels=[Kernel("copy_kernel", 5.0)])
        launch = Event("cuLaunchKernelEx", "DeviceType.CPU",
                       kernels=[Kernel(DEFAULT_TRITON_KERNEL, us)] if att else [])
        cpu += [Event("rope", "DeviceType.CPU", cpu_children=[copy, launch]), copy, launch]
        device += [Event("copy_kernel", "DeviceType.CUDA", 5.0),
                   Event(DEFAULT_TRITON_KERNEL, "DeviceType.CUDA", us),
                   Event("rope", "DeviceType.CUDA", 45.0)]  # annotation range, not a kernel
    device += [Event("gemm", "DeviceType.CUDA", 500.0), Event("attention", "DeviceType.CUDA", 429.0)]
    return cpu + device


@pytest.mark.parametrize("attached", [(False, False), (True, True), (True, False)])
def test_rope_time_counts_triton_kernels_once(attached):
    inside, total = attribute_rope_time(_profile(attached))
    assert total == 1000.0  # kernels only; the annotation ranges are not time of their own
    assert inside == 71.0  # both copies and both Triton kernels, attached or not, once each


@pytest.mark.parametrize("rope", ["native", "fused"])
def test_rope_profile(small, device, rope):
    cfg, model = small
    inp = encoder_inputs([(1, 2, 2)], cfg, device=device)
    att = pick_attention(inp.grids, inp.patches.device)
    rope_ms, total_ms = rope_profile(model, inp, rope, att)
    assert 0 < rope_ms < total_ms
    assert rope_profile(model, inp, "none", att)[0] == 0.0


def test_own_gemm_floor_is_an_encoder_mode_where_our_cute_gemm_runs(small, device):
    """gemm_epilogue_cute_norot (our CuTe QKV GEMM, rotation compiled out) runs exactly where
    gemm_epilogue_cute does; elsewhere the encoder refuses it, saying why."""
    from rope_kernels.catalogue import entry
    from rope_kernels.variants import encoder_only_absent

    assert "gemm_epilogue_cute_norot" in ENCODER_ONLY_ROPE and "gemm_epilogue_cute_norot" in ROPE_FREE_FLOORS
    assert "encoder" in entry("gemm_epilogue_cute_norot").kinds
    absent = encoder_only_absent()
    assert absent.get("gemm_epilogue_cute_norot") == absent.get("gemm_epilogue_cute")
    if "gemm_epilogue_cute_norot" in absent:
        cfg, model = small
        inp = encoder_inputs([(1, 4, 4)], cfg, device=device)
        with pytest.raises(ValueError, match="not available here"):
            model(inp.patches, inp.grids, rope="gemm_epilogue_cute_norot")
    else:
        assert "gemm_epilogue_cute_norot" in rope_variants()


def _bucket_rows(cute_ms, floor_ms):
    import pandas as pd

    rows = []
    for mode in ("cudagraph", "eager"):
        for v, times in (("gemm_epilogue_cute", cute_ms), ("gemm_epilogue_cute_norot", floor_ms)):
            if times is None:
                continue
            rows.append({"variant": v, "resolution": "1024x1024", "images": 16, "mode": mode,
                         "vit_tokens": 87616, "median_ms": sorted(times)[len(times) // 2],
                         "round_ms": ";".join(str(t) for t in times)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("cute, verdict", [([350.2, 351.3, 349.9], "met"),
                                           ([353.5, 354.6, 353.2], "missed"),
                                           (None, "not measured")])
def test_encoder_target_judges_ropes_cost_against_our_own_gemm(cute, verdict):
    """RoPE's own cost in the CuTe GEMM is judged against the same GEMM with the rotation
    compiled out (not against none, which runs cuBLAS): 0.1% over it meets the 0.3% target,
    1% misses it."""
    from rope_kernels.study.targets import TARGETS, evaluate

    target = next(t for t in TARGETS if t.id == "gemm_epilogue_cute_rope_cost")
    assert target.against == "gemm_epilogue_cute_norot"
    floor = [350.0, 351.0, 349.5]
    rows = _bucket_rows(cute, floor) if cute else _bucket_rows([350.0], None)
    got = evaluate({"encoder": rows}, [target])
    assert list(got.verdict) == [verdict, verdict]


def test_own_gemm_floor_runs_the_cute_kernel_with_its_rotation_compiled_out(monkeypatch):
    """The encoder wiring, on any machine: gemm_epilogue_cute calls our CuTe QKV kernel (through
    qkv_rope) with the rotation on, gemm_epilogue_cute_norot the same kernel and config with it
    compiled out. The kernel is replaced by its plain projection (CPU)."""
    from rope_kernels.model import vit

    calls = []

    def fake(x, w, b, operands, *, heads, head_dim, backend="auto", epilogue="rope", config=None,
             out=None):
        calls.append((backend, epilogue, config))
        return torch.nn.functional.linear(x, w, b).view(x.shape[0], 3, heads, head_dim)

    monkeypatch.setattr(vit, "qkv_rope", fake)
    monkeypatch.setattr(vit, "qkv_rope_operands", lambda *a, **k: object())
    monkeypatch.setattr(vit, "encoder_only_absent", lambda: {})
    cfg = EncoderConfig.small()
    model = MoonViTEncoder(cfg, dtype=torch.float32, seed=2)
    inp = encoder_inputs([(1, 4, 4)], cfg, dtype=torch.float32)
    floor = model(inp.patches, inp.grids, rope="gemm_epilogue_cute_norot")
    assert calls == [("cute", "none", None)] * cfg.layers
    calls.clear()
    model(inp.patches, inp.grids, rope="gemm_epilogue_cute")
    assert calls == [("cute", "rope", None)] * cfg.layers  # only the epilogue differs
    # with the projection alone (no rotation), the floor is the encoder with RoPE skipped
    assert torch.allclose(floor, model(inp.patches, inp.grids, rope="none"), atol=1e-5)
