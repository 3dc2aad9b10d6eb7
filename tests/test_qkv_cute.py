"""Our CuTe DSL QKV GEMM with Kimi's RoPE in the epilogue (kernels/qkv_cute.py).

CPU tier: the per-pair table against Kimi's own angles (``vision_freqs_cis``), the
config's and the launcher's checks. Where CuTe DSL is installed: the kernel compiled for
sm_90a on the CPU (no GPU needed), every config the study times. GPU tier (sm_90 with
CuTe DSL): the kernel against float64, at token counts that leave a partial M tile,
with and without bias, rotation in and compiled out.
"""

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    # CuTe DSL reads its target once, when first imported: without a GPU, name Hopper
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from rope_kernels import vision_freqs_cis  # noqa: E402
from rope_kernels.correctness import new_seed
from rope_kernels.kernels import qkv_cute
from rope_kernels.kernels.freqs import vision_patch_coords, vision_rope_frequencies
from rope_kernels.kernels.qkv_cute import CuteQKVConfig, rope_pair_turns

HEADS, HEAD_DIM = 4, 72
GRIDS = [(1, 5, 7), (1, 3, 4)]


def test_table_turns_match_kimis_angles():
    """row * t[:, 0] + column * t[:, 1] (in turns) is Kimi's angle of every q/k pair, and 0
    on v's pairs."""
    freqs = vision_rope_frequencies(HEAD_DIM)
    table = rope_pair_turns(HEADS, HEAD_DIM, freqs).double()
    coords = vision_patch_coords(GRIDS).double()
    turns = coords[:, :1] * table[:, 0] + coords[:, 1:] * table[:, 1]   # (T, 3*H*D/2)
    angles = (2 * math.pi * turns).view(-1, 3, HEADS, HEAD_DIM // 2)
    kimi = torch.angle(vision_freqs_cis(GRIDS, HEAD_DIM)).double()     # (T, D/2) in (-pi, pi]
    for part in (0, 1):
        for h in range(HEADS):
            diff = torch.remainder(angles[:, part, h] - kimi + math.pi, 2 * math.pi) - math.pi
            assert diff.abs().max() < 1e-5
    assert angles[:, 2].abs().max() == 0
    assert table.shape == (3 * HEADS * HEAD_DIM // 2, 2)


@pytest.mark.parametrize("kwargs, error", [
    ({"tile_n": 100}, ValueError), ({"tile_n": 512}, ValueError), ({"tile_n": 1.5}, TypeError),
    ({"cluster_m": 4}, ValueError), ({"epi_n": 48}, ValueError), ({"tile_n": 160, "epi_n": 64}, ValueError),
    ({"tile_n": 144, "epi_n": 32}, ValueError), ({"stages": 1}, ValueError),
    ({"rotate": 1}, TypeError), ({"cluster_m": True}, TypeError),
])
def test_config_rejects(kwargs, error):
    with pytest.raises(error):
        CuteQKVConfig(**kwargs)


def test_config_stages_fit_shared_memory():
    assert CuteQKVConfig().ab_stages() == 4           # 40 KB a stage at 128x192, 32 KB of stores
    assert CuteQKVConfig(epi_n=32).ab_stages() == 5
    assert CuteQKVConfig(tile_n=128).ab_stages() == 6
    assert [CuteQKVConfig(tile_n=n).store_cols for n in (192, 160, 144, 128, 80)] == [64, 32, 16, 64, 16]
    with pytest.raises(ValueError, match="does not fit"):
        CuteQKVConfig(stages=8).ab_stages()


def test_table_rejects_bad_shapes():
    with pytest.raises(ValueError, match="head_dim"):
        rope_pair_turns(HEADS, 70, torch.ones(17))
    with pytest.raises(ValueError, match="freqs"):
        rope_pair_turns(HEADS, HEAD_DIM, torch.ones(17))


def _cpu_args(tokens=10, hidden=64):
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    w = torch.randn(3 * HEADS * HEAD_DIM, hidden, dtype=torch.bfloat16)
    b = torch.randn(3 * HEADS * HEAD_DIM, dtype=torch.bfloat16)
    table = rope_pair_turns(HEADS, HEAD_DIM, vision_rope_frequencies(HEAD_DIM))
    coords = torch.zeros(tokens, 2, dtype=torch.int32)
    return x, w, b, table, coords


@pytest.mark.parametrize("change, error, match", [
    ({"x": "float32"}, TypeError, "bfloat16 or float16"),
    ({"coords": "int64"}, ValueError, "coords"),
    ({"table": "short"}, ValueError, "turns must be rope_pair_turns"),
    ({"table": "with bias columns"}, ValueError, "turns must be rope_pair_turns"),
    ({"w": "wide"}, ValueError, "w_qkv"),
    ({"config": "str"}, TypeError, "CuteQKVConfig"),
    ({"heads": 3}, ValueError, "heads"),
    ({"out": "aliases x"}, ValueError, "shares memory with x"),
    ({"out": "wrong shape"}, ValueError, "out must have shape"),
    ({"heads": 2.0}, TypeError, "heads must be an int"),
    ({"b": "float64"}, TypeError, "b_qkv must be float32, bfloat16 or float16"),
    ({"b": "strided"}, ValueError, "b_qkv must be contiguous"),
    ({"b": "short"}, ValueError, "b_qkv must have shape"),
    ({"out": "aliases b"}, ValueError, "shares memory with b_qkv"),
    ({"x": "requires grad"}, ValueError, "does not support autograd, but x requires grad"),
])
def test_launcher_rejects_bad_input(change, error, match):
    x, w, b, table, coords = _cpu_args()
    kw = {"heads": HEADS, "head_dim": HEAD_DIM}
    if change.get("b") == "float64":
        b = b.double()
    if change.get("b") == "strided":
        b = torch.randn(2 * b.numel(), dtype=b.dtype)[::2]
    if change.get("b") == "short":
        b = b[:-2]
    if change.get("x") == "float32":
        x = x.float()
    if change.get("x") == "requires grad":
        x = x.clone().requires_grad_()
    if change.get("coords"):
        coords = coords.long()
    if change.get("table") == "short":
        table = table[:-1]
    if change.get("table") == "with bias columns":
        table = torch.cat([table, table], dim=1)
    if change.get("w"):
        w = torch.randn(w.shape[0], w.shape[1] + 8, dtype=w.dtype)
    if change.get("config"):
        kw["config"] = "192x2"
    if "heads" in change:
        kw["heads"] = change["heads"]
    if change.get("out") == "aliases x":
        big = torch.empty(x.shape[0] * 3 * HEADS * HEAD_DIM, dtype=x.dtype)
        x = big[: x.numel()].view(x.shape).copy_(x)
        kw["out"] = big.view(x.shape[0], 3, HEADS, HEAD_DIM)
    if change.get("out") == "aliases b":
        out = torch.empty(x.shape[0], 3, HEADS, HEAD_DIM, dtype=x.dtype)
        b = out.view(-1)[: b.numel()].copy_(b)
        kw["out"] = out
    if change.get("out") == "wrong shape":
        kw["out"] = torch.empty(x.shape[0], 3, HEADS, HEAD_DIM + 4, dtype=x.dtype)
    with pytest.raises(error, match=match):
        qkv_cute.qkv_rope_linear_cute(x, w, b, table, coords, **kw)


def test_launcher_rejects_cpu_tensors():
    x, w, b, table, coords = _cpu_args()
    for bias in (b, None):
        with pytest.raises(ValueError, match="sm_90"):
            qkv_cute.qkv_rope_linear_cute(x, w, bias, table, coords, heads=HEADS,
                                          head_dim=HEAD_DIM)


# -- compiled for sm_90a on the CPU (CuTe DSL installed; no GPU needed) -------------------

needs_cute = pytest.mark.skipif(not qkv_cute.available(), reason="nvidia-cutlass-dsl not installed")


@needs_cute
@pytest.mark.parametrize("cfg, bias", [
    (CuteQKVConfig(), torch.bfloat16), (CuteQKVConfig(), torch.float32), (CuteQKVConfig(), None),
    (CuteQKVConfig(rotate=False), torch.bfloat16), (CuteQKVConfig(tile_n=160), torch.bfloat16),
    (CuteQKVConfig(cluster_m=1), torch.bfloat16)],
    ids=lambda v: (f"{v.tile_n}x{v.cluster_m}{'' if v.rotate else '-norot'}"
                   if isinstance(v, CuteQKVConfig) else f"bias-{str(v).replace('torch.', '')}"))
def test_compiles_for_sm90(cfg, bias):
    """The kernel compiles with the bias as its own operand (bf16 as nn.Linear holds it,
    fp32, or none), one compiled kernel per bias dtype."""
    if torch.cuda.is_available():
        pytest.skip("compiled by the GPU tests here")
    tokens, hidden, heads, head_dim = 300, 1152, 16, 72
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    w = torch.randn(3 * heads * head_dim, hidden, dtype=torch.bfloat16)
    b = None if bias is None else torch.randn(3 * heads * head_dim, dtype=bias)
    out = torch.empty(tokens, 3 * heads * head_dim, dtype=torch.bfloat16)
    table = rope_pair_turns(heads, head_dim, vision_rope_frequencies(head_dim))
    coords = torch.zeros(tokens, 2, dtype=torch.int32)
    fn = qkv_cute.compile_kernel(cfg, x, w, out, table, b, coords, 2 * heads * head_dim,
                                 132 // cfg.cluster_m)
    assert fn is not None
    assert qkv_cute.compile_kernel(cfg, x, w, out, table, b, coords, 2 * heads * head_dim,
                                   132 // cfg.cluster_m) is fn


# -- GPU: against float64 ------------------------------------------------------------------

def _on_hopper() -> bool:
    return (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
            and qkv_cute.available())


@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU and nvidia-cutlass-dsl")
@pytest.mark.parametrize("tokens", [1, 127, 1000, 5476])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cfg", [CuteQKVConfig(), CuteQKVConfig(rotate=False),
                                 CuteQKVConfig(tile_n=160, cluster_m=1)],
                         ids=lambda c: f"{c.tile_n}x{c.cluster_m}{'' if c.rotate else '-norot'}")
def test_matches_float64_on_gpu(tokens, bias, cfg):
    from rope_kernels.bench import qkv_bench as qb
    from rope_kernels.qkv import qkv_rope, qkv_rope_operands
    hidden, heads, head_dim = 1152, 16, 72
    a = qb.make_args(tokens, hidden, heads, head_dim, "cuda", seed=tokens)
    if not bias:
        a["b"] = torch.zeros_like(a["b"])
    refs = qb.references(a, heads, head_dim)
    ops = qkv_rope_operands(a["coords"], heads=heads, head_dim=head_dim, backend="cute")
    out = qkv_rope(a["x"], a["w"], a["b"] if bias else None, ops, heads=heads,
                   head_dim=head_dim, backend="cute",
                   epilogue="rope" if cfg.rotate else "none",
                   config=CuteQKVConfig(**{**cfg.__dict__, "rotate": True}))
    (reference, native), scale = refs[not cfg.rotate], refs[2]
    checked = qb._error(out, reference, native, scale)
    assert checked["matches_float64"], checked


def test_config_parse_and_label():
    c = CuteQKVConfig.parse("128x1/e64/s4/c1/m")
    assert (c.tile_n, c.cluster_m, c.epi_n, c.stages, c.consumers, c.raster_m) == (128, 1, 64, 4, 1, True)
    assert CuteQKVConfig.parse(c.label) == c
    assert CuteQKVConfig.parse("192x2") == CuteQKVConfig() and CuteQKVConfig().label == "192x2"
    for bad in ("192", "192x2/q", "axb", "192x3"):
        with pytest.raises(ValueError):
            CuteQKVConfig.parse(bad)


@pytest.mark.skipif(_on_hopper(), reason="runs here")
def test_encoder_refuses_gemm_epilogue_cute_where_absent_saying_why():
    from rope_kernels.encoder_config import EncoderConfig
    from rope_kernels.model.vit import MoonViTEncoder, encoder_inputs, rope_variants
    from rope_kernels.variants import encoder_only_absent

    assert "gemm_epilogue_cute" not in rope_variants()
    why = encoder_only_absent()["gemm_epilogue_cute"]
    assert why == qkv_cute.availability()[1] and why
    cfg = EncoderConfig.small()
    model = MoonViTEncoder(cfg, dtype=torch.float32)
    inp = encoder_inputs([(1, 4, 4)], cfg, dtype=torch.float32)
    with pytest.raises(ValueError, match="gemm_epilogue_cute is not available here"):
        model(inp.patches, inp.grids, rope="gemm_epilogue_cute", attention="sdpa_per_image")


def test_quack_best_calls_name_their_configs_or_say_why():
    from rope_kernels.bench import qkv_bench as qb
    from rope_kernels.peers import quack_gemm
    calls, why = qb.quack_best_calls(16, 72)
    ok, reason = quack_gemm.availability()
    if ok:
        assert [n for n, _, _ in calls] == ["quack_gemm", "quack_gemm_rope"] and why == ""
    else:
        assert calls == [] and why == reason and why


@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU and nvidia-cutlass-dsl")
def test_rejects_misaligned_views_on_gpu():
    from rope_kernels.bench import qkv_bench as qb
    a = qb.make_args(65, 1152, 16, 72, "cuda", seed=0)
    table = rope_pair_turns(16, 72, a["freqs"])
    x = torch.empty(65 * 1152 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(65, 1152)
    x.copy_(a["x"])
    with pytest.raises(ValueError, match="16-byte aligned"):
        qkv_cute.qkv_rope_linear_cute(x, a["w"], a["b"], table, a["coords"], heads=16,
                                      head_dim=72)


@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU and nvidia-cutlass-dsl")
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
def test_bias_is_read_at_each_launch_on_gpu(bias_dtype):
    """The kernel reads the bias from its memory at every launch, in its own dtype: an edit
    through .data between two launches (no version bump, nothing rebuilt) changes the
    output, and both outputs match float64 with the bias they were given (an fp32 bias holds
    bf16 values here, so the native reference, which needs x's dtype, sees the same bias)."""
    from rope_kernels.bench import qkv_bench as qb
    from rope_kernels.qkv import qkv_rope, qkv_rope_operands
    tokens, hidden, heads, head_dim = 300, 1152, 16, 72
    a = qb.make_args(tokens, hidden, heads, head_dim, "cuda", seed=new_seed())
    b = torch.nn.Parameter(a["b"].to(bias_dtype), requires_grad=False)
    ops = qkv_rope_operands(a["coords"], heads=heads, head_dim=head_dim, backend="cute")
    for step in range(2):
        out = qkv_rope(a["x"], a["w"], b, ops, heads=heads, head_dim=head_dim, backend="cute")
        refs = qb.references({**a, "b": b.detach().to(a["x"].dtype)}, heads, head_dim)
        (reference, native), scale = refs[0], refs[2]
        checked = qb._error(out, reference, native, scale)
        assert checked["matches_float64"], (step, checked)
        b.data.copy_(torch.randn_like(b).to(a["x"].dtype).to(bias_dtype))  # no version bump
