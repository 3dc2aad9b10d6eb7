"""FlashInfer 0.7.4 rotates only some head_dims correctly (``peers.flashinfer``'s
docstring: pos_enc.cuh's RopeQuantizeKernel stores whole 32-byte vectors past a head
whose width is not a multiple of them). Its wrapper refuses the others before loading
anything, its availability check runs at a head_dim it rotates, and the microbenchmark,
the correctness sweep and the encoder skip it per shape with the reason. CPU tier:
FlashInfer itself is CUDA only, so a stand-in variant carries its real rule."""

import pytest
import torch

from rope_kernels.correctness import check_variant, make_inputs
from rope_kernels.kernels.reference import native_rope
from rope_kernels.peers import flashinfer as fi
from rope_kernels.variants import Variant

LOWP = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_head_dim_72_is_refused_naming_the_kernel_and_the_overrun(dtype):
    ok, why = fi.supported_head_dim(72, dtype)
    assert not ok
    assert "head_dim 72" in why and str(dtype).removeprefix("torch.") in why
    assert "pos_enc.cuh" in why and "RopeQuantizeKernel" in why
    assert "8 elements past every head" in why and "multiple of 16" in why
    assert "\n" not in why


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("head_dim", [64, 80, 128, 16, 96, 256, 512])
def test_head_dims_its_kernels_tile_are_accepted(head_dim, dtype):
    assert fi.supported_head_dim(head_dim, dtype) == (True, "")


@pytest.mark.parametrize("head_dim", [8, 40, 72, 100, 136])
def test_head_dims_off_the_16_element_vector_are_refused(head_dim):
    ok, why = fi.supported_head_dim(head_dim, torch.bfloat16)
    assert not ok and f"{16 - head_dim % 16} elements past" in why


def test_the_rule_refuses_fp32_and_bad_arguments():
    ok, why = fi.supported_head_dim(128, torch.float32)
    assert not ok and "bfloat16 and float16" in why
    with pytest.raises(TypeError, match="head_dim must be an int"):
        fi.supported_head_dim("72", torch.bfloat16)
    with pytest.raises(TypeError, match="head_dim must be an int"):
        fi.supported_head_dim(True, torch.bfloat16)
    with pytest.raises(ValueError, match="positive even"):
        fi.supported_head_dim(71, torch.bfloat16)
    with pytest.raises(TypeError, match="torch.dtype"):
        fi.supported_head_dim(72, "bfloat16")


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_wrapper_refuses_72_before_loading_or_launching_anything(dtype, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("FlashInfer was loaded for a head_dim it overruns")

    monkeypatch.setattr(fi, "source", never)
    monkeypatch.setattr(fi, "prepared_per_freqs", never)
    inp = make_inputs(5, 2, 72, dtype, "cpu")
    before = inp.qkv.clone()
    with pytest.raises(ValueError, match="cannot rotate head_dim 72"):
        fi.flashinfer_rope(inp.xq, inp.xk, inp.freqs_cis)
    assert torch.equal(inp.qkv, before)


def test_availability_checks_at_a_head_dim_flashinfer_rotates(monkeypatch):
    seen = {}

    def installed_cuda_peer(*args, **kwargs):
        seen.update(kwargs)
        return True, ""

    monkeypatch.setattr(fi, "source", lambda: ("0.7.4", "x" * 64, "cache", None))
    monkeypatch.setattr(fi, "installed_cuda_peer", installed_cuda_peer)
    assert fi.availability.__wrapped__() == (True, "")
    assert fi.supported_head_dim(seen["head_dim"], torch.bfloat16)[0], seen


def test_installed_cuda_peer_checks_the_shape_it_is_given(monkeypatch):
    import rope_kernels.correctness as correctness
    import rope_kernels.kernels.switches as switches
    from rope_kernels.peers.cache import installed_cuda_peer

    seen = {}

    def check(fn, **kwargs):
        seen.update(kwargs)
        return check_variant(fn, **{**kwargs, "device": "cpu"})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(switches, "triton_interpreter_enabled", lambda: False)
    monkeypatch.setattr(correctness, "check_variant", check)
    assert installed_cuda_peer("torch", "torch", "x", native_rope, inplace=False, tokens=5,
                               heads=3, head_dim=128) == (True, "")
    assert (seen["tokens"], seen["heads"], seen["head_dim"]) == (5, 3, 128)
    ok, why = installed_cuda_peer("torch", "torch", "x", lambda q, k, f: (q, k), inplace=False,
                                  head_dim=80)
    assert not ok and "disagreed with float64 at 8 x 2 x 80" in why


# -- per-shape skipping, with a stand-in that carries FlashInfer's rule --------------
def _rotate_in_place(xq, xk, freqs_cis):
    q, k = native_rope(xq, xk, freqs_cis)
    xq.copy_(q)
    xk.copy_(k)
    return xq, xk


def _variants():
    calls = []

    def stand_in(xq, xk, freqs_cis):
        calls.append(xq.shape[-1])
        return _rotate_in_place(xq, xk, freqs_cis)

    picky = Variant("flashinfer", stand_in, 1, 1, "stand-in with FlashInfer's head_dim rule",
                    inplace=True, dtypes=fi.DTYPES, head_dim_rule=fi.supported_head_dim)
    native = Variant("native", native_rope, 6, 2, "native")
    return {"native": native, "flashinfer": picky}, calls


def test_variant_says_why_it_does_not_take_a_head_dim():
    variants, _ = _variants()
    assert variants["flashinfer"].unsupported(torch.bfloat16, head_dim=80) == ""
    assert "head_dim 72" in variants["flashinfer"].unsupported(torch.bfloat16, head_dim=72)
    assert variants["flashinfer"].unsupported(torch.bfloat16) == ""  # head_dim not asked
    assert variants["native"].unsupported(torch.bfloat16, head_dim=72) == ""


def test_correctness_sweep_records_the_unsupported_head_dim_with_its_reason(monkeypatch):
    import rope_kernels.variants as variants_module
    from rope_kernels.bench.correctness_sweep import correctness_rows

    variants, calls = _variants()
    monkeypatch.setattr(variants_module, "get_variant", variants.__getitem__)
    rows = correctness_rows(["flashinfer"], ["bfloat16"], [[5, 2, 72], [5, 2, 80]],
                            device="cpu", seed=1, status=[])
    by_dim = {r["head_dim"]: r for r in rows}
    assert not by_dim[72]["supported"] and "cannot rotate head_dim 72" in by_dim[72]["reason"]
    assert by_dim[80]["supported"] and by_dim[80]["passed"], by_dim[80]
    assert calls == [80]  # never called at 72


def test_microbench_skips_the_unsupported_head_dim_and_says_why(monkeypatch, capsys):
    import rope_kernels.bench.microbench as microbench

    variants, calls = _variants()
    monkeypatch.setattr(microbench, "get_variant", variants.__getitem__)
    df = microbench.run_microbench(["native", "flashinfer"],
                                   [{"tokens": [4], "heads": [2], "head_dim": [72, 80]}],
                                   ["bfloat16"], ["eager"], device="cpu", copy_gbps=1.0,
                                   samples=1, rounds=1, progress=False)
    timed = set(zip(df.variant, df.head_dim))
    assert timed == {("native", 72), ("native", 80), ("flashinfer", 80)}
    assert 72 not in calls
    [case] = df.attrs["not_run"]
    assert (case["variant"], case["head_dim"], case["dtype"]) == ("flashinfer", 72, "bfloat16")
    assert "cannot rotate head_dim 72" in case["reason"]
    assert "flashinfer not timed at 4x2x72 bfloat16: flashinfer 0.7.4 cannot rotate" \
        in capsys.readouterr().out


def test_shapes_a_variant_skips_for_one_reason_are_one_line():
    from rope_kernels.bench.microbench import not_run_lines

    cases = [{"variant": "flashinfer", "tokens": t, "heads": h, "head_dim": 72,
              "dtype": "bfloat16", "reason": "overrun"} for t in (5476, 21904) for h in (2, 16)]
    cases.append({"variant": "flashinfer", "tokens": 4, "heads": 2, "head_dim": 72,
                  "dtype": "float32", "reason": "bf16 and fp16 only"})
    assert not_run_lines(cases) == [
        "flashinfer not timed at 5476x2x72 bfloat16, 5476x16x72 bfloat16, 21904x2x72 bfloat16, "
        "21904x16x72 bfloat16: overrun",
        "flashinfer not timed at 4x2x72 float32: bf16 and fp16 only"]


def test_encoder_leaves_out_a_variant_that_does_not_take_its_head_dim(monkeypatch):
    import rope_kernels.bench.encoder_bench as encoder_bench
    import rope_kernels.variants as variants_module

    variants, _ = _variants()
    monkeypatch.setattr(encoder_bench, "VARIANTS", variants)
    monkeypatch.setattr(variants_module, "peer_status", lambda: [
        {"name": "quack_qkv", "available": False, "reason": "quack-kernels not installed"}])
    monkeypatch.setattr(variants_module, "encoder_only_absent", lambda: {})
    names = ["native", "flashinfer", "quack_qkv", "none"]
    not_run = encoder_bench.encoder_not_run(names, 72, torch.bfloat16)  # Kimi-K2.5: 16 x 72
    assert set(not_run) == {"flashinfer", "quack_qkv"}
    assert "cannot rotate head_dim 72" in not_run["flashinfer"]
    assert not_run["quack_qkv"] == "quack-kernels not installed"
    assert set(encoder_bench.encoder_not_run(names, 16, torch.bfloat16)) == {"quack_qkv"}
