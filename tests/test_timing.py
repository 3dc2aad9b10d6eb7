"""Timing that flatters no one: fresh output memory per call, L2 rotation by the
bytes a call reads, seeded shuffled orders recorded, verdicts against the physical
minimum. CPU tests check the bookkeeping; ``gpu`` tests the CUDA paths."""

import math
import weakref
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from rope_kernels.bench import encoder_bench, microbench, timing
from rope_kernels.bench.same_bytes_copy import same_bytes_copy_tilings
from rope_kernels.bench.encoder_bench import bucket_rounds, bucket_rows, make_bucket
from rope_kernels.bench.microbench import (SAME_BYTES_COPY, SAME_BYTES_COPY_INPLACE, Shape,
                                           bench_shape, make_arg_sets, minimal_bytes,
                                           rope_read_bytes)
from rope_kernels.bench.timing import (round_positions, rotation_count, sample_fn, shuffled_orders,
                                       time_fn, time_rounds)
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.study.results import TABLES
from rope_kernels.study.summary import (device_summary,
                                        load_device_tables, pr_comparison)
from rope_kernels.variants import Variant


class OutputLog:
    """A fake RoPE call: allocates its outputs, and at each call records the
    addresses of its outputs and whether every earlier output of the batch is
    still alive (kept) or was freed (its block free for this call to reuse)."""

    def __init__(self, numel=1 << 16, device="cpu"):
        self.numel, self.device = numel, device
        self.refs, self.calls = [], []

    def __call__(self, *args):
        out = torch.empty(self.numel, device=self.device)
        alive = sum(r() is not None for r in self.refs)
        self.calls.append((out.data_ptr(), alive, len(self.refs)))
        self.refs.append(weakref.ref(out))
        return out

    def batches(self, calls):
        return [self.calls[i:i + calls] for i in range(0, len(self.calls), calls)]

    def reset(self):
        self.refs, self.calls = [], []


def test_cold_calls_keep_outputs_alive_and_write_distinct_addresses():
    log = OutputLog()
    sets = [(torch.zeros(1),), (torch.zeros(1),)]
    time_fn(log, sets, mode="eager", calls_per_sample=4, samples=3, warmup=0)
    for batch in log.batches(4):
        ptrs = [p for p, _, _ in batch]
        assert len(set(ptrs)) == 4
        # at call i of a batch, the batch's i earlier outputs are all still alive
        base = batch[0][1]
        assert [alive - base for _, alive, _ in batch] == [0, 1, 2, 3]


def test_dropping_outputs_is_what_the_check_catches():
    """The deliberately wrong batch (outputs dropped, as before the fix): each
    call finds the previous outputs freed."""
    log = OutputLog()
    timing._run_batch(log, [(torch.zeros(1),)], 4, keep_outputs=False)
    assert [alive for _, alive, _ in log.calls] == [0, 0, 0, 0]
    log.reset()
    kept = timing._run_batch(log, [(torch.zeros(1),)], 4)
    assert [alive for _, alive, _ in log.calls] == [0, 1, 2, 3] and len(kept) == 4


def test_rotation_counts_bytes_read():
    shape, dtype = Shape(33, 3, 72), torch.bfloat16
    xq, xk, freqs = make_arg_sets(shape, dtype, "cpu", 1)[0]
    cos, sin = cos_sin_views(freqs)
    read = sum(t.numel() * t.element_size() for t in (xq, xk, cos, sin))
    assert rope_read_bytes(33, 3, 72, dtype) == read
    packed = xq._base.numel() * xq.element_size() + freqs.numel() * freqs.element_size()
    assert read < packed  # v is not read
    # read + written: what the minimal traffic counts
    assert minimal_bytes(33, 3, 72, dtype) == read + xq.numel() * 2 * xq.element_size()
    l2 = timing.l2_cache_bytes(torch.device("cpu"))
    assert rotation_count(l2 // 4, torch.device("cpu")) == 8
    assert rotation_count(10 * l2, torch.device("cpu")) == 2
    assert rotation_count(1, torch.device("cpu")) == 512
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="read_bytes"):
            rotation_count(bad, torch.device("cpu"))


def _fake_variants(log):
    """An out-of-place and an in-place stand-in (cheap, no kernels)."""

    def out_of_place(xq, xk, freqs):
        log.append(("oop", xq.data_ptr()))
        return xq * 1, xk * 1

    def in_place(xq, xk, freqs):
        log.append(("inplace", xq.data_ptr()))
        xq.mul_(-1.0)
        xk.mul_(-1.0)
        return xq, xk

    return [Variant("oop", out_of_place, 1, 1, "test"), Variant("ip", in_place, 1, 1, "test", inplace=True)]


def test_bench_shape_rotates_by_bytes_read_and_gives_in_place_variants_own_sets(monkeypatch):
    shape, dtype = Shape(16, 2, 8), torch.bfloat16
    asked, made, log = [], [], []
    real_count, real_make = microbench.cold_set_count, microbench.make_arg_sets

    def count(read_bytes, device, **kw):
        asked.append(read_bytes)
        return real_count(read_bytes, device, **kw)

    def make(*a, **kw):
        sets = real_make(*a, **kw)
        made.append([(q.clone(), k.clone()) for q, k, _ in sets])  # values before timing
        made[-1].append(sets)
        return sets

    monkeypatch.setattr(microbench, "cold_set_count", count)
    monkeypatch.setattr(microbench, "make_arg_sets", make)
    rows = bench_shape(_fake_variants(log), shape, dtype, ["eager"], device="cpu", copy_gbps=1.0,
                       samples=3, rounds=3)
    assert asked[0] == rope_read_bytes(16, 2, 8, dtype)
    shared, own = made[0], made[1]
    shared_ptrs = {q.data_ptr() for q, _, _ in shared[-1]}
    own_ptrs = {q.data_ptr() for q, _, _ in own[-1]}
    assert {p for who, p in log if who == "oop"} <= shared_ptrs
    assert {p for who, p in log if who == "inplace"} <= own_ptrs and not own_ptrs & shared_ptrs
    for (q0, k0), (q, k, _) in zip(shared[:-1], shared[-1]):  # the shared sets were not mutated
        assert torch.equal(q0, q) and torch.equal(k0, k)
    # the in-place copies started from the same values
    assert all(torch.equal(a[0], b[0]) for a, b in zip(shared[:-1], own[:-1]))
    assert [r["variant"] for r in rows] == ["oop", "ip"]
    assert [r["in_place"] for r in rows] == [False, True]
    for r in rows:
        assert r["rounds"] == 3 and r["samples"] == 3 and r["same_bytes_copy_us"] > 0
        assert r["pct_of_same_bytes_copy"] == pytest.approx(
            100 * r["same_bytes_copy_us"] / r["median_us"])
        # 2 variants and every copy tiling, out of place and in place, share the rounds
        fns = 2 + 2 * len(same_bytes_copy_tilings(2, 8, 2))
        assert set(r["round_positions"].split(";")) <= {str(i) for i in range(fns)}
        assert r["order_seed"] == "0/16x2x8/bfloat16/eager"


def test_shuffled_orders_are_seeded_recorded_and_differ_across_rounds():
    names = ["native", "fused", "fused_inplace", "compiled", "none"]
    a = shuffled_orders(names, 8, 0)
    assert a == shuffled_orders(names, 8, 0)  # seeded: reproducible
    assert a != shuffled_orders(names, 8, 1)
    assert shuffled_orders(names, 8, "0/x") == shuffled_orders(names, 8, "0/x")
    assert all(sorted(o) == sorted(names) for o in a)
    assert len(set(a)) > 1  # not one fixed order
    assert len({o[0] for o in a}) > 1  # the first slot moves
    assert round_positions([("a", "b"), ("b", "a")], "a") == "0;1"
    with pytest.raises(ValueError, match="rounds"):
        shuffled_orders(names, 0, 0)
    with pytest.raises(ValueError, match="distinct"):
        shuffled_orders(["a", "a"], 2, 0)


def test_time_rounds_runs_each_round_in_its_order_and_pools_samples():
    ran = []

    def fn(name):
        def call(x):
            ran.append(name)
            return x + 0
        return call

    sets = [(torch.zeros(4),)]
    fns = {n: (fn(n), sets) for n in ("a", "b", "c", "d")}
    r = time_rounds(fns, mode="eager", calls_per_sample=1, samples=7, rounds=3, seed=5, warmup=0, rewarm=1)
    assert len(r.orders) == 3 and r.orders == shuffled_orders(list(fns), 3, 5)
    assert {t.samples for t in r.timings.values()} == {7}  # 3 + 2 + 2
    # per round: one warm-up batch (rounds after the first) then that round's samples, in order
    expected = []
    for i, order in enumerate(r.orders):
        for n in order:
            expected += [n] * ((0 if i == 0 else 1) + (3 if i == 0 else 2))
    assert ran == expected
    assert time_rounds(fns, mode="eager", calls_per_sample=1, samples=2, rounds=5, warmup=0).orders.__len__() == 2


def test_sample_fn_rejects_bad_input():
    with pytest.raises(ValueError, match="mode"):
        sample_fn(lambda x: x, [(torch.zeros(1),)], mode="warm")
    with pytest.raises(ValueError, match="GPU"):
        sample_fn(lambda x: x, [(torch.zeros(1),)], mode="cudagraph")
    with pytest.raises(ValueError, match="empty"):
        sample_fn(lambda x: x, [], mode="eager")


PROFILED_COLUMNS = TABLES["encoder_latency.csv"].renamed  # old name -> profiled_ name

# --- encoder rounds --------------------------------------------------------------
def test_bucket_rounds_follow_the_recorded_shuffled_order(monkeypatch):
    ran = []
    monkeypatch.setattr(encoder_bench, "_forward", lambda model, inp, rope, att: ran.append(rope))
    inp = SimpleNamespace(patches=torch.zeros(1))
    variants = ["native", "fused", "fused_inplace", "none"]
    r = bucket_rounds(None, inp, variants, "eager", "sdpa_per_image", samples=6, warmup=1, seed="7/b")
    assert r.orders == shuffled_orders(variants, 6, "7/b") and len(set(r.orders)) > 1
    assert ran[len(variants):] == [v for order in r.orders for v in order]  # after one warm-up each
    assert all(len(ts) == 6 for ts in r.times.values())
    bucket = make_bucket("56x56", 1)
    profiled = {v: (0.0 if v == "none" else 1.0, 10.0) for v in variants}
    agreement = {v: {"max_rel_err_vs_native": 0.5 if v == "none" else 0.001,
                     "max_rel_err_vs_fp32": 0.5 if v == "none" else 0.004,
                     "agreement_tol_rel": 0.01} for v in variants}
    with pytest.raises(ValueError, match="agreement with native.*none"):
        bucket_rows(bucket, "eager", "sdpa_per_image", r, profiled=profiled,
                    peaks=dict.fromkeys(variants, 5.0), agreement={v: agreement[v] for v in variants[:3]},
                    copy_gbps=100.0)
    rows = bucket_rows(bucket, "eager", "sdpa_per_image", r, profiled=profiled,
                       peaks=dict.fromkeys(variants, 5.0), agreement=agreement, copy_gbps=100.0,
                       layers=2, encoder="small")
    assert encoder_bench.agrees_with_native(pd.DataFrame(rows)).tolist() == [True, True, True, False]
    assert [row["variant"] for row in rows] == variants
    assert [row["in_place"] for row in rows] == [False, False, True, False]  # the registry's
    for row in rows:
        assert row["round_positions"] == r.positions(row["variant"]) and row["order_seed"] == "7/b"
        per_round = [float(x) for x in row["round_ms"].split(";")]
        assert per_round == pytest.approx([t / 1e3 for t in r.times[row["variant"]]], rel=1e-5)
        assert set(PROFILED_COLUMNS.values()) <= set(row) and not set(PROFILED_COLUMNS) & set(row)
        assert row["layers"] == 2 and "paired_saving_pct_p20" in row and "paired_saving_pct_p80" in row
    assert rows[1]["profiled_rope_share"] == 0.1 and rows[1]["profiled_rope_device_ms"] == 1.0


def test_old_ttft_files_read_with_profiled_names(tmp_path):
    old = pd.DataFrame({"variant": ["native", "fused"], "resolution": "1024x1024", "images": 16,
                        "mode": "cudagraph", "median_ms": [100.0, 92.0], "rope_share": [0.1, 0.02],
                        "rope_device_ms": [10.0, 2.0], "peak_mem_mb": [1.0, 1.0],
                        "device_name": "gpu", "git_commit": "abc"})
    (tmp_path / "dev").mkdir()
    old.to_csv(tmp_path / "dev" / "ttft.csv", index=False)
    ttft = load_device_tables(tmp_path, "encoder_latency.csv")
    assert set(PROFILED_COLUMNS.values()) <= set(ttft.columns)
    assert not set(PROFILED_COLUMNS) & set(ttft.columns)
    assert ttft.profiled_rope_device_ms.tolist() == [10.0, 2.0]
    assert device_summary(pd.DataFrame(), ttft)["encoder_saving_pct"] == pytest.approx(8.0)
    ttft.to_csv(tmp_path / "dev" / "ttft.csv", index=False)  # new names: read as they are
    assert load_device_tables(tmp_path, "encoder_latency.csv").columns.tolist() == ttft.columns.tolist()


def test_pr_rows_below_the_minimum_are_not_counted_as_met():
    pr = pd.DataFrame({"tokens": [8192, 4096], "heads": [12, 12], "head_dim": [128, 128],
                       "native_us": [50.0, 25.0], "fused_us": [30.0, 5.0], "speedup": [5.0, 5.0]})
    nbytes = [minimal_bytes(8192, 12, 128, torch.bfloat16), minimal_bytes(4096, 12, 128, torch.bfloat16)]
    copy_gbps = 4000.0
    minimal = [b / (copy_gbps * 1e3) for b in nbytes]  # us
    rows = []
    for (t, b, m, fused_us) in zip([8192, 4096], nbytes, minimal, [0.9 * minimal[0], 20.0]):
        for v, us in (("native", 50.0), ("fused", fused_us)):
            rows.append({"variant": v, "tokens": t, "heads": 12, "head_dim": 128, "dtype": "bfloat16",
                         "mode": "cudagraph", "median_us": us, "bytes": b, "copy_gbps": copy_gbps,
                         "device_name": "gpu", "git_commit": "abc", "speedup_vs_native": 50.0 / us,
                         "pct_of_copy": 100 * m / us})
    micro = pd.DataFrame(rows)
    cmp = pr_comparison(micro, pr, "cudagraph").set_index("tokens")
    assert cmp.loc[8192, "fused_at_or_under_pr"] and cmp.loc[8192, "check"] == "within noise"
    assert cmp.loc[4096, "check"] == "missed"
    assert device_summary(micro, pd.DataFrame(), pr)["pr_fused_at_or_under_cudagraph"] == "0/2 (1 within noise)"
    assert math.isclose(cmp.loc[8192, "minimal_us"], minimal[0])


# --- GPU: the CUDA paths of the same bookkeeping -----------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "cudagraph"])
def test_gpu_cold_calls_write_distinct_addresses(mode):
    log = OutputLog(numel=1 << 20, device="cuda")
    sets = [(torch.zeros(1, device="cuda"),) for _ in range(3)]
    time_fn(log, sets, mode=mode, calls_per_sample=6, samples=2, warmup=1)
    captured = log.calls[-6:]  # eager: the last sample's batch; cudagraph: the captured batch
    assert len({p for p, _, _ in captured}) == 6


@pytest.mark.gpu
def test_gpu_warm_graph_reuses_one_output_address():
    log = OutputLog(numel=1 << 20, device="cuda")
    time_fn(log, [(torch.zeros(1, device="cuda"),)], mode="cudagraph_warm", calls_per_sample=4,
            samples=2, warmup=1)
    assert len({p for p, _, _ in log.calls[-4:]}) == 1  # documented: warm mode, one address


@pytest.mark.gpu
def test_gpu_bench_shape_in_place_variant_leaves_shared_sets_alone():
    from rope_kernels import VARIANTS

    rows = bench_shape([VARIANTS["fused"], VARIANTS["fused_inplace"]], Shape(1024, 16, 72), torch.bfloat16,
                       ["eager", "cudagraph"], device="cuda", copy_gbps=4000.0, samples=4, rounds=2)
    assert {r["variant"] for r in rows} == {"fused", "fused_inplace"}
    assert all(r["input_sets"] == rotation_count(rope_read_bytes(1024, 16, 72, torch.bfloat16),
                                                  torch.device("cuda")) for r in rows)
    assert all(r["same_bytes_copy_us"] > 0 and r["rounds"] == 2 for r in rows)
    assert not {SAME_BYTES_COPY, SAME_BYTES_COPY_INPLACE} & {r["variant"] for r in rows}


def test_device_of_looks_into_bundled_argument_sets():
    """The QKV benchmark passes one dict per call; its tensors' device decides the
    timer (a dict once read as 'no tensor' sent GPU runs to 'needs a GPU')."""
    from rope_kernels.bench.timing import _device_of

    meta = torch.empty(1, device="meta")
    assert _device_of(({"x": meta, "n": 3},)).type == "meta"
    assert _device_of(([1, (meta,)],)).type == "meta"
    assert _device_of((1, "a")).type == "cpu"
