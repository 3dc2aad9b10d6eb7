"""Command-line input past what it can hold is one line naming it (issue 36 items 13,
15, 19, 20): a seed over 64 bits, YAML nested thousands deep, a 300-character submission
name, a time in non-ASCII digits, a submission of the summary alone."""

from __future__ import annotations

import pytest

from rope_kernels.__main__ import main
from rope_kernels.infra import submit as sb
from rope_kernels.study.parameters import ParameterError, parse_override, safe_yaml
from rope_kernels.study.runner import resolve_parameters
from rope_kernels.study.specs import NOTEBOOKS, SPECS


def test_several_bad_parameters_are_counted_one_a_line():
    """Every bad value is named, not only the first (parameters._raise_all)."""
    with pytest.raises(ParameterError, match=r"^2 invalid parameters:\n  -p 01_kernels\.seed=-1: "
                                             r".*\n  -p 04_ttft\.seed=-1: "):
        resolve_parameters(["01_kernels", "04_ttft"], SPECS, [],
                           ["01_kernels.seed=-1", "04_ttft.seed=-1"], "cpu")


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rope-study: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("nb", ["01_kernels", "04_ttft"])
@pytest.mark.parametrize("seed", [2**64, 2**63, -1, 10**30])
def test_a_seed_beyond_64_bits_is_refused_before_the_notebook_starts(nb, seed):
    with pytest.raises(ParameterError, match=f"{nb}.seed must be an int from 0 to 2\\*\\*63 - 1"):
        resolve_parameters([nb], SPECS, [], [f"{nb}.seed={seed}"], "cpu")


@pytest.mark.parametrize("seed", [0, 2**63 - 1, 12345])
def test_seeds_in_range_are_accepted(seed):
    r = resolve_parameters(["01_kernels"], SPECS, [], [f"seed={seed}"], "cpu")
    assert r["01_kernels"]["seed"] == seed


def test_the_seed_is_refused_on_the_command_line(capsys):
    err = _one_line_error(capsys, ["run", "--device", "cpu", "--only", "01", "-p",
                                   f"seed={2**64}"])
    assert "seed" in err and "64-bit" in err


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "{a: " * 5000 + "1" + "}" * 5000,
                                  "- " * 40 + "1", "[" * 33 + "]" * 33])
def test_deep_yaml_is_one_line_not_a_recursion_error(text):
    with pytest.raises(ParameterError, match="nested more than 32 levels"):
        safe_yaml(text, "-p x")


def test_nesting_that_parameters_use_is_accepted():
    assert safe_yaml("[[1, 2, 3], [4, 5, 6]]", "-p x") == [[1, 2, 3], [4, 5, 6]]
    assert safe_yaml("[" * 32 + "]" * 32, "-p x") is not None


def test_deep_yaml_on_the_command_line_and_in_a_file(tmp_path, capsys):
    with pytest.raises(ParameterError, match="-p shapes: YAML nested"):
        parse_override("shapes=" + "[" * 5000 + "]" * 5000)
    err = _one_line_error(capsys, ["run", "--device", "cpu", "-p", "shapes=" + "[" * 5000 + "]" * 5000])
    assert "nested" in err
    path = tmp_path / "p.yaml"
    path.write_text("common: " + "[" * 5000 + "]" * 5000 + "\n")
    err = _one_line_error(capsys, ["run", "--device", "cpu", "--params", str(path)])
    assert "nested" in err and str(path) in err


# -- submit -----------------------------------------------------------------------------
def test_a_long_submission_name_is_one_line(capsys):
    err = _one_line_error(capsys, ["submit", "--partition", "h200", "--only", "02",
                                   "--name", "x" * 300, "--dry-run"])
    assert "--name is 300 characters long" in err
    for option in ("--job-name", "--partition"):
        value = "y" * 300
        argv = ["submit", "--partition", value if option == "--partition" else "h200",
                "--only", "02", "--dry-run"] + ([option, value] if option != "--partition" else [])
        assert "300 characters" in _one_line_error(capsys, argv)


def test_a_name_at_the_limit_is_accepted():
    assert sb.check_name("--name", "n" * sb.MAX_NAME_CHARS) == "n" * sb.MAX_NAME_CHARS
    with pytest.raises(ParameterError):
        sb.check_name("--name", "n" * (sb.MAX_NAME_CHARS + 1))


@pytest.mark.parametrize("only", [["06"], ["06_summary"], ["06", "06"]])
def test_submitting_the_summary_alone_is_refused(capsys, only):
    argv = ["submit", "--partition", "h200", "--dry-run"]
    for o in only:
        argv += ["--only", o]
    err = _one_line_error(capsys, argv)
    assert "plans no shard" in err
    with pytest.raises(ParameterError, match="plans no shard"):
        sb.plan_shards([sb.Partition.parse("h200")], only=only)


def test_the_summary_beside_a_measuring_notebook_still_plans(capsys):
    shards = sb.plan_shards([sb.Partition.parse("h200")], only=["01", "06"])
    assert shards and {s.notebook for s in shards} == {"01_kernels"}


@pytest.mark.parametrize("time", ["٣٠", "１:00:00", "1-٢", "00:٥9", "৩০"])
def test_a_time_in_non_ascii_digits_is_refused(capsys, time):
    err = _one_line_error(capsys, ["submit", "--partition", "h200", "--time", time, "--dry-run"])
    assert "is not a Slurm time" in err
    with pytest.raises(ParameterError):
        sb.check_time("--time", time)


@pytest.mark.parametrize("time", ["30", "1:00:00", "1-12", "2-00:30:00", "UNLIMITED"])
def test_slurm_times_are_accepted(time):
    assert sb.check_time("--time", time) == time


def test_every_notebook_with_a_seed_checks_it():
    seeded = [nb for nb in NOTEBOOKS if "seed" in SPECS[nb].parameters]
    assert seeded and all(SPECS[nb].parameters["seed"].rule is not None for nb in seeded)


@pytest.mark.parametrize("device", ["../outside", "ABS", "nvidia-h200/../../outside", ".", "..",
                                    "sub/folder", "link"])
def test_ttft_writes_only_into_a_folder_under_the_data_root(device, tmp_path, capsys):
    """Issue 47 item 5: ``ttft --device ../../x --write`` (or an absolute path) wrote
    time_to_first_token.csv outside data/; --device names one folder under it."""
    import shutil

    from rope_kernels.study.devices import REPO_ROOT

    root, outside = tmp_path / "data", tmp_path / "outside"
    for folder in (root / "nvidia-h200", root / "sub" / "folder", outside):
        folder.mkdir(parents=True)
        shutil.copy(REPO_ROOT / "data" / "nvidia-h200" / "encoder_latency.csv", folder)
    (root / "link").symlink_to(outside)
    device = str(outside) if device == "ABS" else device
    err = _one_line_error(capsys, ["ttft", "--data-root", str(root), "--device", device,
                                   "--prefill", "hand", "--images", "1", "--write"])
    assert "--device must name a folder under" in err and repr(device) in err
    assert sorted(p.name for p in outside.iterdir()) == ["encoder_latency.csv"]
    assert not (root / "sub" / "folder" / "time_to_first_token.csv").exists()


def test_ttft_writes_into_a_device_folder(tmp_path, capsys):
    import shutil

    from rope_kernels.study.devices import REPO_ROOT

    (tmp_path / "nvidia-h200").mkdir()
    shutil.copy(REPO_ROOT / "data" / "nvidia-h200" / "encoder_latency.csv", tmp_path / "nvidia-h200")
    assert main(["ttft", "--data-root", str(tmp_path), "--device", "nvidia-h200", "--prefill", "hand",
                 "--images", "1", "--write"]) == 0
    assert (tmp_path / "nvidia-h200" / "time_to_first_token.csv").stat().st_size > 0
