"""The same-bytes copy is a limit only if every tiling copies exactly, reads what a
RoPE call reads (q, k and every token's cos/sin), writes what it writes, and is
timed on the variants' own input sets, the fastest tiling being the reference.
Tiny shapes, through the interpreter on the CPU."""

import math

import pytest
import torch

from rope_kernels.bench import microbench
from rope_kernels.bench.microbench import (SAME_BYTES_COPY, SAME_BYTES_COPY_INPLACE, Shape,
                                           bench_shape, fastest_copy, make_arg_sets)
from rope_kernels.bench.same_bytes_copy import (CopyTiling, fused_tiling, launch_same_bytes_copy,
                                                same_bytes_copy, same_bytes_copy_config,
                                                same_bytes_copy_inplace, same_bytes_copy_tilings,
                                                tokens_tiling)
from rope_kernels.bench.timing import Timing
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.variants import Variant

SHAPES = [Shape(5, 2, 8), Shape(7, 3, 72), Shape(3, 1, 6), Shape(9, 4, 72)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def copies_exactly(src: tuple, out: tuple) -> bool:
    """The checker: every output is its input, bit for bit (NaN payloads, -0.0)."""
    return all(o.shape == s.shape and torch.equal(bits(o), bits(s)) for s, o in zip(src, out))


def awkward_sets(shape, dtype, device):
    xq, xk, freqs = make_arg_sets(shape, dtype, device, 1)[0]
    xq[0, 0, 0] = -0.0
    xk[-1, -1, -1] = float("nan")
    return xq, xk, freqs


def tilings_of(shape, dtype=torch.bfloat16):
    return same_bytes_copy_tilings(shape.heads, shape.head_dim,
                                   torch.empty((), dtype=dtype).element_size())


CASES = [(shape, dtype, tiling) for shape in SHAPES for dtype in DTYPES
         for tiling in tilings_of(shape, dtype)]


@pytest.mark.parametrize("shape,dtype,tiling", CASES,
                         ids=[f"{s}-{d}-{t.label}" for s, d, t in CASES])
def test_every_tiling_copies_bit_for_bit_out_of_place_and_in_place(shape, dtype, tiling, device):
    xq, xk, freqs = awkward_sets(shape, dtype, device)
    before = (xq.clone(), xk.clone())
    q, k = same_bytes_copy(xq, xk, freqs, tiling=tiling)
    assert copies_exactly(before, (q, k))
    assert q.is_contiguous() and k.is_contiguous()  # like an out-of-place variant's outputs
    assert q.data_ptr() != xq.data_ptr() and k.data_ptr() != xk.data_ptr()
    q2, k2 = same_bytes_copy_inplace(xq, xk, freqs, tiling=tiling)
    assert q2 is xq and k2 is xk and copies_exactly(before, (xq, xk))
    v = xq._base.unbind(1)[2]
    assert not torch.isnan(v).any()  # v, the packed qkv's third slice, untouched


# 4 x 72: a row of 256 + 32 elements (two chunks); 2 x 8: one power-of-two chunk
WRONG_TWIN_CASES = [(shape, tiling) for shape in (Shape(9, 4, 72), Shape(5, 2, 8))
                    for tiling in tilings_of(shape)]


@pytest.mark.parametrize("shape,tiling", WRONG_TWIN_CASES,
                         ids=[f"{s}-{t.label}" for s, t in WRONG_TWIN_CASES])
def test_wrong_twins_are_caught(shape, tiling, device):
    """A copy that stops a token short fails the bitwise check; a ``never`` equal
    to a cos or sin value of the last token changes that token's output, so the
    kernel reads every token's cos and sin (a copy that skipped them would not)."""
    xq, xk, freqs = make_arg_sets(shape, torch.bfloat16, device, 1)[0]
    cos, sin = cos_sin_views(freqs)

    def launch(**kw):
        q_out, k_out = torch.empty_like(xq.contiguous()), torch.empty_like(xk.contiguous())
        q_out.fill_(0.5), k_out.fill_(0.5)
        launch_same_bytes_copy(xq, xk, q_out, k_out, cos, sin, tiling=tiling, **kw)
        return q_out, k_out

    assert copies_exactly((xq, xk), launch())
    if tiling.layout in ("flat", "pairs", "pair_scalars"):  # their int64 index math (past 2**31)
        assert copies_exactly((xq, xk), launch(wide=True))
        assert not copies_exactly((xq, xk), launch(wide=True, n_tokens=shape.tokens - 1))
    assert not copies_exactly((xq, xk), launch(n_tokens=shape.tokens - 1))
    if tiling.layout == "fused":  # its gate takes no never: a NaN in the table instead
        with pytest.raises(ValueError, match="NaN"):
            launch(never=cos[-1, -1].item())
        for part in (0, 1):  # cos, then sin, of the last token's last pair
            poisoned = freqs.clone()
            value = [1.0, 1.0]
            value[part] = math.nan
            poisoned[-1, -1] = complex(*value)
            pc, ps = cos_sin_views(poisoned)
            q_out, k_out = torch.full_like(xq.contiguous(), 0.5), torch.full_like(xk.contiguous(), 0.5)
            launch_same_bytes_copy(xq, xk, q_out, k_out, pc, ps, tiling=tiling)
            assert not copies_exactly((xq, xk), (q_out, k_out))
            assert copies_exactly((xq[:-1], xk[:-1]), (q_out[:-1], k_out[:-1]))
        return
    for table in (cos, sin):
        q_out, k_out = launch(never=table[-1, -1].item())
        assert not copies_exactly((xq, xk), (q_out, k_out))
        assert copies_exactly((xq[:-1], xk[:-1]), (q_out[:-1], k_out[:-1]))


def test_the_family_covers_the_variants_access_patterns():
    """row (the old single tiling), whole tokens at each tile size, and flat blocks;
    no duplicates, every label distinct."""
    for heads in (2, 3, 4, 16):
        family = same_bytes_copy_tilings(heads, 72, 2)
        assert same_bytes_copy_config(heads, 72, 2) in family
        assert fused_tiling(heads, 72, 2) in family
        assert {t.layout for t in family} == {"row", "tokens", "flat", "fused", "heads",
                                              "pairs", "pair_scalars"}
        assert len({t.label for t in family}) == len(family)
    for bad in (dict(layout="head"), dict(layout="row", block_t=3, block_c=16),
                dict(layout="tokens", block_t=0), dict(layout="flat", block=True),
                dict(layout="flat", block=256, num_warps=3), dict(layout="fused", block_t=6),
                dict(layout="heads", block_t=3), dict(layout="pairs", block=0),
                dict(layout="pair_scalars", block=96)):
        with pytest.raises(ValueError, match="CopyTiling"):
            CopyTiling(**bad)


def test_tokens_tiling_fills_its_tile_with_whole_tokens():
    # 2 x 72 bf16: a token's q row is 288 B, so 8 tokens fill 4 KB (16 would not)
    assert tokens_tiling(2, 72, 2, 4096) == CopyTiling("tokens", block_t=8, num_warps=4)
    assert tokens_tiling(16, 72, 2, 4096).block_t == 1  # 2304 B: one token
    assert tokens_tiling(16, 72, 2, 1024).block_t == 1  # never fewer than one
    assert tokens_tiling(4, 72, 2, 1024).block_t == 1 and tokens_tiling(4, 72, 2, 4096).block_t == 4
    for t in (tokens_tiling(h, d, e, b) for h in (1, 2, 3, 16) for d in (8, 72, 128)
              for e in (2, 4) for b in (1024, 4096)):
        assert 1 <= t.num_warps <= 8
    with pytest.raises(ValueError, match="tile_bytes"):
        tokens_tiling(2, 72, 2, 0)


def test_every_tiling_but_fused_refuses_q_whose_heads_are_not_adjacent(device):
    """The copy kernels address a token's row as one contiguous run; the ``fused``
    member is the fused kernel, which takes any head stride (and copies exactly)."""
    shape = Shape(5, 3, 8)
    xq, xk, freqs = make_arg_sets(shape, torch.float32, device, 1)[0]
    xq, xk = (x.transpose(0, 1).contiguous().transpose(0, 1) for x in (xq, xk))
    for tiling in tilings_of(shape):
        if tiling.layout == "fused":
            assert copies_exactly((xq, xk), same_bytes_copy(xq, xk, freqs, tiling=tiling))
            continue
        with pytest.raises(ValueError, match="row contiguous"):
            same_bytes_copy(xq, xk, freqs, tiling=tiling)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("shape", [Shape(9, 4, 72), Shape(5, 16, 72), Shape(3, 2, 128)])
def test_the_fused_member_is_the_fused_kernels_own_program(shape, inplace):
    """Same kernel, grid, arguments and constexprs as ``fused_qk_rope``'s launch on the
    same tensors, except ``PAIR_FN`` (the rotation there, the gate here): the only
    difference between the fused kernel and this reference is the rotation."""
    from unittest import mock

    from rope_kernels.bench.compile_matrix import _LaunchRecorder
    from rope_kernels.bench.same_bytes_copy import _gate_row_pairs
    from rope_kernels.kernels import fused
    from rope_kernels.kernels.fused import _rotate_row_pairs, fused_qk_rope

    xq, xk, freqs = make_arg_sets(shape, torch.bfloat16, "cpu", 1)[0]
    cos, sin = cos_sin_views(freqs)
    recorder = _LaunchRecorder()
    with mock.patch.object(fused, "_fused_qk_rope_rows_kernel", recorder), \
            mock.patch("rope_kernels.kernels.fused.check_triton_device"):
        fused_qk_rope(xq, xk, cos, sin, inplace=inplace)
        tiling = fused_tiling(shape.heads, shape.head_dim, 2)
        same_bytes_copy(xq, xk, freqs, inplace=inplace, tiling=tiling)
    assert len(recorder.calls) == 2
    (g1, a1, k1), (g2, a2, k2) = recorder.calls
    assert g1 == g2
    assert k1.pop("PAIR_FN") is _rotate_row_pairs and k2.pop("PAIR_FN") is _gate_row_pairs
    assert k1 == k2 and len(a1) == len(a2)
    skip = {0, 1, 2, 3} if not inplace else set()  # fresh outputs differ
    for i, (x, y) in enumerate(zip(a1, a2)):
        if i in skip:
            continue
        if isinstance(x, torch.Tensor):
            assert x.data_ptr() == y.data_ptr() and x.stride() == y.stride(), i
        else:
            assert x == y, i


def test_the_reference_is_the_fastest_copy_of_the_same_kind():
    def t(us):
        return Timing(median_us=us, p20_us=us, p80_us=us, samples=1, timer="t",
                      calls_per_sample=1)
    timings = {"fused": t(1.0), f"{SAME_BYTES_COPY}[row:1x2/4]": t(5.0),
               f"{SAME_BYTES_COPY}[flat:256/2]": t(3.0),
               f"{SAME_BYTES_COPY_INPLACE}[tokens:8/4]": t(2.0),
               f"{SAME_BYTES_COPY_INPLACE}[row:1x2/4]": t(4.0)}
    assert fastest_copy(timings, False) == (3.0, "flat:256/2")
    assert fastest_copy(timings, True) == (2.0, "tokens:8/4")
    with pytest.raises(ValueError, match="no in-place"):
        fastest_copy({"fused": t(1.0)}, True)


def test_config_masks_no_lanes_at_kimis_rows_and_rejects_bad_input():
    for heads, block_c in ((16, 128), (4, 32), (2, 16)):
        cfg = same_bytes_copy_config(heads, 72, 2)
        assert cfg.block_c == block_c and (heads * 72) % cfg.block_c == 0
        assert cfg.block_t * cfg.block_c * 2 == 2048  # the fused kernel's tile
    assert same_bytes_copy_config(1, 6, 2).block_c == 8  # narrower than a sector: padded
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="heads"):
            same_bytes_copy_config(bad, 72, 2)


def test_bad_inputs_get_one_line_errors(device):
    xq, xk, freqs = make_arg_sets(Shape(4, 2, 8), torch.bfloat16, device, 1)[0]
    with pytest.raises(ValueError, match="row contiguous"):
        same_bytes_copy(xq.transpose(0, 1).contiguous().transpose(0, 1), xk, freqs)
    with pytest.raises(TypeError, match="inplace"):
        same_bytes_copy(xq, xk, freqs, inplace=1)
    with pytest.raises(TypeError, match="tiling"):
        same_bytes_copy(xq, xk, freqs, tiling="row")
    with pytest.raises(TypeError, match="complex64"):
        same_bytes_copy(xq, xk, freqs.real)


def test_bench_shape_times_each_copy_on_the_input_sets_its_variants_read(monkeypatch):
    """The out-of-place copy reads the shared sets the out-of-place variants read;
    the in-place copy rotates sets of its own, as every in-place variant does; each
    row carries the copy that moves what it moves."""
    seen = {}

    def logged(name, fn):
        def call(xq, xk, freqs, **kw):
            seen.setdefault(name, set()).add(xq.data_ptr())
            seen.setdefault(name + " tilings", set()).add(kw["tiling"].label)
            return fn(xq, xk, freqs, **kw)
        return call

    monkeypatch.setattr(microbench, "same_bytes_copy",
                        logged(SAME_BYTES_COPY, microbench.same_bytes_copy))
    monkeypatch.setattr(microbench, "same_bytes_copy_inplace",
                        logged(SAME_BYTES_COPY_INPLACE, microbench.same_bytes_copy_inplace))

    def oop(xq, xk, freqs):
        seen.setdefault("oop", set()).add(xq.data_ptr())
        return xq * 1, xk * 1

    def ip(xq, xk, freqs):
        seen.setdefault("ip", set()).add(xq.data_ptr())
        return xq.mul_(1), xk.mul_(1)

    variants = [Variant("oop", oop, 1, 1, "test"), Variant("ip", ip, 1, 1, "test", inplace=True)]
    rows = bench_shape(variants, Shape(8, 2, 8), torch.bfloat16, ["eager"], device="cpu",
                       copy_gbps=1.0, samples=2, rounds=2)
    assert seen[SAME_BYTES_COPY] == seen["oop"]
    assert not seen[SAME_BYTES_COPY_INPLACE] & (seen["oop"] | seen["ip"])
    assert {r["variant"]: r["in_place"] for r in rows} == {"oop": False, "ip": True}
    assert all(math.isfinite(r["pct_of_same_bytes_copy"]) for r in rows)
    # the reference copy's own noise band: its p20 <= median <= p80
    assert all(r["same_bytes_copy_p20_us"] <= r["same_bytes_copy_us"] <= r["same_bytes_copy_p80_us"]
               for r in rows)
    labels = {t.label for t in tilings_of(Shape(8, 2, 8))}
    assert seen[SAME_BYTES_COPY + " tilings"] == seen[SAME_BYTES_COPY_INPLACE + " tilings"] == labels
    assert all(r["same_bytes_copy_tiling"] in labels for r in rows)
    seen.clear()
    only_oop = bench_shape(variants[:1], Shape(8, 2, 8), torch.bfloat16, ["eager"], device="cpu",
                           copy_gbps=1.0, samples=1, rounds=1)
    assert len(only_oop) == 1  # and no in-place copy timed:
    assert set(seen) == {"oop", SAME_BYTES_COPY, SAME_BYTES_COPY + " tilings"}


@pytest.mark.parametrize("shape", [Shape(9, 4, 72), Shape(7, 3, 72), Shape(5, 2, 8)], ids=str)
def test_tokens_tiling_reads_separate_cos_and_sin_too(shape, device):
    """The tokens kernel reads freqs_cis's interleaved [c, s] pairs as the fused kernel
    does; handed separate cos and sin tensors it reads those: a copy either way, and a
    ``never`` equal to the last token's cos or sin still changes that token."""
    xq, xk, freqs = make_arg_sets(shape, torch.bfloat16, device, 1)[0]
    cos, sin = (t.contiguous() for t in cos_sin_views(freqs))
    for tiling in (t for t in tilings_of(shape) if t.layout == "tokens"):
        def launch(**kw):
            q_out, k_out = torch.full_like(xq.contiguous(), 0.5), torch.full_like(xk.contiguous(), 0.5)
            launch_same_bytes_copy(xq, xk, q_out, k_out, cos, sin, tiling=tiling, **kw)
            return q_out, k_out

        assert copies_exactly((xq, xk), launch())
        for table in (cos, sin):
            q_out, k_out = launch(never=table[-1, -1].item())
            assert not copies_exactly((xq, xk), (q_out, k_out))
            assert copies_exactly((xq[:-1], xk[:-1]), (q_out[:-1], k_out[:-1]))
