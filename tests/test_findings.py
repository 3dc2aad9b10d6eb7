"""README.md's findings section is what the committed rows give (rope_kernels.study.findings),
and the generator adapts to the files, columns and variants a run wrote."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from rope_kernels.study import findings as F
from rope_kernels.study import targets as T
from rope_kernels.study.devices import REPO_ROOT

DATA = REPO_ROOT / "data" / F.DEVICE


def _registry_gap(folder) -> list[str]:
    """Variants whose in-place-ness neither the rows nor this machine's registry know
    (old rows without an ``in_place`` column on a machine without the peers' files)."""
    micro = T.load_tables(folder)["microbench"]
    if micro.empty or "in_place" in micro.columns:
        return []
    return [v for v in sorted(set(micro["variant"])) if T.in_place(micro, v) is None]


def test_readme_findings_are_what_the_committed_rows_give():
    gap = _registry_gap(DATA)
    if gap:
        pytest.skip(f"rows lack in_place and this registry lacks {gap}: python -m rope_kernels peers fetch")
    committed = F.readme_section((REPO_ROOT / "README.md").read_text())
    generated = F.render_findings(DATA)
    assert committed == generated, ("README.md's findings differ from data/" + F.DEVICE
                                    + "; run: python -m rope_kernels findings --write")


def test_a_changed_row_changes_the_findings(tmp_path):
    """The comparison above can fail: one fused time changed, the findings change."""
    if _registry_gap(DATA):
        pytest.skip("registry lacks peers")
    copy = tmp_path / F.DEVICE
    shutil.copytree(DATA, copy)
    micro = pd.read_csv(copy / "microbench.csv")
    hit = ((micro.variant == "fused") & (micro.tokens == 87616) & (micro.heads == 16)
           & (micro.head_dim == 72) & (micro["mode"] == "cudagraph"))
    if "rotation" in micro:  # Kimi's rows (Qwen2.5-VL's 16 images are 87,616 tokens of 16 x 80)
        hit &= micro["rotation"].fillna("pairs") == "pairs"
    assert hit.sum() == 1
    micro.loc[hit, "median_us"] *= 1.1
    micro.to_csv(copy / "microbench.csv", index=False)
    assert F.render_findings(copy) != F.render_findings(DATA)


def _micro(variants: dict[str, tuple[float, bool, str]]) -> pd.DataFrame:
    rows = []
    for mode in ("cudagraph", "cudagraph_warm"):
        for t, h in [(t, h) for h in T.KIMI_HEADS for t in T.KIMI_TOKENS]:
            for v, (us, place, pkg) in variants.items():
                rows.append({"variant": v, "tokens": t, "heads": h, "head_dim": 72, "dtype": "bfloat16",
                             "mode": mode, "median_us": us * t / 5476 * h / 16, "bytes": 8 * t * h * 72,
                             # no spread: the targets' noise rule judges these medians alone
                             "p20_us": us * t / 5476 * h / 16, "p80_us": us * t / 5476 * h / 16,
                             "copy_ceiling_gbps": 4000.0, "in_place": place, "peer_package": pkg or None,
                             "peer_version": "1.0" if pkg else None, "peer_sha256": "ab" * 32 if pkg else None,
                             "device_name": "GPU X", "torch_version": "2.99", "triton_version": "9.9",
                             "git_commit": "c0ffee"})
    return pd.DataFrame(rows)


def test_new_peers_files_and_columns_are_reported(tmp_path):
    dev = tmp_path / "gpu-x"
    dev.mkdir()
    _micro({"native": (100.0, False, ""), "fused": (10.0, False, ""), "fused_inplace": (10.5, True, ""),
            "flashinfer": (21.0, True, "flashinfer-python"), "quack_qkv": (11.0, True, "quack-kernels"),
            "brand_new_peer": (30.0, False, "newpkg")}).to_csv(dev / "microbench.csv", index=False)
    enc = []
    for mode in ("cudagraph", "eager"):
        for v, ms in (("native", 100.0), ("fused", 92.0), ("fused_inplace", 92.5), ("flashinfer", 95.0),
                      ("none", 90.0)):
            enc.append({"variant": v, "resolution": "1024x1024", "images": 16, "vit_tokens": 87616,
                        "mode": mode, "median_ms": ms, "samples": 3, "layers": 27, "encoder": "kimi_k25",
                        "copy_ceiling_gbps": 4000.0, "in_place": v in ("fused_inplace", "flashinfer"),
                        "paired_saving_pct": 100 * (100 - ms) / 100, "paired_saving_pct_p20": 0.0,
                        "paired_saving_pct_p80": 9.0, "profiled_rope_device_ms": 6.0,
                        "round_ms": ";".join(str(ms + d) for d in (0.0, 0.1, -0.1)),
                        "device_name": "GPU X", "git_commit": "c0ffee"})
    pd.DataFrame(enc).to_csv(dev / "encoder_latency.csv", index=False)
    qkv = [{"variant": v, "tokens": t, "mode": "cudagraph", "median_us": us * t / 21904}
           for t in T.QKV_TOKENS for v, us in (("cublas_linear", 280.0), ("cublas_linear+fused_rope", 340.0),
                                               ("qkv_rope_linear", 400.0), ("quack_gemm_rope", 304.0))]
    pd.DataFrame(qkv).to_csv(dev / "qkv_gemm.csv", index=False)
    text = F.render_findings(dev)
    assert "## Findings on GPU X" in text and "`c0ffee`" in text
    assert "FlashInfer / `fused_inplace` | " in text and "`brand_new_peer` / `fused`" in text
    assert "2.00x" in text  # flashinfer 21 us over fused_inplace 10.5 us
    assert "`encoder_latency.csv`" in text and "flashinfer" in text.split("Vision encoder")[1]
    assert "`quack_gemm_rope` [us]" in text and "(1.21x)" in text  # 340 / 280
    absent = text.split("Not measured in these rows:")[1].split("\n")[0]
    assert "`sglang_kimi_k25`" in absent and "`vllm_packed_qk`" in absent and "`flashinfer`" not in absent
    assert "from 1 commit" not in text and "not one run" not in text
    assert "lack per-round times" not in text and "no `in_place` column" not in text
    verdicts = T.summarize(T.evaluate(T.load_tables(dev))).set_index("target")["verdict"]
    assert verdicts["kimi_1.05x_flashinfer"] == "met" and verdicts["kimi_1.05x_quack_qkv"] == "missed"  # 1.048x
    assert verdicts["qkv_vs_cublas_fused_rope"] == "missed"
    assert verdicts["encoder_vs_vllm"] == "not measured"


def test_absent_tables_read_not_measured(tmp_path):
    dev = tmp_path / "gpu-y"
    dev.mkdir()
    _micro({"native": (100.0, False, ""), "fused": (10.0, False, "")}).to_csv(dev / "microbench.csv", index=False)
    text = F.render_findings(dev)
    assert "**Vision encoder:** not measured." in text
    assert "not measured in these rows (no `qkv_gemm.csv`)" in text
    assert "Launches per call: not measured." in text


def test_write_replaces_only_the_marked_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\nbefore\n{F.FINDINGS_BEGIN}\nold\n{F.FINDINGS_END}\n\nafter\n")
    assert F.write_readme(readme, "new 1.23x\n")
    assert readme.read_text() == f"# t\n\nbefore\n{F.FINDINGS_BEGIN}\nnew 1.23x\n{F.FINDINGS_END}\n\nafter\n"
    assert not F.write_readme(readme, "new 1.23x\n")  # unchanged: not rewritten
    assert F.readme_section(readme.read_text()) == "new 1.23x\n"
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="markers"):
        F.write_readme(readme, "x\n")
    assert list(tmp_path.iterdir()) == [readme]  # no temporary file left


def test_cli_check_fails_on_a_stale_readme(tmp_path, capsys):
    from rope_kernels.__main__ import main

    dev = tmp_path / "data" / "gpu-z"
    dev.mkdir(parents=True)
    _micro({"native": (100.0, False, ""), "fused": (10.0, False, "")}).to_csv(dev / "microbench.csv", index=False)
    readme = tmp_path / "README.md"
    readme.write_text(f"{F.FINDINGS_BEGIN}\nstale 9.99x\n{F.FINDINGS_END}\n")
    args = ["findings", "--data-root", str(tmp_path / "data"), "--device", "gpu-z", "--readme", str(readme)]
    assert main(args + ["--check"]) == 1 and "differ" in capsys.readouterr().err
    assert main(args + ["--write"]) == 0
    assert main(args + ["--check"]) == 0
    assert main(["findings", "--data-root", str(tmp_path / "data"), "--device", "absent"]) == 2


def test_span():
    assert F.span([1.0, 2.0]) == "1.00-2.00"
    assert F.span([1.001, 1.004]) == "1.00"
    assert F.span([float("nan")]) == "-"


def test_rows_beating_the_same_bytes_copy_are_reported(tmp_path):
    dev = tmp_path / "gpu-c"
    dev.mkdir()
    micro = _micro({"native": (100.0, False, ""), "fused": (10.0, False, "")})
    micro["same_bytes_copy_us"] = micro["median_us"] * 0.9
    micro["pct_of_same_bytes_copy"] = 90.0
    micro.loc[0, "pct_of_same_bytes_copy"] = 104.0
    micro.to_csv(dev / "microbench.csv", index=False)
    text = F.render_findings(dev)
    assert f"1 of {2 * len(T.KIMI_SHAPES)} cold rows beat the same-bytes copy by more than 3%" in text
    assert "fused runs at 90% of its speed" in text
    assert "These rows do not record the copy's own p20-p80." in text
    # with the copy's band: beyond both bands only where the row's p80 is under its p20
    micro["same_bytes_copy_p20_us"] = micro["median_us"] * 0.95
    micro["same_bytes_copy_p80_us"] = micro["median_us"] * 1.05
    micro.loc[0, "p80_us"] = micro.loc[0, "median_us"] * 0.99  # overlaps the copy's band
    micro.to_csv(dev / "microbench.csv", index=False)
    assert "Of them 0 beyond both noise bands" in F.render_findings(dev)
    micro.loc[0, "p80_us"] = micro.loc[0, "median_us"] * 0.9
    micro.to_csv(dev / "microbench.csv", index=False)
    assert "Of them 1 beyond both noise bands (the row's p80 under the copy's p20), 0 within them." \
        in F.render_findings(dev)


def test_rows_without_cold_kimi_shapes_say_not_measured(tmp_path):
    dev = tmp_path / "gpu-e"
    dev.mkdir()
    micro = _micro({"native": (100.0, False, ""), "fused": (10.0, False, "")})
    micro[micro["mode"] == "cudagraph"].assign(mode="eager").to_csv(  # one row per key
        dev / "microbench.csv", index=False)
    text = F.render_findings(dev)
    assert "**Roofline:** not measured" in text and "-%" not in text
    assert "**Kernel alone:** not measured" in text


def test_a_peer_refusing_a_head_dim_is_a_caveat_with_its_reason():
    """FlashInfer 0.7.4 refuses head_dim 72: the findings say so, with the reason the
    correctness rows carry; supported rows and other dtypes add no line."""
    from rope_kernels.study.findings import _refused_shapes

    rows = pd.DataFrame([
        {"variant": "flashinfer", "head_dim": 72, "dtype": "bfloat16", "supported": False,
         "reason": "flashinfer 0.7.4 cannot rotate head_dim 72 in bfloat16: overrun."},
        {"variant": "flashinfer", "head_dim": 72, "dtype": "float32", "supported": False,
         "reason": "flashinfer supports bfloat16, float16 only"},
        {"variant": "flashinfer", "head_dim": 128, "dtype": "bfloat16", "supported": True,
         "reason": ""},
        {"variant": "fused", "head_dim": 72, "dtype": "bfloat16", "supported": True, "reason": ""}])
    assert _refused_shapes(rows) == [
        "- `flashinfer` has no rows at head_dim 72 (bf16): flashinfer 0.7.4 cannot rotate "
        "head_dim 72 in bfloat16: overrun."]
    assert _refused_shapes(rows[rows["supported"].astype(bool)]) == []
    assert _refused_shapes(pd.DataFrame()) == []


def test_peer_rows_of_the_qkv_gemm_without_provenance_are_a_caveat():
    from rope_kernels.study.findings import caveats_section

    qkv = pd.DataFrame([{"variant": "quack_gemm_rope", "median_us": 10.0},
                        {"variant": "quack_gemm", "median_us": float("nan")},
                        {"variant": "cublas_linear", "median_us": 9.0}])
    said = "\n".join(caveats_section({"qkv_gemm": qkv}))
    assert "1 QuACK rows of `qkv_gemm.csv` name no package version" in said
    named = qkv.assign(peer_sha256=["f" * 64, None, None])
    assert "QuACK rows" not in "\n".join(caveats_section({"qkv_gemm": named}))


def test_qkv_lines_name_the_config_and_split_mainloop_from_rotation():
    from rope_kernels.study.findings import qkv_section

    rows = [("cublas_linear", None, 100.0), ("qkv_rope_linear", "A/flat", 130.0),
            ("qkv_gemm_rotation_compiled_out", "A/flat", 104.0)]
    qkv = pd.DataFrame([{"variant": v, "tokens": 21904, "mode": "cudagraph", "config": c,
                         "median_us": us} for v, c, us in rows])
    text = "\n".join(qkv_section({"qkv_gemm": qkv}))
    assert "21,904 tokens `A/flat`: mainloop and store 104.0 us (1.04x cuBLAS), the rotation +25.0%" in text
    # a compiled-out row of another config is not a split of this one: no line
    other = qkv.assign(config=["", "A/flat", "B"])
    assert "mainloop and store" not in "\n".join(qkv_section({"qkv_gemm": other}))
    # the angles kernel at the same config: its rotation's share too; at another, not
    angles = pd.concat([qkv, pd.DataFrame([{"variant": "qkv_rope_linear_angles", "tokens": 21904,
                                            "mode": "cudagraph", "config": "A/flat",
                                            "median_us": 114.4}])])
    text = "\n".join(qkv_section({"qkv_gemm": angles}))
    assert ("the rotation +25.0% from the table (`qkv_rope_linear`), +10.0% with the angles "
            "computed in-kernel (`qkv_rope_linear_angles`)" in text)
    angles.loc[angles.variant == "qkv_rope_linear_angles", "config"] = "B"
    assert "in-kernel (`qkv" not in "\n".join(qkv_section({"qkv_gemm": angles}))
    # each kernel at its own best: the split follows the compiled-out row's config (the
    # angles kernel's, the faster), the table kernel's share is left out at another
    own = angles.copy()
    own.loc[own.variant == "qkv_gemm_rotation_compiled_out", "config"] = "B"
    text = "\n".join(qkv_section({"qkv_gemm": own}))
    assert ("21,904 tokens `B`: mainloop and store 104.0 us (1.04x cuBLAS), the rotation +10.0% "
            "with the angles computed in-kernel" in text)
    assert "from the table (`qkv_rope_linear`)" not in text


def test_a_gemm_epilogue_under_the_floor_is_said_to_owe_it_to_its_gemm():
    from rope_kernels.study.findings import _below_floor

    enc = pd.DataFrame([{"variant": v, "mode": m, "median_ms": ms}
                        for m in ("cudagraph", "eager")
                        for v, ms in (("none", 100.0), ("gemm_epilogue_cute", 99.0), ("gemm_epilogue", 101.0))])
    qkv = pd.DataFrame([{"variant": v, "tokens": t, "mode": "cudagraph", "median_us": us}
                        for t, rows in ((21904, (("cublas_linear", 100.0), ("qkv_rope_linear_cute", 95.0))),
                                        (87616, (("cublas_linear", 400.0), ("qkv_rope_linear_cute", 376.0))))
                        for v, us in rows])
    text = "\n".join(_below_floor(enc, qkv))
    assert "`gemm_epilogue_cute` runs under the RoPE-free floor" in text
    assert "99.0 vs 100.0 ms with CUDA graphs and 99.0 vs 100.0 ms eager" in text
    assert "0.94-0.95x cuBLAS's time alone" in text
    assert "`gemm_epilogue` runs" not in text  # above the floor: nothing to explain
    # without QKV rows the line still stands, without the GEMM's ratio
    assert "cuBLAS's time alone" not in "\n".join(_below_floor(enc, pd.DataFrame()))
    # at or above the floor in both modes: no line
    assert _below_floor(enc.assign(median_ms=100.0), qkv) == []


def test_readme_compile_block_is_what_the_committed_matrix_gives():
    """The ROCm section's register budgets are generated from data/compile/compile_matrix.csv."""
    from rope_kernels.bench import compile_matrix as C
    from rope_kernels.study import summaries
    from rope_kernels.study.results import read_table

    readme = (REPO_ROOT / "README.md").read_text()
    committed = summaries.readme_summary(readme, C.README_BEGIN, C.README_END)
    assert committed == C.readme_block(read_table(C.COMPILE_MATRIX_CSV)), (
        "README.md's compile block differs from data/compile/compile_matrix.csv; "
        "run: python -m rope_kernels findings --write")


def test_a_changed_compile_row_changes_the_block_and_check_fails(tmp_path, capsys):
    """One spilling fused compile, one more register: the paragraph says so, --check fails, --write mends."""
    from rope_kernels.__main__ import main
    from rope_kernels.bench import compile_matrix as C

    table = pd.read_csv(C.COMPILE_MATRIX_CSV)
    fused_sm90 = (table["kernel"] == "fused") & (table["target"] == "sm_90")
    row = table.index[fused_sm90][0]
    table.loc[row, "spills"] = True
    table.loc[table["kernel"] == "vllm_merged_recreated", "registers"] = 77
    text = C.readme_block(table)
    assert text != C.readme_block(pd.read_csv(C.COMPILE_MATRIX_CSV))
    assert "spills in 1 of" in text and "merged-path kernel 77 registers" in text
    table.loc[row, "compiled"] = False
    assert "1 failed compile(s)" in C.readme_block(table)

    (tmp_path / "data" / "compile").mkdir(parents=True)
    dev = tmp_path / "data" / "gpu-z"
    dev.mkdir()
    _micro({"native": (100.0, False, ""), "fused": (10.0, False, "")}).to_csv(dev / "microbench.csv", index=False)
    pd.read_csv(C.COMPILE_MATRIX_CSV).to_csv(tmp_path / "data" / "compile" / "compile_matrix.csv", index=False)
    readme = tmp_path / "README.md"
    readme.write_text(f"{F.FINDINGS_BEGIN}\n{F.FINDINGS_END}\n\n{C.README_BEGIN}\nstale 26-34 VGPRs\n{C.README_END}\n")
    args = ["findings", "--data-root", str(tmp_path / "data"), "--device", "gpu-z", "--readme", str(readme)]
    assert main(args + ["--write"]) == 0
    assert main(args + ["--check"]) == 0
    assert "stale" not in readme.read_text() and "VGPRs" in readme.read_text()
    readme.write_text(readme.read_text().replace("VGPRs", "vgprs", 1))
    assert main(args + ["--check"]) == 1 and "differ" in capsys.readouterr().err
