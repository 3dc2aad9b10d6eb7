"""Result files are never lost or half-written."""

import multiprocessing as mp
import os

import pandas as pd
import pytest

from rope_kernels.study import results
from rope_kernels.study.results import MICROBENCH_KEY, upsert_csv, write_atomic


def row(variant="fused", tokens=256, median=1.0, device="NVIDIA H200", **kw):
    return {"variant": variant, "tokens": tokens, "heads": 16, "head_dim": 72,
            "dtype": "bfloat16", "mode": "cudagraph", "device_name": device,
            "median_us": median, **kw}


def test_upsert_replaces_matching_rows_and_keeps_the_rest(tmp_path):
    path = tmp_path / "microbench.csv"
    upsert_csv(path, [row("native", median=10.0), row("fused", median=2.0),
                      row("fused", device="AMD MI300X", median=3.0)], MICROBENCH_KEY)
    merged = upsert_csv(path, [row("fused", median=1.5), row("fused", tokens=512, median=2.5)],
                        MICROBENCH_KEY)
    assert len(merged) == 4
    on_disk = pd.read_csv(path)
    assert len(on_disk) == 4 and not on_disk.duplicated(list(MICROBENCH_KEY)).any()
    h200 = on_disk[(on_disk.device_name == "NVIDIA H200") & (on_disk.tokens == 256)]
    assert h200.set_index("variant").median_us.to_dict() == {"native": 10.0, "fused": 1.5}
    assert on_disk[on_disk.device_name == "AMD MI300X"].median_us.tolist() == [3.0]


def test_upsert_rejects_rows_without_the_key(tmp_path):
    with pytest.raises(ValueError, match="key column"):
        upsert_csv(tmp_path / "x.csv", [{"variant": "fused"}], MICROBENCH_KEY)
    assert not (tmp_path / "x.csv").exists()


def test_crash_during_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "microbench.csv"
    upsert_csv(path, [row(median=1.0)], MICROBENCH_KEY)
    before = path.read_text()

    def broken_replace(src, dst):
        raise OSError("disk vanished")

    monkeypatch.setattr(results.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk vanished"):
        upsert_csv(path, [row(median=9.0), row("native")], MICROBENCH_KEY)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_crash_while_writing_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "report.html"
    write_atomic(path, "old")

    def dying_fsync(fd):
        raise KeyboardInterrupt  # the run is killed halfway through writing

    monkeypatch.setattr(results.os, "fsync", dying_fsync)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "new " * 10000)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def _writer(path, worker, n):
    for i in range(n):
        upsert_csv(path, [row(f"v{worker}", tokens=i, median=float(i))], MICROBENCH_KEY)


def test_concurrent_runs_do_not_lose_rows(tmp_path):
    path = tmp_path / "microbench.csv"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    df = pd.read_csv(path)
    assert len(df) == 60  # every worker's every row; none lost to a race


def test_files_get_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.csv", "x\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.csv").stat().st_mode & 0o777 == 0o644
