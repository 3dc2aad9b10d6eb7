"""QuACK's GEMM with Kimi's 2D RoPE in its epilogue (peers/quack_gemm.py).

CPU tier: the operands that express Kimi's RoPE as QuACK's mRoPE epilogue
(per-column float-float frequency tables, row/column positions), fed through a
float64 model of ``mrope_posfreq_epi``'s math as QuACK 0.6.5 writes it
(``quack/epilogue/rotary.py``: pairs of adjacent columns, ``theta = sum over axes
of pos * (hi + lo)`` in turns), against Kimi's rotation in float64. GPU tier:
QuACK itself against float64, where it is installed (pinned 0.6.5).
"""

import math

import pytest
import torch

from rope_kernels import rope_reference, vision_freqs_cis
from rope_kernels.kernels.freqs import vision_patch_coords, vision_rope_frequencies
from rope_kernels.peers import quack_gemm

GRIDS = [(1, 5, 7), (1, 3, 4)]


def mrope_posfreq_model(acc, pos_t, pos_h, pos_w, freq_t, freq_h, freq_w, bias):
    """QuACK's mrope_posfreq_epi in float64: D = rope(acc + bias) on column pairs."""
    y = acc.double() + bias.double()
    x1, x2 = y[:, 0::2], y[:, 1::2]
    turns = sum(p.double().T * (f[:, 0::2].double() + f[:, 1::2].double())
                for p, f in ((pos_t, freq_t), (pos_h, freq_h), (pos_w, freq_w)))
    c, s = torch.cos(2 * math.pi * turns), torch.sin(2 * math.pi * turns)
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).reshape(y.shape)


def _problem(heads, head_dim, hidden=24):
    tokens = sum(t * h * w for t, h, w in GRIDS)
    gen = torch.Generator().manual_seed(3)
    acc = torch.randn(tokens, 3 * heads * head_dim, generator=gen, dtype=torch.float64)
    bias = torch.randn(3 * heads * head_dim, generator=gen)
    return tokens, acc, bias


def _kimi(acc, bias, heads, head_dim):
    tokens = acc.shape[0]
    y = (acc + bias.double()).view(tokens, 3, heads, head_dim)
    q, k = rope_reference(y[:, 0], y[:, 1], vision_freqs_cis(GRIDS, head_dim))
    return torch.stack([q, k, y[:, 2]], dim=1).reshape(tokens, -1)


@pytest.mark.parametrize("heads,head_dim", [(2, 72), (3, 16), (16, 72)])
def test_kimi_as_mrope_operands(heads, head_dim):
    """The tables and positions make QuACK's mRoPE epilogue compute Kimi's RoPE."""
    tokens, acc, bias = _problem(heads, head_dim)
    ops = quack_gemm.kimi_mrope_operands(heads, head_dim, vision_patch_coords(GRIDS),
                                         vision_rope_frequencies(head_dim), bias)
    n = 3 * heads * head_dim
    for name in ("pos_t", "pos_h", "pos_w"):
        assert ops[name].shape == (1, tokens) and ops[name].dtype == torch.float32
    for name in ("freq_t", "freq_h", "freq_w", "bias"):
        assert ops[name].shape == (1, n) and ops[name].dtype == torch.float32
    assert not ops["freq_t"].any() and not ops["pos_t"].any()
    assert not ops["freq_h"][:, 2 * n // 3:].any() and not ops["freq_w"][:, 2 * n // 3:].any()
    got = mrope_posfreq_model(acc, **ops)
    want = _kimi(acc, bias, heads, head_dim)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(got[:, 2 * n // 3:], want[:, 2 * n // 3:]), "v passes through exactly"


def test_swapped_axes_are_caught():
    """Row and column tables swapped (a wrong recipe) must fail the same check."""
    heads, head_dim = 2, 72
    tokens, acc, bias = _problem(heads, head_dim)
    ops = quack_gemm.kimi_mrope_operands(heads, head_dim, vision_patch_coords(GRIDS),
                                         vision_rope_frequencies(head_dim), bias)
    ops["freq_h"], ops["freq_w"] = ops["freq_w"], ops["freq_h"]
    want = _kimi(acc, bias, heads, head_dim)
    assert (mrope_posfreq_model(acc, **ops) - want).abs().max() > 1e-2 * want.abs().max()


def test_float_float_split_keeps_the_frequency():
    """hi + lo is freqs / 2pi to far below fp32 precision (the split QuACK wants)."""
    freqs = vision_rope_frequencies(72)
    _, _, freq_w = quack_gemm.kimi_mrope_tables(1, 72, freqs)
    hi, lo = freq_w[0, 0:72:4].double(), freq_w[0, 1:72:4].double()  # pairs 0, 2, 4, ... of head 0
    exact = freqs.double() / (2 * math.pi)
    assert ((hi + lo - exact).abs() <= 2.0**-45 * exact).all()
    assert (lo != 0).any(), "the low part carries bits fp32 alone would lose"


def test_bad_inputs_and_absence_reason():
    with pytest.raises(ValueError, match="head_dim 72 needs 18"):
        quack_gemm.kimi_mrope_tables(2, 72, torch.ones(17))
    with pytest.raises(ValueError, match="coords must be a"):
        quack_gemm.kimi_mrope_positions(torch.zeros(5, 3, dtype=torch.int32))
    ok, why = quack_gemm.availability()
    if not ok:
        assert why and "quack" in why.lower()


@pytest.mark.gpu
@pytest.mark.parametrize("config", list(quack_gemm.QUACK_CONFIGS))
def test_quack_gemm_rope_matches_float64(config):
    """QuACK's GEMM + Kimi RoPE epilogue and its plain GEMM against float64, at
    Kimi's projection shape and an odd token count (GPU, QuACK installed)."""
    ok, why = quack_gemm.availability()
    if not ok:
        pytest.skip(why)
    heads, head_dim, hidden = 16, 72, 1152
    grids = [(1, 74, 74), (1, 1, 77)]
    tokens = 74 * 74 + 77
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(3 * heads * head_dim, hidden, device="cuda", generator=gen)
         / hidden**0.5).bfloat16()
    b = torch.randn(3 * heads * head_dim, device="cuda", generator=gen).bfloat16()
    ops = quack_gemm.kimi_mrope_operands(heads, head_dim, vision_patch_coords(grids, device="cuda"),
                                         vision_rope_frequencies(head_dim, device="cuda"), b)
    out = torch.full((tokens, 3, heads, head_dim), float("nan"), dtype=x.dtype, device="cuda")
    quack_gemm.quack_gemm_rope(x, w, b, heads, ops, config=config, out=out)
    lin64 = (x.double() @ w.double().T + b.double()).view(tokens, 3, heads, head_dim)
    freqs_cis = vision_freqs_cis(grids, head_dim, device="cuda")
    q64, k64 = rope_reference(lin64[:, 0], lin64[:, 1], freqs_cis)
    from rope_kernels import native_rope

    lin = torch.nn.functional.linear(x, w, b).view(tokens, 3, heads, head_dim)
    nq, nk = native_rope(lin[:, 0], lin[:, 1], freqs_cis)
    refs = (q64, k64, lin64[:, 2])
    err = max((o.double() - r).abs().max().item() for o, r in zip(out.unbind(1), refs))
    native = max((o.double() - r).abs().max().item() for o, r in zip((nq, nk, lin[:, 2]), refs))
    assert err <= 2 * native + 1e-6 * q64.abs().max().item(), (config, err, native)
    plain = quack_gemm.quack_gemm(x, w, b, config=config).view(tokens, 3, heads, head_dim)
    plain_err = (plain.double() - lin64).abs().max().item()
    assert plain_err <= 2 * (lin.double() - lin64).abs().max().item() + 1e-6, (config, plain_err)


def test_encoder_quack_mode_wiring(monkeypatch, device):
    """The encoder's gemm_epilogue_quack mode hands QuACK the right operands: with
    QuACK's epilogue stood in for by the float64 model above, it computes what the
    fused encoder computes. Without QuACK the mode is absent with the reason."""
    from rope_kernels.model import vit
    from rope_kernels.model.vit import EncoderConfig, MoonViTEncoder, encoder_inputs

    cfg = EncoderConfig.small().with_layers(2)
    model = MoonViTEncoder(cfg, device=device)
    inp = encoder_inputs([(1, 2, 4)], cfg, device=device)
    ok, why = quack_gemm.availability()
    if not ok:
        assert "gemm_epilogue_quack" not in vit.rope_variants()
        with pytest.raises(ValueError, match="gemm_epilogue_quack is not available here"):
            model(inp.patches, inp.grids, rope="gemm_epilogue_quack")

    def modelled(x, w, b, heads, ops, **_):
        acc = x.double() @ w.double().T
        out = mrope_posfreq_model(acc, **ops).to(x.dtype)
        return out.view(x.shape[0], 3, heads, -1)

    monkeypatch.setattr(quack_gemm, "availability", lambda: (True, ""))
    monkeypatch.setattr(quack_gemm, "quack_gemm_rope", modelled)
    fused = model(inp.patches, inp.grids, rope="fused").float()
    quack = model(inp.patches, inp.grids, rope="gemm_epilogue_quack").float()
    none = model(inp.patches, inp.grids, rope="none").float()
    diff = (quack - fused).norm() / fused.norm()
    assert diff < 2e-2, diff
    assert (none - fused).norm() / fused.norm() > 5 * diff, "RoPE must matter in this check"


def test_run_refuses_the_quack_encoder_mode_where_quack_is_absent(monkeypatch):
    """04_ttft.variants naming gemm_epilogue_quack is refused before anything runs when
    QuACK does not run here (with its reason), and accepted where it does."""
    from rope_kernels.study.parameters import (ParameterError, check_variants_run_here,
                                               resolve_parameters)

    params = resolve_parameters(["04_ttft"], None, [],
                                ["04_ttft.variants=[fused, gemm_epilogue_quack]"], "cpu")
    monkeypatch.setattr(quack_gemm, "availability", lambda: (False, "quack-kernels not here"))
    with pytest.raises(ParameterError, match="gemm_epilogue_quack does not run here: "
                                             "quack-kernels not here"):
        check_variants_run_here(params)
    monkeypatch.setattr(quack_gemm, "availability", lambda: (True, ""))
    check_variants_run_here(params)


def test_one_config_object_per_name(monkeypatch):
    """QuACK's eager call caches its launch plan by id(config): a GemmConfig rebuilt
    per call, once freed, can hand its id to another name's config, which then
    replays the first one's plan (the sweep's rows would time the wrong config)."""
    import dataclasses
    import sys
    import types

    @dataclasses.dataclass(frozen=True)
    class GemmConfig:  # the fields config_label reads, as quack.gemm_config has them
        tile_m: int = 128
        tile_n: int = 192
        pingpong: bool = True
        is_dynamic_persistent: bool = True
        cluster_m: int = 2
        cluster_n: int = 1

    fake = types.ModuleType("quack.gemm_config")
    fake.GemmConfig = GemmConfig
    fake.default_config = lambda device: GemmConfig()
    monkeypatch.setitem(sys.modules, "quack", types.ModuleType("quack"))
    monkeypatch.setitem(sys.modules, "quack.gemm_config", fake)
    quack_gemm._gemm_config.cache_clear()
    try:
        for name in quack_gemm.QUACK_CONFIGS:
            first, label = quack_gemm.gemm_config(name, "cpu")
            again, label_again = quack_gemm.gemm_config(name, torch.device("cpu"))
            assert again is first and label_again == label
    finally:
        quack_gemm._gemm_config.cache_clear()


def test_the_plain_quack_gemm_is_judged_in_the_packed_layout(monkeypatch):
    """QuACK's plain GEMM returns (T, 3HD); the bench checks every variant's output
    as the packed (T, 3, H, D) qkv. On the H200 (2e381e165ba8) the 2-D output failed
    that check ("size of tensor a (T) must match ... (72)") at every config."""
    from rope_kernels.bench import qkv_bench

    tokens, heads, head_dim, hidden = 9, 2, 8, 16
    args = qkv_bench.make_args(tokens, hidden, heads, head_dim, "cpu", seed=0)

    def plain(x, w, b, *, config, out=None):  # QuACK's contract: x @ w^T + b, (T, N)
        return (x.float() @ w.float().T + b.float()).to(x.dtype)

    monkeypatch.setattr(qkv_bench.quack, "availability", lambda: (True, ""))
    monkeypatch.setattr(qkv_bench.quack, "quack_gemm", plain)
    out = qkv_bench.variant_call("quack_gemm", heads, head_dim)(args)
    refs = qkv_bench.references(args, heads, head_dim)
    (reference, native), scale = refs[1], refs[2]
    assert out.shape == (tokens, 3, heads, head_dim)
    assert qkv_bench._error(out, reference, native, scale)["matches_float64"]


def test_quacks_qkv_rows_name_its_package_version_and_source_hash(monkeypatch):
    """Every peer row names the engine's package, version and source hash: QuACK's
    GEMM rows in qkv_gemm.csv (the 2e381e165ba8 rows had none); our own rows carry no
    peer columns. Each QuACK variant runs at its fixed config, named in the row."""
    from rope_kernels.bench import qkv_bench

    def plain(x, w, b, *, config, out=None):
        return (x.float() @ w.float().T + b.float()).to(x.dtype)

    def rope(x, w, b, heads, ops, *, config, out=None):
        assert set(ops) == {"bias"}  # the faked positions/tables are empty; the bias is added
        lin = plain(x, w, b, config=config).view(x.shape[0], 3, heads, -1)
        return lin  # not rotated: this test reads columns, not numbers

    monkeypatch.setattr(qkv_bench.quack, "availability", lambda: (True, ""))
    monkeypatch.setattr(qkv_bench.quack, "source", lambda: ("0.6.5", "f" * 64))
    monkeypatch.setattr(qkv_bench.quack, "quack_gemm", plain)
    monkeypatch.setattr(qkv_bench.quack, "quack_gemm_rope", rope)
    monkeypatch.setattr(qkv_bench.quack, "kimi_mrope_operands", lambda *a: {"bias": None})
    monkeypatch.setattr(qkv_bench.quack, "gemm_config", lambda name, device: (None, name))
    rows = qkv_bench.run_qkv_bench((37,), device="cpu", hidden=32, heads=2, head_dim=8,
                                   mode="eager", samples=1, rounds=1, progress=False,
                                   variants=("cublas_linear", "cublas_linear+fused_rope",
                                             "quack_gemm", "quack_gemm_rope")).rows
    quack_rows = rows[rows.variant.str.startswith("quack")].set_index("variant")
    assert len(quack_rows) == 2 and (quack_rows.median_us > 0).all()
    assert (quack_rows.peer_package == "quack-kernels").all()
    assert (quack_rows.peer_version == "0.6.5").all()
    assert (quack_rows.peer_sha256 == "f" * 64).all()
    assert quack_rows.loc["quack_gemm", "config"] == qkv_bench.quack.DEFAULT_PLAIN_CONFIG
    assert quack_rows.loc["quack_gemm_rope", "config"] == qkv_bench.quack.DEFAULT_ROPE_CONFIG
    ours = rows[~rows.variant.str.startswith("quack")]
    assert ours.peer_package.isna().all()
