"""The notebook specs are the one contract: the notebooks' parameters cells, the
result files they write, and every parameter check of ``run`` and ``submit``
agree with them. Each bad value below used to pass validation and fail later
(mid-notebook, in every array task, or by growing past a gigabyte)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pandas as pd
import pytest

from rope_kernels.__main__ import main
from rope_kernels.infra import submit as sb
from rope_kernels.study.parameters import (MAX_YAML_BYTES, ParameterError, check_variants_run_here,
                                           load_profile, parse_override, resolve_parameters,
                                           study_parameters)
from rope_kernels.study.runner import notebook_parameters
from rope_kernels.study.specs import NOTEBOOKS, RESULT_FILES, SPECS, SUMMARY_NOTEBOOK
from rope_kernels.vocabulary import KNOWN_VARIANTS, resolution_tokens

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"


def _py_parameters(path: Path) -> dict:
    """The percent-format twin's parameters cell (the .py is what people edit)."""
    cells = re.split(r"^# %%", path.read_text(), flags=re.M)
    cell = next(c for c in cells if 'tags=["parameters"]' in c.splitlines()[0])
    body = "\n".join(cell.splitlines()[1:])
    return {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(body).body
            if isinstance(n, ast.Assign)}


def test_every_notebook_has_a_spec_and_every_spec_a_notebook():
    on_disk = sorted(p.stem for p in NB_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert on_disk == sorted(NOTEBOOKS)


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_parameters_cell_equals_the_spec(nb):
    """Names, order and default values: a parameter added, renamed or re-defaulted
    in a notebook (or its spec) alone fails here."""
    spec = SPECS[nb].defaults
    for got in (notebook_parameters(NB_DIR / f"{nb}.ipynb"), _py_parameters(NB_DIR / f"{nb}.py")):
        assert list(got) == list(spec), f"{nb}: cell {list(got)} vs spec {list(spec)}"
        assert got == spec
    for name, param in SPECS[nb].parameters.items():
        if param.rule is not None:  # a default the notebook ships must pass its own rule
            assert param.rule(param.default, "cpu") is None, (nb, name)


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebooks_write_only_declared_result_files(nb):
    """Every data file a notebook upserts (``Path(data_dir) / specs.<NAME>_CSV``) is in its
    spec and has a key in RESULT_FILES; a file name spelled out in the notebook is refused."""
    import rope_kernels.study.specs as specs_module

    text = (NB_DIR / f"{nb}.py").read_text()
    assert not re.findall(r'data_dir\) / "([\w.]+\.csv)"', text), f"{nb} spells a result file's name"
    written = {getattr(specs_module, name)
               for name in re.findall(r"data_dir\) / ([A-Z_]+_CSV)\b", text)}
    assert written == set(SPECS[nb].writes), nb
    assert set(SPECS[nb].writes) <= set(RESULT_FILES)
    assert SPECS[nb].delivers in ("", *SPECS[nb].writes)


def test_each_result_file_has_one_notebook_and_the_summary_runs_last():
    """A result file written by two notebooks (say qkv_gemm.csv by 02 and 05) would
    count one notebook's rows as another's submit shard delivering; the runner runs
    NOTEBOOKS in order and the summary reads every file, so it must come last."""
    writers: dict[str, list[str]] = {}
    for spec in SPECS.values():
        for name in spec.writes:
            writers.setdefault(name, []).append(spec.name)
    assert {f: nbs for f, nbs in writers.items() if len(nbs) > 1} == {}
    assert NOTEBOOKS[-1] == SUMMARY_NOTEBOOK


def _device_result_files() -> list[Path]:
    """Result CSVs of device folders (data/reference holds published figures,
    data/compile the compile matrix, rewritten whole; data/cpu is local only)."""
    return sorted(p for p in (ROOT / "data").glob("*/*.csv")
                  if p.parent.name not in ("reference", "compile", "cpu"))


@pytest.mark.parametrize("path", _device_result_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_result_files_are_declared_and_unique_by_key(path):
    """Every device CSV (qkv_gemm_configs.csv included) has a declared key that
    its rows hold and are unique by: a key missing a column that tells rows apart
    would make an upsert overwrite a different measurement."""
    # a file still under its former name (Table.formerly) is declared by its new one
    table = RESULT_FILES.get(path.name) or next(
        (t for t in RESULT_FILES.values() if path.name in t.formerly), None)
    assert table is not None, f"{path.name} has no entry in specs.RESULT_FILES"
    df = pd.read_csv(path, keep_default_na=False, dtype=str)
    df = df.rename(columns=table.renamed)
    # key columns an older file lacks must be declared added (they migrate: one value
    # for every old row, so the rest of the key must tell the rows apart)
    absent = [c for c in table.key if c not in df.columns]
    assert set(absent) <= set(table.added), set(absent) - set(table.added)
    key = [c for c in table.key if c in df.columns]
    assert not df.duplicated(key).any(), df[df.duplicated(key, keep=False)][key]


# -- parameters checked before anything runs, by run and submit alike ----------------

@pytest.mark.parametrize("override, match", [
    ("01_kernels.variants=[native, bogus]", "unknown variant 'bogus'"),
    ("02_microbench.variants=[fused, fused]", "more than once"),
    ("03_profile.variants=[3]", "unknown variant 3"),
    ("04_ttft.variants=[]", "04_ttft.variants must not be empty"),
    ("04_ttft.variants=[none, nonesuch]", "unknown variant 'nonesuch'"),
    ("02_microbench.variants=[gemm_epilogue]", "unknown variant 'gemm_epilogue'"),  # encoder only
    ("01_kernels.variants=[gemm_epilogue, nonesuch]", "unknown variant 'nonesuch'"),  # 01 checks encoder modes too
    ("04_ttft.max_tokens=1", "max_tokens=1 leaves no bucket"),
    ("qkv_tokens=[0]", "must hold ints >= 1"),
    ("qkv_compile_budget_s=-1", "must be >= 0"),
    ("prefill_tokens_per_s=-1", "must be >= 0"),
])
def test_bad_values_are_refused_for_every_device(override, match):
    for kind in ("cpu", "cuda"):
        with pytest.raises(ParameterError, match=re.escape(match)):
            resolve_parameters(list(NOTEBOOKS), None, [], [override], kind)


def test_max_tokens_check_uses_the_merged_values():
    one = resolution_tokens("56x56")  # vision tokens of one 56x56 image (Kimi's resize rule)
    ok = resolve_parameters(["04_ttft"], None, [], ["resolutions=['56x56']", "image_counts=[1]",
                                                    f"max_tokens={one}"], "cpu")
    assert ok["04_ttft"]["max_tokens"] == one
    with pytest.raises(ParameterError, match=f"has {one} vision tokens"):
        resolve_parameters(["04_ttft"], None, [], ["resolutions=['56x56']", "image_counts=[1]",
                                                   f"max_tokens={one - 1}"], "cpu")


def test_variants_known_here_pass_and_absent_peers_are_refused_with_their_reason():
    params = resolve_parameters(list(NOTEBOOKS), None, [],
                                ["variants=[native, fused]", "04_ttft.variants=[native, none]"],
                                "cpu")
    check_variants_run_here(params)  # ours run everywhere
    from rope_kernels.variants import absent_reason, registry

    absent = [n for n in KNOWN_VARIANTS if n not in registry()]
    if not absent:
        pytest.skip("every known variant runs on this machine")
    name = absent[0]
    params = resolve_parameters(["01_kernels"], None, [], [f"01_kernels.variants=[native, {name}]"],
                                "cpu")
    with pytest.raises(ParameterError, match=re.escape(f"{name} does not run here: "
                                                       f"{absent_reason(name)}")):
        check_variants_run_here(params)


def test_run_refuses_unknown_variants_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = sorted((ROOT / "reports").rglob("*")) if (ROOT / "reports").exists() else []
    assert main(["run", "--device", "cpu", "--only", "01", "-p",
                 "01_kernels.variants=[native, bogus]"]) == 2
    err = capsys.readouterr().err
    assert "unknown variant 'bogus'" in err and len(err.strip().splitlines()) == 1
    assert main(["run", "--device", "cpu", "--only", "04", "-p", "04_ttft.variants=[]"]) == 2
    after = sorted((ROOT / "reports").rglob("*")) if (ROOT / "reports").exists() else []
    assert before == after


ALIAS_BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"] +
                       [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, "
                        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]" for i in range(8)])


def test_yaml_alias_bomb_and_oversized_files_are_refused(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB + "\n")
    assert bomb.stat().st_size < 1024  # a few hundred bytes that expand to 9**9 items
    with pytest.raises(ParameterError, match="anchors and aliases are not accepted"):
        load_profile(bomb)
    with pytest.raises(ParameterError, match="anchors and aliases"):
        parse_override("shapes=[&s [1, 1, 8], *s]")
    big = tmp_path / "big.yaml"
    big.write_text("common:\n  progress: true\n" + "#" * MAX_YAML_BYTES + "\n")
    with pytest.raises(ParameterError, match="more than the"):
        load_profile(big)
    with pytest.raises(ParameterError, match="more than the"):
        parse_override("samples=" + "1" * (MAX_YAML_BYTES + 1))


def test_submit_resolves_with_the_partitions_device_kind(tmp_path):
    """A GPU-only mode on a CPU partition fails the submission, not every task; a
    bogus variant fails it too (the planner refuses what the runner would)."""
    with pytest.raises(ParameterError, match="cudagraph needs a GPU"):
        sb.plan_shards([sb.Partition("cpuq", "cpu")], overrides=["02_microbench.modes=[cudagraph]"])
    with pytest.raises(ParameterError, match="unknown variant 'bogus'"):
        sb.plan_shards([sb.Partition("h200", "cuda")], overrides=["variants=[native, bogus]"])
    # the same values on a cuda partition plan one task per family
    shards = sb.plan_shards([sb.Partition("h200", "cuda")], only=["02"],
                            overrides=["02_microbench.modes=[cudagraph]"])
    assert [s.notebook for s in shards] == ["02_microbench"] * len(
        study_parameters("cuda", root=ROOT, notebooks=["02_microbench"])["02_microbench"]["families"])
    assert all("02_microbench.config_sweep=false" in s.runner_args for s in shards[1:])
    assert "02_microbench.config_sweep=false" not in shards[0].runner_args

