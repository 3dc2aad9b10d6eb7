"""Reading result files for findings, targets and the index: one checked reader
(``results.read_table``) that names the file; duplicate keys refused, resolutions in
one spelling; README written atomically through links, keeping its mode, its markers
checked (issue 36 items 5, 6, 8, 10, 11, 20)."""

from __future__ import annotations

import os
import re
import stat

import pandas as pd
import pytest

from rope_kernels.__main__ import main
from rope_kernels.atomic_io import ResultFileError
from rope_kernels.study import findings as F
from rope_kernels.study import summary
from rope_kernels.study import targets as T
from rope_kernels.study.results import read_table
from rope_kernels.study.specs import SPECS
from rope_kernels.vocabulary import parse_resolution, resolution_text


def _micro() -> pd.DataFrame:
    rows = []
    for mode in ("cudagraph", "cudagraph_warm"):
        for t in T.KIMI_TOKENS:
            for v, us in (("native", 100.0), ("fused", 10.0)):
                rows.append({"variant": v, "tokens": t, "heads": 16, "head_dim": 72,
                             "dtype": "bfloat16", "mode": mode, "median_us": us * t / 5476,
                             "bytes": 8 * t * 16 * 72, "copy_gbps": 4000.0, "in_place": False,
                             "device_name": "GPU X", "git_commit": "c0ffee"})
    return pd.DataFrame(rows)


def _encoder(resolutions=("1024x1024",)) -> pd.DataFrame:
    rows = []
    for res in resolutions:
        for v, ms in (("native", 110.0), ("fused", 100.0), ("none", 99.0)):
            rows.append({"variant": v, "resolution": res, "images": 16, "mode": "cudagraph",
                         "vit_tokens": 87616, "median_ms": ms, "layers": 27, "samples": 5,
                         "in_place": False, "device_name": "GPU X", "git_commit": "c0ffee"})
    return pd.DataFrame(rows)


@pytest.fixture
def device(tmp_path):
    dev = tmp_path / "data" / "gpu-x"
    dev.mkdir(parents=True)
    _micro().to_csv(dev / "microbench.csv", index=False)
    return dev


def _cli(capsys, *args) -> tuple[int, str]:
    rc = main(list(args))
    err = capsys.readouterr().err
    return rc, err


def _both_clis(capsys, dev):
    root = str(dev.parent)
    yield _cli(capsys, "targets", "--data-root", root, "--device", dev.name)
    yield _cli(capsys, "findings", "--data-root", root, "--device", dev.name)


GOOD = _micro().to_csv(index=False)
DAMAGES = {
    "empty": ("", "the file is empty"),
    "blank": ("\n\n", "the file is empty"),
    "header only, truncated row": (GOOD + "fused,256,16", "not terminated"),
    "short last row": (GOOD + "fused,256,16\n", "fields where the header has"),
    "long last row": (GOOD.rstrip("\n") + ",extra\n", "fields where the header has"),
    "open quote": (GOOD + '"fused,256\n', "not a well-formed CSV line"),
    "repeated header": (GOOD + GOOD.splitlines()[0] + "\n", "header is repeated"),
    "not utf-8": (GOOD.encode() + b"\xff\xfe,1\n", "not UTF-8"),
    "no mode column": (_micro().drop(columns="mode").to_csv(index=False), "lacks column(s) ['mode']"),
    "no time column": (_micro().drop(columns="median_us").to_csv(index=False),
                       "lacks column(s) ['median_us']"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_file_is_one_line_naming_it(device, capsys, damage):
    text, match = DAMAGES[damage]
    path = device / "microbench.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for rc, err in _both_clis(capsys, device):
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert str(path) in err and match in err
    with pytest.raises(ResultFileError, match=re.escape(match)):  # the index reads through the same reader
        summary.all_devices(device.parent, "all")


def test_targets_refuses_a_file_without_the_measured_column(device, capsys):
    """Not 'not measured' and exit 0: the file lacks what its rows must carry."""
    _micro().drop(columns="median_us").to_csv(device / "microbench.csv", index=False)
    rc, err = _cli(capsys, "targets", "--data-root", str(device.parent), "--device", device.name)
    assert rc == 2 and "median_us" in err and "microbench.csv" in err
    _encoder().drop(columns="median_ms").to_csv(device / "encoder_latency.csv", index=False)
    _micro().to_csv(device / "microbench.csv", index=False)
    rc, err = _cli(capsys, "targets", "--data-root", str(device.parent), "--device", device.name)
    assert rc == 2 and "median_ms" in err and "encoder_latency.csv" in err


def test_a_damaged_pr_table_is_named(device, tmp_path):
    pr = tmp_path / "pr.csv"
    pr.write_text("tokens,heads\n256,3\n")
    with pytest.raises(ResultFileError, match=r"pr\.csv: lacks column\(s\) \['head_dim', 'fused_us'\]"):
        T.load_tables(device, pr)


@pytest.mark.parametrize("table", ["microbench", "encoder"])
def test_duplicate_key_rows_are_refused_not_mixed(device, capsys, table):
    if table == "microbench":
        df = _micro()
        twin = df.iloc[[3]].assign(median_us=1.0)  # the same key, another time
        path = device / "microbench.csv"
    else:
        df = _encoder()
        twin = df.iloc[[1]].assign(median_ms=1.0)
        path = device / "encoder_latency.csv"
    pd.concat([df, twin]).to_csv(path, index=False)
    for rc, err in _both_clis(capsys, device):
        assert rc == 2 and str(path) in err and "repeat a key" in err and "Traceback" not in err


def test_two_spellings_of_a_resolution_are_one_bucket(device, capsys):
    """'1024X1024' rows are the 1024x1024 bucket; with '1024x1024' rows beside them
    they repeat a key (refused, not two buckets)."""
    _encoder(("1024X1024",)).to_csv(device / "encoder_latency.csv", index=False)
    tables = T.load_tables(device)
    assert set(tables["encoder"]["resolution"]) == {"1024x1024"}
    assert not T._bucket(tables, "cudagraph").empty
    assert "not measured at" not in F.encoder_section(F.load(device))
    _encoder(("56x56", " 56 X 56")).to_csv(device / "encoder_latency.csv", index=False)
    for rc, err in _both_clis(capsys, device):
        assert rc == 2 and "repeat a key" in err


@pytest.mark.parametrize("text,canonical", [("56X56", "56x56"), (" 56 x 56 ", "56x56"),
                                            ("0112x084", "112x84")])
def test_resolution_spellings_normalise(text, canonical):
    from rope_kernels.bench.encoder_bench import make_bucket

    assert resolution_text(text) == canonical
    assert make_bucket(text, 1).resolution == canonical


@pytest.mark.parametrize("text", ["١٠٢٤x١٠٢٤", "56x５６", "56x56x56", "56*56"])
def test_resolutions_take_ascii_digits_only(text):
    with pytest.raises(ValueError, match="resolution must look like"):
        parse_resolution(text)


def test_the_notebook_refuses_one_resolution_in_two_spellings():
    rule = SPECS["04_ttft"].parameters["resolutions"].rule
    assert rule(["56x56", "112x84"], "cpu") is None
    assert "twice" in rule(["56x56", "56X56"], "cpu")
    assert SPECS["04_ttft"].shard.rows("56X56") == {"resolution": ["56x56"]}


# -- README: markers, links, modes ----------------------------------------------------

def _readme(path, body="old\n", begin=F.FINDINGS_BEGIN, end=F.FINDINGS_END):
    path.write_text(f"# t\n{begin}\n{body}{end}\nafter\n")
    return path


@pytest.mark.parametrize("layout,match", [
    ("swapped", "swapped"), ("two begins", "more than once"), ("two ends", "more than once"),
    ("no end", "no findings markers")])
def test_bad_markers_are_one_line(tmp_path, device, capsys, layout, match):
    readme = tmp_path / "README.md"
    text = {"swapped": f"{F.FINDINGS_END}\nx\n{F.FINDINGS_BEGIN}\n",
            "two begins": f"{F.FINDINGS_BEGIN}\n{F.FINDINGS_BEGIN}\nx\n{F.FINDINGS_END}\n",
            "two ends": f"{F.FINDINGS_BEGIN}\nx\n{F.FINDINGS_END}\n{F.FINDINGS_END}\n",
            "no end": f"{F.FINDINGS_BEGIN}\nx\n"}[layout]
    readme.write_text(text)
    with pytest.raises(ValueError, match=match):
        F.write_readme(readme, "new\n")
    assert readme.read_text() == text
    for flag in ("--write", "--check"):
        rc, err = _cli(capsys, "findings", "--data-root", str(device.parent), "--device",
                       device.name, "--readme", str(readme), flag)
        assert rc == 2 and match in err and str(readme) in err and "Traceback" not in err


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664])
def test_write_keeps_the_readme_mode(tmp_path, mode):
    readme = _readme(tmp_path / "README.md")
    os.chmod(readme, mode)
    assert F.write_readme(readme, "new\n")
    assert stat.S_IMODE(readme.stat().st_mode) == mode
    assert F.readme_section(readme.read_text()) == "new\n"
    assert sorted(tmp_path.iterdir()) == [readme]  # no temporary file left


@pytest.mark.parametrize("relative", [True, False])
def test_write_goes_through_a_symlinked_readme(tmp_path, relative):
    (tmp_path / "docs").mkdir()
    target = _readme(tmp_path / "docs" / "README.md")
    os.chmod(target, 0o644)
    link = tmp_path / "README.md"
    link.symlink_to("docs/README.md" if relative else target)
    assert F.write_readme(link, "new\n")
    assert link.is_symlink() and F.readme_section(target.read_text()) == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_dangling_readme_link_is_refused(tmp_path):
    link = tmp_path / "README.md"
    link.symlink_to(tmp_path / "gone.md")
    with pytest.raises((ValueError, OSError)):
        F.write_readme(link, "new\n")
    assert link.is_symlink() and not (tmp_path / "gone.md").exists()


def test_the_reader_names_a_missing_file(tmp_path):
    with pytest.raises(ResultFileError, match="no such result file"):
        read_table(tmp_path / "microbench.csv")


@pytest.mark.parametrize("kind", ["pipe", "folder"])
def test_a_result_path_that_is_not_a_file_is_one_line_not_a_hang(device, capsys, kind):
    import signal

    path = device / "microbench.csv"
    path.unlink()
    os.mkfifo(path) if kind == "pipe" else path.mkdir()

    def hung(*_):
        raise TimeoutError("hung reading a named pipe")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        for rc, err in _both_clis(capsys, device):
            assert rc == 2 and "not a regular file" in err and str(path) in err
        with pytest.raises(ResultFileError, match="not a regular file"):
            summary.all_devices(device.parent, "all")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", ["pipe", "folder", "absent"])
def test_a_readme_that_is_not_a_file_is_one_line(tmp_path, device, capsys, kind):
    import signal

    readme = tmp_path / "README.md"
    if kind == "pipe":
        os.mkfifo(readme)
    elif kind == "folder":
        readme.mkdir()
    old = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("hung")))
    signal.alarm(30)
    try:
        for flag in ("--write", "--check"):
            rc, err = _cli(capsys, "findings", "--data-root", str(device.parent), "--device",
                           device.name, "--readme", str(readme), flag)
            assert rc == 2 and str(readme) in err and "Traceback" not in err
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
