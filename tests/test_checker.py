"""The checks must be able to fail: deliberately wrong kernels are caught."""

import pytest
import torch
import triton
import triton.language as tl

from rope_kernels import cos_sin_views, native_rope
from rope_kernels.correctness import check_variant
from rope_kernels.kernels.reference import rope_cos_sin


@triton.jit
def _neox_halves_kernel(x_ptr, out_ptr, cos_ptr, sin_ptr, n_rows, HEAD_DIM: tl.constexpr,
                        HALF: tl.constexpr, ROWS_PER_HEAD: tl.constexpr):
    """Wrong on purpose: rotates (x[j], x[j + D/2]) - NeoX halves - instead of
    Kimi's adjacent pairs (x[2j], x[2j+1])."""
    row = tl.program_id(0).to(tl.int64)
    token = row // ROWS_PER_HEAD
    j = tl.arange(0, HALF)
    x0 = tl.load(x_ptr + row * HEAD_DIM + j).to(tl.float32)
    x1 = tl.load(x_ptr + row * HEAD_DIM + HALF + j).to(tl.float32)
    c = tl.load(cos_ptr + token * HALF + j)
    s = tl.load(sin_ptr + token * HALF + j)
    tl.store(out_ptr + row * HEAD_DIM + j, (x0 * c - x1 * s).to(out_ptr.dtype.element_ty))
    tl.store(out_ptr + row * HEAD_DIM + HALF + j, (x0 * s + x1 * c).to(out_ptr.dtype.element_ty))


def neox_triton(xq, xk, freqs_cis):
    cos, sin = (t.contiguous() for t in cos_sin_views(freqs_cis))
    outs = []
    for x in (xq, xk):
        x = x.contiguous()
        out = torch.empty_like(x)
        tokens, heads, head_dim = x.shape
        _neox_halves_kernel[(tokens * heads,)](x, out, cos, sin, tokens * heads,
                                               HEAD_DIM=head_dim, HALF=head_dim // 2,
                                               ROWS_PER_HEAD=heads)
        outs.append(out)
    return tuple(outs)


def conjugate(xq, xk, f):  # rotates the wrong way
    return native_rope(xq, xk, f.conj().resolve_conj())


def skips_last_token(xq, xk, f):
    q, k = native_rope(xq, xk, f)
    q[-1] = xq[-1]
    return q, k


def swaps_q_and_k(xq, xk, f):
    q, k = native_rope(xq, xk, f)
    return k, q


def writes_into_its_k_input(xq, xk, f):  # out of place: right answer, but scribbles on xk
    q, k = native_rope(xq, xk, f)
    xk.add_(1)
    return q, k


def _rotate_in_place(xq, xk, f):
    q, k = native_rope(xq, xk, f)
    xq.copy_(q)
    xk.copy_(k)
    return xq, xk


def in_place(xq, xk, f):  # the correct twin of the next one: it must pass
    return _rotate_in_place(xq, xk, f)


def in_place_writes_into_v(xq, xk, f):  # right q and k, in place, but also scales v
    _rotate_in_place(xq, xk, f)
    tokens, heads, head_dim = xq.shape  # xq is qkv[:, 0]; v starts two head blocks on
    v = xq.as_strided(xq.shape, xq.stride(), xq.storage_offset() + 2 * heads * head_dim)
    v.mul_(2)
    return xq, xk


for _fn in (in_place, in_place_writes_into_v):
    _fn.inplace = True  # check_variant then hands it the packed views, and watches v


def uses_one_token_angle(xq, xk, f):
    return native_rope(xq, xk, f[:1].expand_as(f).contiguous())


WRONG = [neox_triton, conjugate, skips_last_token, swaps_q_and_k, writes_into_its_k_input,
         in_place_writes_into_v, uses_one_token_angle]


@pytest.mark.parametrize("fn", WRONG, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_wrong_kernels_are_caught(fn, dtype, device):
    res = check_variant(fn, tokens=6, heads=2, head_dim=8, dtype=dtype, device=device)
    assert not res.passed, res


def cos_sin_in_data_dtype(xq, xk, f):
    """Right, with one extra rounding: cos/sin in the data's dtype (as vLLM's flash-attention
    rotary requires), the math in fp32."""
    cos, sin = (t.to(xq.dtype).float() for t in cos_sin_views(f))
    q, k = rope_cos_sin(xq.float(), xk.float(), cos, sin)
    return q.to(xq.dtype), k.to(xk.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_tiny_samples_judge_a_rounding_not_the_luck_of_the_draw(dtype):
    """At 1 token x 1 head x 4 dims (4 values a tensor) native's largest error over the sample
    can be far below its worst case; 2x it failed a kernel with one extra rounding in 28 of
    300 draws (CI, vllm_rotary_qkv in fp16). The rule takes native's error no smaller than
    half an ulp at the output's scale: that kernel passes every draw, and wrong kernels
    still fail at that size."""
    for seed in range(100):
        res = check_variant(cos_sin_in_data_dtype, tokens=1, heads=1, head_dim=4, dtype=dtype,
                            seed=seed)
        assert res.passed, res
    for fn in (conjugate, swaps_q_and_k, skips_last_token):
        caught = sum(not check_variant(fn, tokens=1, heads=1, head_dim=4, dtype=dtype,
                                       seed=seed).passed for seed in range(20))
        assert caught == 20, (fn.__name__, caught)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_in_place_twin_passes_and_writing_v_is_why_the_other_fails(dtype, device):
    """The in-place negative control fails only for touching v: its twin passes, and
    its own result has the right numbers with inputs_intact False."""
    assert check_variant(in_place, tokens=6, heads=2, head_dim=8, dtype=dtype,
                         device=device).passed
    res = check_variant(in_place_writes_into_v, tokens=6, heads=2, head_dim=8, dtype=dtype,
                        device=device)
    assert not res.inputs_intact and res.max_abs_err <= res.tolerance and not res.passed


def test_a_check_replays_from_its_recorded_seed(device):
    """Every result records the seed of its inputs; the same seed draws the same inputs
    (same error to the last bit), and an unseeded check draws new ones."""
    fn = lambda xq, xk, f: rope_cos_sin(xq, xk, *cos_sin_views(f))  # noqa: E731
    first = check_variant(fn, tokens=6, heads=2, head_dim=8, dtype=torch.bfloat16, device=device)
    again = check_variant(fn, tokens=6, heads=2, head_dim=8, dtype=torch.bfloat16, device=device,
                          seed=first.seed)
    assert again.seed == first.seed and again.max_abs_err == first.max_abs_err
    assert again.native_max_abs_err == first.native_max_abs_err
    other = check_variant(fn, tokens=6, heads=2, head_dim=8, dtype=torch.bfloat16, device=device)
    assert other.seed != first.seed and other.native_max_abs_err != first.native_max_abs_err


def test_real_arithmetic_form_passes(device):
    """The checker is not merely strict: a correct rewrite passes."""
    fn = lambda xq, xk, f: rope_cos_sin(xq, xk, *cos_sin_views(f))  # noqa: E731
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        res = check_variant(fn, tokens=6, heads=2, head_dim=8, dtype=dtype, device=device)
        assert res.passed, res


def test_correctness_rows_cover_every_registered_variant_and_record_absent_peers(monkeypatch):
    """Nothing the study can time is left out of correctness.csv: with no names,
    every registered variant is checked and every peer that cannot run here gets
    rows saying why (not run), instead of no rows."""
    from rope_kernels import correctness
    from rope_kernels.bench import correctness_sweep
    from rope_kernels.variants import VARIANTS, peer_status

    checked = []

    def fake_check(variant, **kw):  # the real check is tested above; here: who is checked
        checked.append(variant.name)
        return correctness.CheckResult(variant.name, kw["tokens"], kw["heads"], kw["head_dim"],
                                       str(kw["dtype"]).removeprefix("torch."), True, 0.0, 0.0,
                                       0.0, 1.0, True, True)

    monkeypatch.setattr(correctness_sweep, "check_variant", fake_check)
    status = [{"name": "engine_x", "available": False, "reason": "wheel not installed",
               "package": "engine-x", "version": "", "sha256": ""}]
    rows = correctness_sweep.correctness_rows([], ["bfloat16"], [[4, 2, 8], [3, 1, 4]], device="cpu",
                                        status=status)
    assert checked == [n for n in VARIANTS for _ in range(2)]
    absent = [r for r in rows if r["variant"] == "engine_x"]
    assert len(absent) == 2 and not any(r["supported"] or r["passed"] for r in absent)
    assert all(r["reason"] == "absent here: wheel not installed" and r["peer_package"] == "engine-x"
               for r in absent)
    import pandas as pd
    from rope_kernels.variants import encoder_only_absent
    modes_absent = set(encoder_only_absent())  # encoder-only modes that cannot run here
    assert correctness_sweep.absent(pd.DataFrame(rows)).tolist() == [
        r in absent or r["variant"] in modes_absent for r in rows]
    default = correctness_sweep.correctness_rows([], ["float32"], [[2, 1, 4]], device="cpu")
    unavailable = {s["name"] for s in peer_status() if not s["available"]}
    assert unavailable <= {r["variant"] for r in default}  # the real registry's absent peers too
    checked.clear()
    named = correctness_sweep.correctness_rows(["fused", "engine_x"], [torch.float32], [[2, 1, 4]],
                                         device="cpu", status=status)
    assert checked == ["fused"] and [r["variant"] for r in named] == ["fused", "engine_x"]
    with pytest.raises(ValueError, match="unknown variant"):
        correctness_sweep.correctness_rows(["nope"], ["float32"], [[2, 1, 4]], device="cpu", status=status)


def test_correctness_rows_run_the_real_checks(device):
    from rope_kernels.bench.correctness_sweep import correctness_rows

    rows = correctness_rows(["native", "fused_inplace"], ["bfloat16"], [[5, 2, 8]], device=device,
                            status=[])
    assert [r["variant"] for r in rows] == ["native", "fused_inplace"]
    assert all(r["passed"] and r["supported"] for r in rows)


def _bf16_table_rope(xq, xk, freqs_cis, sign=1.0):
    """Native RoPE handed cos/sin rounded to bf16 (as vLLM's bundled flash-attention rotary
    takes them), optionally with the sine's sign flipped (a wrong kernel)."""
    rounded = torch.complex(freqs_cis.real.bfloat16().float(), sign * freqs_cis.imag.bfloat16().float())
    return native_rope(xq, xk, rounded)


def test_a_kernel_given_a_bf16_table_is_judged_with_that_table_and_a_wrong_one_still_fails():
    """A variant flagged ``table_in_data_dtype`` (its engine hands it cos/sin in the data's
    dtype) is judged against native's error with the same rounded table: every draw passes
    (with the fp32-table yardstick some draws fail by a hair); the same kernel rotating the
    wrong way still fails, and an unflagged copy keeps the fp32-table yardstick."""
    def good(xq, xk, f):
        return _bf16_table_rope(xq, xk, f)

    def wrong(xq, xk, f):
        return _bf16_table_rope(xq, xk, f, sign=-1.0)

    good.table_in_data_dtype = wrong.table_in_data_dtype = True
    for seed in range(12):
        res = check_variant(good, tokens=33, heads=2, head_dim=80, dtype=torch.bfloat16, seed=seed)
        assert res.passed, res
        assert not check_variant(wrong, tokens=33, heads=2, head_dim=80, dtype=torch.bfloat16,
                                 seed=seed).passed

    def plain(xq, xk, f):
        return _bf16_table_rope(xq, xk, f)

    flagged = check_variant(good, tokens=33, heads=2, head_dim=80, dtype=torch.bfloat16, seed=3)
    unflagged = check_variant(plain, tokens=33, heads=2, head_dim=80, dtype=torch.bfloat16, seed=3)
    assert flagged.max_abs_err == unflagged.max_abs_err
    assert flagged.tolerance >= unflagged.tolerance
