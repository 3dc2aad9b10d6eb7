"""Damaged or foreign files in the result and report folders: refused with one line
naming the file, or left alone (issue 36 items 7, 12)."""

import os

import pytest

from rope_kernels.atomic_io import ResultFileError
from rope_kernels.study import results
from rope_kernels.study.results import upsert_csv


def _row(**kw):
    return {"variant": "fused", "tokens": 256, "heads": 16, "head_dim": 72, "dtype": "bfloat16",
            "mode": "cudagraph", "device_name": "X", "median_us": 1.0, **kw}


GOOD_LINE = "fused,256,16,72,bfloat16,eager,X,2.0,pairs\n"  # rotation: the key's last column


@pytest.mark.parametrize("damage,match", [
    ('"' + GOOD_LINE, r"microbench\.csv:3: not a well-formed CSV line"),         # quote never closed
    ('fused,256,16,72,bfloat16,eager,X,"2.0,pairs\n', r"microbench\.csv:3: not a well-formed"),
    ("fused,2560000000000000000000000,16,72,bfloat16,eager,X,2.0,pairs\n",       # 25 digits
     r"microbench\.csv:3: column 'tokens' holds '2560000000000000000000000', not int"),
    ("fused,-9223372036854775809,16,72,bfloat16,eager,X,2.0,pairs\n", r"microbench\.csv:3: column 'tokens'"),
    ("fused,256,16,72,bfloat16,eager,X,2.0,pairs,\n", r"microbench\.csv:3: 10 fields"),
])
def test_an_unreadable_line_is_refused_naming_the_file_and_kept(tmp_path, damage, match):
    path = tmp_path / "microbench.csv"
    upsert_csv(path, [_row()])
    path.write_text(path.read_text() + damage)
    before = path.read_bytes()
    with pytest.raises(ResultFileError, match=match) as info:
        upsert_csv(path, [_row(tokens=512)])
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before


def test_the_largest_int64_is_still_a_value(tmp_path):
    path = tmp_path / "microbench.csv"
    upsert_csv(path, [_row(tokens=2**63 - 1)])
    assert len(upsert_csv(path, [_row()])) == 2


def test_the_sweep_removes_only_its_own_temp_files(tmp_path):
    """A user's hidden files in reports/<device>/ stay, whatever they look like; only
    names this code's mkstemp calls make (a NAME it writes, 8 random characters) go."""
    ours = [".04_ttft.k3j2h1a_.ipynb", ".microbench.csv.a8f7d2b9.tmp",
            ".fused.json.gz.0123abcd.tmp", ".index.html.zzzzzzzz.tmp"]
    users = [".my.notes.ipynb", ".my.scratch12.ipynb", ".notes.abcdefgh.tmp", ".todo.tmp",
             ".ideas.abcdefgh.ipynb", ".04_ttft.backup.ipynb", ".bashrc", ".x.csv.short.tmp"]
    for name in ours + users:
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (0, 0))
    removed = results.sweep_temp_files(tmp_path)
    assert sorted(p.name for p in removed) == sorted(ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(users)


def test_the_sweep_leaves_a_link_and_its_target(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("x")
    link = tmp_path / ".microbench.csv.a8f7d2b9.tmp"
    link.symlink_to(target)
    os.utime(link, (0, 0), follow_symlinks=False)
    assert results.sweep_temp_files(tmp_path) == []
    assert link.is_symlink() and target.exists()


class _Measured(Exception):
    """What the fake notebook raises: the run got as far as measuring."""


@pytest.mark.parametrize("name,damage,match", [
    ("encoder_latency.csv", "native,56x56,1,eager,X,1.5", "the last line is not terminated"),
    ("encoder_latency.csv", '"native,56x56,1,eager,X,1.5\n', "not a well-formed CSV line"),
    ("encoder_latency.csv", "native,56x56\n", "2 fields where the header has 6"),
    ("time_to_first_token.csv", "\x00\x01garbage\x02,\x03\n", "2 fields where the header has 6"),
    ("ttft.csv", "native,56x56,1,eager,X,1.5", "the last line is not terminated"),  # its former name
])
def test_a_damaged_result_file_is_refused_before_the_run_measures(tmp_path, monkeypatch, name,
                                                                    damage, match):
    """Issue 47 item 7: a truncated or garbage CSV was found only when the notebook wrote
    its rows, after every measurement; now the run refuses it before any notebook starts."""
    from rope_kernels.study import runner
    from rope_kernels.study.devices import device_name, device_slug
    from rope_kernels.study.devices import REPO_ROOT

    root = tmp_path / "root"
    root.mkdir()
    for folder in ("notebooks", "params"):
        (root / folder).symlink_to(REPO_ROOT / folder)
    data = root / "data" / device_slug(device_name("cpu"))
    data.mkdir(parents=True)
    path = data / name
    path.write_text("variant,resolution,images,mode,device_name,median_ms\n"
                    "fused,56x56,1,eager,X,1.25\n" + damage)
    before = path.read_bytes()

    def measure(*args, **kw):
        raise _Measured

    monkeypatch.setattr(runner, "execute_notebook", measure)
    with pytest.raises(ResultFileError, match=f"{name}:3: {match}.*nothing was run"):
        runner.run_study(device="cpu", only=["04"], root=root, log=lambda *a: None)
    assert path.read_bytes() == before
    path.write_text(path.read_text().splitlines()[0] + "\n")  # a sound file: the run goes on
    with pytest.raises(_Measured):
        runner.run_study(device="cpu", only=["04"], root=root, log=lambda *a: None)
