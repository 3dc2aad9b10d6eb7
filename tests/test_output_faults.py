"""Where a run writes: stale temp files in reports/<device>/traces/ are swept, a folder that
cannot be written is one line before anything runs, the index links only relative paths
whatever a folder is called, and a wheelhouse with bad arguments leaves nothing behind."""

from __future__ import annotations

import os
import re
import time
import urllib.parse
from pathlib import Path

import pytest

from rope_kernels.__main__ import main
from rope_kernels.study import reports, runner
from rope_kernels.study.reports import build_index
from rope_kernels.study.results import ResultFileError


@pytest.fixture
def fake_study(tmp_path, monkeypatch):
    """run_study in tmp_path/root with notebooks that only touch their report file."""
    root = tmp_path / "root"
    root.mkdir()
    for name in ("notebooks", "params"):
        (root / name).symlink_to(Path(runner.REPO_ROOT) / name)
    executed = []

    def fake_execute(src, dest, params, **kw):
        executed.append(src.stem)
        dest.write_text("{}")
        return dest

    monkeypatch.setattr(runner, "execute_notebook", fake_execute)
    monkeypatch.setattr(runner, "resolve_device", lambda requested: "cpu")
    monkeypatch.setattr(reports, "notebook_to_html",
                        lambda nb, html, hide_inputs: (Path(html).write_text("x"), Path(html))[1])
    return root, executed


def test_stale_trace_temp_files_are_swept(fake_study):
    """save_trace writes traces/<variant>.json.gz through write_atomic: a killed run leaves
    '.<variant>.json.gz.XXXX.tmp' there, which the next lone run removes (fresh ones stay)."""
    root, _ = fake_study
    traces = root / "reports" / "cpu" / "traces"
    traces.mkdir(parents=True)
    stale = traces / ".fused.json.gz.k2j4l1x9.tmp"
    fresh = traces / ".native.json.gz.a8b9c0d1.tmp"
    kept = traces / "fused.json.gz"
    for p in (stale, fresh, kept):
        p.write_bytes(b"x")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(kept, (old, old))
    runner.run_study(root=root, only=["01"], log=lambda *a: None)
    assert not stale.exists() and fresh.exists() and kept.exists()


@pytest.mark.parametrize("folder", ["reports", "data"])
def test_an_unwritable_output_folder_is_one_line_before_anything_runs(fake_study, folder,
                                                                     monkeypatch, capsys):
    root, executed = fake_study
    (root / folder).mkdir()
    (root / folder / "cpu").write_text("a file where the device folder should be")
    with pytest.raises(ResultFileError, match=rf"cannot write to .*{folder}/cpu"):
        runner.run_study(root=root, log=lambda *a: None)
    assert executed == []
    if os.geteuid() != 0:  # root writes anywhere: the permission case needs another user
        (root / folder / "cpu").unlink()
        (root / folder / "cpu").mkdir(mode=0o555)
        with pytest.raises(ResultFileError, match="Permission denied"):
            runner.run_study(root=root, log=lambda *a: None)
    # and from the command line: one line, exit 2
    real = runner.run_study
    monkeypatch.setattr(runner, "run_study", lambda **kw: real(root=root, **kw))
    assert main(["run", "--only", "01"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rope-study: error: cannot write to") and err.count("\n") == 1


@pytest.mark.parametrize("folder", ["javascript:alert(document.domain)", "data:text,x",
                                    "a'onmouseover='alert(1)", "50%?x=1#y"])
def test_the_index_links_only_relative_paths(tmp_path, folder):
    root = tmp_path / "root"
    dev = root / "reports" / folder
    dev.mkdir(parents=True)
    (dev / "02_microbench.html").write_text("<html></html>")
    (root / "data").mkdir()
    page = build_index(root, "all").read_text()
    hrefs = re.findall(r"href='([^']*)'", page)
    assert len(hrefs) == 1, page
    href = hrefs[0]
    assert href.startswith("./") and ":" not in href and "'" not in href
    assert urllib.parse.urlsplit(href).scheme == ""
    target = root / "reports" / urllib.parse.unquote(href)
    assert target.resolve() == (dev / "02_microbench.html").resolve()


@pytest.mark.parametrize("argv, match", [
    (["--python", "3.x"], "--python must look like 3.12"),
    (["--python", "3.12", "--platform", "../x"], "--platform must be a wheel platform tag"),
])
def test_wheelhouse_bad_arguments_are_one_line_and_leave_no_folder(tmp_path, capsys, argv, match,
                                                                   monkeypatch):
    import subprocess

    def no_download(*a, **kw):
        raise AssertionError("nothing may be downloaded for bad arguments")

    monkeypatch.setattr(subprocess, "run", no_download)
    out = tmp_path / "wheels"
    assert main(["wheelhouse", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rope-study: error: ") and err.count("\n") == 1 and match in err
    assert not out.exists()


def test_a_failed_download_removes_the_folder_it_made(tmp_path, monkeypatch, capsys):
    import subprocess

    def failing_pip(cmd, check):
        Path(cmd[cmd.index("--dest") + 1], "partial.whl").write_bytes(b"x")
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(subprocess, "run", failing_pip)
    out = tmp_path / "wheels"
    assert main(["wheelhouse", "--out", str(out)]) == 2
    assert "pip download failed (exit 1" in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    assert main(["wheelhouse", "--out", str(out)]) == 2
    assert (out / "mine.txt").exists()  # a folder that existed is left as it was


def test_a_symlinked_report_is_refused_before_the_notebook_runs(tmp_path, monkeypatch):
    import papermill

    def no_run(*a, **kw):
        raise AssertionError("the notebook must not run")

    monkeypatch.setattr(papermill, "execute_notebook", no_run)
    target = tmp_path / "elsewhere.ipynb"
    target.write_text("{}")
    dest = tmp_path / "reports" / "cpu" / "01_kernels.ipynb"
    dest.parent.mkdir(parents=True)
    dest.symlink_to(target)
    with pytest.raises(ResultFileError, match="symbolic link"):
        runner.execute_notebook(Path("01_kernels.ipynb"), dest, {}, cwd=tmp_path)
    assert dest.is_symlink() and target.read_text() == "{}"


def test_cpu_notebook_kernels_get_the_interpreter_from_the_start(fake_study, monkeypatch):
    """A notebook imports triton before rope_kernels, and Triton picks interpreter or compiler
    when a @triton.jit (its own standard library's too) is defined: on a CPU the runner hands its
    kernels TRITON_INTERPRET=1 ('make study' failed in 01 on vLLM's kernel without it)."""
    root, _ = fake_study
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    seen = []
    monkeypatch.setattr(runner, "execute_notebook", lambda src, dest, params, **kw: (
        seen.append(os.environ.get("TRITON_INTERPRET")), dest.write_text("{}"), dest)[2])
    runner.run_study(root=root, only=["01"], log=lambda *a: None)
    assert seen == ["1"]
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the user's own choice stands
    seen.clear()
    runner.run_study(root=root, only=["01"], log=lambda *a: None)
    assert seen == ["0"]
