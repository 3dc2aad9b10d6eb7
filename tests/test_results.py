"""Result files are never lost or half-written."""

import multiprocessing as mp
import os

import pandas as pd
import pytest

from rope_kernels import atomic_io
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
    assert len(on_disk) == 4 and not on_disk.duplicated([k for k in MICROBENCH_KEY if k in on_disk]).any()
    h200 = on_disk[(on_disk.device_name == "NVIDIA H200") & (on_disk.tokens == 256)]
    assert h200.set_index("variant").median_us.to_dict() == {"native": 10.0, "fused": 1.5}
    assert on_disk[on_disk.device_name == "AMD MI300X"].median_us.tolist() == [3.0]


def test_a_rotation_is_part_of_the_key_and_rows_without_it_are_pairs(tmp_path):
    """Rotate-half rows beside pairs rows of the same shape are two rows (issue 43); rows
    written without the rotation column (before it existed) are pairs rows by the declared
    migration, so a file of them takes a pairs row of the same shape as a replacement."""
    path = tmp_path / "microbench.csv"
    upsert_csv(path, [row(median=1.0), row(tokens=512, median=2.0)])  # no rotation column
    merged = upsert_csv(path, [row(median=3.0, rotation="pairs"), row(median=4.0, rotation="half")])
    got = merged.set_index(["tokens", "rotation"]).median_us.to_dict()
    assert got == {(256, "pairs"): 3.0, (512, "pairs"): 2.0, (256, "half"): 4.0}


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

    monkeypatch.setattr(atomic_io.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk vanished"):
        upsert_csv(path, [row(median=9.0), row("native")], MICROBENCH_KEY)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_crash_while_writing_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "report.html"
    write_atomic(path, "old")

    def dying_fsync(fd):
        raise KeyboardInterrupt  # the run is killed halfway through writing

    monkeypatch.setattr(atomic_io.os, "fsync", dying_fsync)
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


# The file on disk is checked before any upsert ------------------------------

def _write_good(path, n=6):
    upsert_csv(path, [row(tokens=t, median=float(t)) for t in range(n)], MICROBENCH_KEY)
    return path.read_bytes()


def _assert_refused(path, rows, match, before):
    with pytest.raises(results.ResultFileError, match=match) as info:
        upsert_csv(path, rows, MICROBENCH_KEY)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before  # nothing rewritten
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_renamed_header_is_an_error_and_loses_no_rows(tmp_path):
    path = tmp_path / "microbench.csv"
    _write_good(path, 42)
    text = path.read_text().replace("median_us", "median_time_us", 1)
    path.write_text(text)
    before = path.read_bytes()
    _assert_refused(path, [row(tokens=999)], r"microbench.csv:1: .*only in the file: "
                    r"\['median_time_us'\].*lacks: \['median_us'\]", before)
    assert len(pd.read_csv(path)) == 42


def test_unknown_column_in_the_file_is_an_error(tmp_path):
    path = tmp_path / "microbench.csv"
    upsert_csv(path, [row(extra=1)], MICROBENCH_KEY)
    before = path.read_bytes()
    _assert_refused(path, [row()], r"only in the file: \['extra'\]", before)


@pytest.mark.parametrize("damage, match", [
    (lambda lines: lines[:3] + ["garbage"] + lines[3:], r":4: 1 fields where the header has 9"),
    (lambda lines: lines[:3] + [lines[3].replace("fused,2,", "fused,2.0,")] + lines[4:],
     r":4: column 'tokens' holds '2.0', not int"),
    (lambda lines: lines[:4] + [lines[0]] + lines[4:], r":5: the header is repeated mid-file"),
    (lambda lines: lines[:-1] + [lines[-1].rsplit(",", 3)[0]], r":7: 6 fields where"),
])
def test_malformed_lines_are_errors_naming_file_and_line(tmp_path, damage, match):
    path = tmp_path / "microbench.csv"
    _write_good(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(damage(lines)) + "\n")
    before = path.read_bytes()
    _assert_refused(path, [row(tokens=999)], match, before)


def test_truncated_last_line_is_an_error(tmp_path):
    path = tmp_path / "microbench.csv"
    _write_good(path)
    path.write_bytes(path.read_bytes()[:-3])  # a write cut short: last value partial
    _assert_refused(path, [row(tokens=999)], r"microbench.csv:7: .*truncated", path.read_bytes())


def test_declared_migrations_keep_old_rows(tmp_path):
    """ttft.csv files from before the ``profiled_`` names, the peer columns and the
    file's rename to encoder_latency.csv merge with rows that carry them: declared
    once in specs.RESULT_FILES; the old file goes once its rows are under the new name."""
    former = tmp_path / "ttft.csv"
    old = {"variant": "native", "resolution": "448x448", "images": 1, "mode": "eager",
           "device_name": "NVIDIA H200", "median_ms": 14.5, "rope_share": 0.1, "rope_device_ms": 0.6}
    pd.DataFrame([old, {**old, "variant": "fused_inplace", "rope_share": 0.02}]).to_csv(former, index=False)
    path = tmp_path / "encoder_latency.csv"
    assert results.current_file(path) == former
    new = {k: v for k, v in old.items() if not k.startswith("rope_")}
    new.update(variant="liger", profiled_rope_share=0.2, profiled_rope_device_ms=1.0,
               peer_package="liger-kernel", peer_version="0.6", peer_sha256="ab" * 32,
               in_place=False, max_rel_err_vs_native=0.001, agreement_tol_rel=0.0156)
    merged = upsert_csv(path, [new], results.ENCODER_LATENCY_KEY)
    assert not former.exists() and results.current_file(path) == path
    on_disk = pd.read_csv(path).set_index("variant")
    assert len(merged) == 3 and "rope_share" not in on_disk.columns
    assert on_disk.profiled_rope_share.to_dict() == {"native": 0.1, "fused_inplace": 0.02, "liger": 0.2}
    assert on_disk.peer_package.isna().tolist() == [True, True, False]
    assert on_disk.in_place.tolist() == [False, True, False]  # derived for the old rows
    assert on_disk.max_rel_err_vs_native.isna().tolist() == [True, True, False]


def test_a_renamed_file_that_came_back_is_merged_not_lost(tmp_path):
    """Both names present (an old checkout wrote ttft.csv again): its rows are merged
    under the new name, the new file's rows winning on a key they share."""
    key = {"resolution": "448x448", "images": 1, "mode": "eager", "device_name": "X"}
    upsert_csv(tmp_path / "encoder_latency.csv",
               [{"variant": "native", **key, "median_ms": 2.0}, {"variant": "fused", **key, "median_ms": 1.0}])
    pd.DataFrame([{"variant": "native", **key, "median_ms": 9.0},
                  {"variant": "liger", **key, "median_ms": 3.0}]).to_csv(tmp_path / "ttft.csv", index=False)
    upsert_csv(tmp_path / "encoder_latency.csv", [{"variant": "none", **key, "median_ms": 0.5}])
    on_disk = pd.read_csv(tmp_path / "encoder_latency.csv").set_index("variant").median_ms.to_dict()
    assert on_disk == {"native": 2.0, "liger": 3.0, "fused": 1.0, "none": 0.5}
    assert not (tmp_path / "ttft.csv").exists()


def test_key_comes_from_the_one_table_of_schemas(tmp_path):
    path = tmp_path / "microbench.csv"
    upsert_csv(path, [row()])  # key from specs.RESULT_FILES
    with pytest.raises(ValueError, match="differs from specs.RESULT_FILES"):
        upsert_csv(path, [row()], ["variant", "tokens"])
    with pytest.raises(ValueError, match="not in specs.RESULT_FILES"):
        upsert_csv(tmp_path / "elsewhere.csv", [row()])


def test_stale_temp_files_are_swept_and_fresh_ones_kept(tmp_path):
    stale = [tmp_path / ".04_ttft.k3j2h1a_.ipynb", tmp_path / ".microbench.csv.a8f7d2b9.tmp"]
    fresh = tmp_path / ".01_kernels.zz91ab_c.ipynb"
    keep = [tmp_path / "04_ttft.ipynb", tmp_path / "microbench.csv", tmp_path / "x.failed.ipynb"]
    for p in stale + keep + [fresh]:
        p.write_text("x")
    for p in stale + keep:
        os.utime(p, (0, 0))
    assert results.sweep_temp_files(tmp_path) == sorted(stale)
    assert sorted(tmp_path.iterdir()) == sorted(keep + [fresh])


def test_run_lock_lets_concurrent_runs_share_and_only_a_lone_run_sweeps(tmp_path):
    """Job-array tasks share a device folder: a second run joins (no timeout) and
    does not sweep; the first, alone, sweeps. An exclusive holder blocks both."""
    swept = []
    with results.run_lock(tmp_path / ".run", when_alone=lambda: swept.append("first")):
        with results.run_lock(tmp_path / ".run", timeout_s=0.5,
                              when_alone=lambda: swept.append("second")):
            pass
    assert swept == ["first"]
    with results.file_lock(tmp_path / ".run"):  # an exclusive holder (e.g. an old runner)
        with pytest.raises(TimeoutError, match="held by another run"):
            with results.run_lock(tmp_path / ".run", timeout_s=0.2):
                pass


def test_a_declared_migration_leaves_a_file_the_next_run_accepts(tmp_path):
    """microbench.csv from before `rounds` (an int) and the peer columns existed: the first
    upsert migrates it, and the file it writes is in the new form, so every later upsert
    works and integers stay integers ('3', not '3.0')."""
    path = tmp_path / "microbench.csv"
    pd.DataFrame([row(variant="native"), row(variant="liger")]).to_csv(path, index=False)
    new = row(rounds=3, round_positions="0;1;2", order_seed=7, peer_package="liger-kernel",
              peer_version="0.8.5", peer_sha256="ab" * 32)
    upsert_csv(path, [new])
    upsert_csv(path, [{**new, "tokens": 512}])
    upsert_csv(path, [{**new, "tokens": 1024}])
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and all(",3,0;1;2,7," in line for line in lines[3:])
    # old rows: the added columns empty, the rotation key column its declared value (pairs)
    assert lines[1].endswith(",,,,,,,pairs")


def test_text_values_are_kept_as_written(tmp_path):
    """'NA', 'null', 'None' and '' are four different texts: untouched rows keep them, and
    rows whose keys differ only there stay four rows."""
    path = tmp_path / "microbench.csv"
    names = ["NA", "null", "None", "N/A", "nan"]
    upsert_csv(path, [row(variant=v, peer_version=v) for v in names])
    upsert_csv(path, [row(variant="fused", peer_version="1")])
    on_disk = pd.read_csv(path, keep_default_na=False, dtype=str)
    assert on_disk["variant"].tolist() == names + ["fused"]
    assert on_disk["peer_version"].tolist() == names + ["1"]


def test_a_symlinked_results_file_is_refused(tmp_path):
    target = tmp_path / "elsewhere" / "microbench.csv"
    _write_good(target)
    before = target.read_bytes()
    link = tmp_path / "microbench.csv"
    link.symlink_to(target)
    with pytest.raises(results.ResultFileError, match="symbolic link"):
        upsert_csv(link, [row(tokens=999)])
    assert link.is_symlink() and target.read_bytes() == before
    with pytest.raises(results.ResultFileError, match="symbolic link"):
        write_atomic(link, "x\n")
    assert link.is_symlink() and target.read_bytes() == before


def test_a_hard_linked_results_file_is_refused(tmp_path):
    path = tmp_path / "microbench.csv"
    before = _write_good(path)
    os.link(path, tmp_path / "backup.csv")
    with pytest.raises(results.ResultFileError, match="2 hard links"):
        upsert_csv(path, [row(tokens=999)])
    assert (tmp_path / "backup.csv").read_bytes() == before == path.read_bytes()


def test_literal_nan_and_inf_in_a_float_column_are_read(tmp_path):
    """Another writer's 'NaN'/'inf' are floats (a checked file never crashes the merge)."""
    path = tmp_path / "microbench.csv"
    _write_good(path, 3)
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace(",0.0", ",NaN")
    lines[2] = lines[2].replace(",1.0", ",inf")
    path.write_text("\n".join(lines) + "\n")
    merged = upsert_csv(path, [row(tokens=999)])
    assert merged["median_us"].isna().sum() == 1 and (merged["median_us"] == float("inf")).sum() == 1


def test_a_read_only_results_file_is_refused(tmp_path):
    path = tmp_path / "microbench.csv"
    before = _write_good(path)
    path.chmod(0o444)
    with pytest.raises(results.ResultFileError, match="read-only"):
        upsert_csv(path, [row(tokens=999)])
    with pytest.raises(results.ResultFileError, match="read-only"):
        write_atomic(path, "x\n")
    assert path.read_bytes() == before and path.stat().st_mode & 0o777 == 0o444


def test_microbench_files_from_before_in_place_and_the_sm_copy_migrate(tmp_path):
    """Old microbench rows carry clone() 'same-bytes' timings (superseded: dropped,
    not renamed into the SM copy's column) and no ``in_place``: they get it from
    the variants that were in place then, and empty SM-copy columns."""
    path = tmp_path / "microbench.csv"
    old = [row(v, copy_same_bytes_us=9.0, pct_of_copy_same_bytes=120.0)
           for v in ("native", "fused", "fused_inplace", "vllm_packed_qk", "liger")]
    pd.DataFrame(old).to_csv(path, index=False)
    new = row("sglang_vision", in_place=False, same_bytes_copy_us=2.0, pct_of_same_bytes_copy=95.0)
    upsert_csv(path, [new])
    on_disk = pd.read_csv(path).set_index("variant")
    assert not {"copy_same_bytes_us", "pct_of_copy_same_bytes"} & set(on_disk.columns)
    assert on_disk.in_place.to_dict() == {"native": False, "fused": False, "fused_inplace": True,
                                          "vllm_packed_qk": True, "liger": False,
                                          "sglang_vision": False}
    assert on_disk.same_bytes_copy_us.isna().sum() == 5
    assert on_disk.loc["sglang_vision", "pct_of_same_bytes_copy"] == 95.0
    upsert_csv(path, [row("fused", in_place=False, same_bytes_copy_us=2.1,
                          pct_of_same_bytes_copy=90.0)])  # the migrated file reads back
    assert len(pd.read_csv(path)) == 6



def test_a_commit_that_looks_like_a_number_is_read_as_text(tmp_path):
    """A 12-hex commit such as 73e709120104 parses as a float (inf) unless told not
    to: a CPU run at such a commit once broke 06_summary's commit list. Every reader
    of result files for summaries, targets and findings keeps it (and the versions)
    text."""
    from rope_kernels.study import findings, targets
    from rope_kernels.study.summary import load_device_tables

    folder = tmp_path / "data" / "cpu"
    folder.mkdir(parents=True)
    rows = pd.DataFrame([{"variant": "fused", "tokens": 8, "heads": 2, "head_dim": 8,
                          "dtype": "bfloat16", "mode": "eager", "median_us": 1.0,
                          "git_commit": "73e709120104", "python_version": "3.10",
                          "device_name": "cpu", "torch_version": "2.13.0",
                          "triton_version": "3.6.0"}])
    rows.to_csv(folder / "microbench.csv", index=False)
    assert pd.read_csv(folder / "microbench.csv").git_commit.tolist() == [float("inf")]
    for df in (results.read_table(folder / "microbench.csv"),
               load_device_tables(tmp_path / "data", "microbench.csv"),
               findings.load(folder)["microbench.csv"],
               targets.load_tables(folder)["microbench"]):
        assert df.git_commit.tolist() == ["73e709120104"]
        assert df.python_version.tolist() == ["3.10"]
    assert ", ".join(sorted(set(load_device_tables(tmp_path / "data", "microbench.csv")
                                .git_commit))) == "73e709120104"
