"""The commit a row records says '-dirty' whenever the tree differs from it, however
the commit was named (issue 36 item 4)."""

import subprocess

import pytest

from rope_kernels import provenance


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    repo = (tmp_path / "clone").resolve()
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "commit", "-qm", "one")
    monkeypatch.setattr(provenance, "REPO_ROOT", repo)
    monkeypatch.delenv("ROPE_STUDY_COMMIT", raising=False)
    return repo


def test_clean_and_dirty_checkouts(repo, monkeypatch):
    head = _git(repo, "rev-parse", "--short=12", "HEAD")
    assert provenance.git_commit() == head
    (repo / "a.py").write_text("x = 2\n")
    assert provenance.git_commit() == f"{head}-dirty"
    _git(repo, "add", "a.py")  # staged is uncommitted too
    assert provenance.git_commit() == f"{head}-dirty"


@pytest.mark.parametrize("edit", ["unstaged", "staged", "deleted"])
def test_a_named_commit_is_dirty_when_the_tree_differs_from_it(repo, monkeypatch, edit):
    head = _git(repo, "rev-parse", "--short=12", "HEAD")
    monkeypatch.setenv("ROPE_STUDY_COMMIT", head)
    assert provenance.git_commit() == head
    if edit == "deleted":
        (repo / "a.py").unlink()
    else:
        (repo / "a.py").write_text("x = 3\n")
    if edit == "staged":
        _git(repo, "add", "a.py")
    assert provenance.git_commit() == f"{head}-dirty"


def test_a_named_older_commit_under_a_newer_head_is_dirty(repo, monkeypatch):
    """A copy whose .git is ahead of (or behind) the commit it was named: the tree is
    compared with the named commit, not with HEAD."""
    first = _git(repo, "rev-parse", "--short=12", "HEAD")
    (repo / "a.py").write_text("x = 4\n")
    _git(repo, "commit", "-qam", "two")
    monkeypatch.setenv("ROPE_STUDY_COMMIT", first)
    assert provenance.git_commit() == f"{first}-dirty"
    _git(repo, "checkout", "-q", first)
    assert provenance.git_commit() == first


def test_a_commit_this_git_does_not_hold_or_no_checkout_keeps_the_name(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("ROPE_STUDY_COMMIT", "0123456789ab")
    assert provenance.git_commit() == "0123456789ab"
    bare = (tmp_path / "copy").resolve()
    bare.mkdir()
    monkeypatch.setattr(provenance, "REPO_ROOT", bare)
    assert provenance.git_commit() == "0123456789ab"
    monkeypatch.delenv("ROPE_STUDY_COMMIT")
    assert provenance.git_commit() == "unknown"


def test_a_copy_inside_another_repository_does_not_take_its_head(repo, monkeypatch):
    inner = repo / "sub" / "tree"
    inner.mkdir(parents=True)
    monkeypatch.setattr(provenance, "REPO_ROOT", inner)
    monkeypatch.setenv("ROPE_STUDY_COMMIT", "feedfacecafe")
    assert provenance.git_commit() == "feedfacecafe"
