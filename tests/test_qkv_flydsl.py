"""Our FlyDSL QKV GEMM with Kimi's RoPE epilogue (kernels/qkv_flydsl.py), compiled for AMD
gfx942 on this GPU-less machine (FlyDSL's compile-only mode, in a process of its own). No AMD
GPU has run it: these tests prove that it compiles and what the ISA holds, not its numbers."""

import os

import pytest

from rope_kernels.kernels import qkv_flydsl

_ok, _why = qkv_flydsl.availability()
# .ci/run installs FlyDSL and Debian's lld-19 and sets ROPE_REQUIRE_FLYDSL: there a missing
# toolchain is a failure, not a skip
if not _ok and os.environ.get("ROPE_REQUIRE_FLYDSL") == "1":
    raise RuntimeError(f"ROPE_REQUIRE_FLYDSL=1 but FlyDSL cannot compile here: {_why}")
needs_flydsl = pytest.mark.skipif(not _ok, reason=_why or "FlyDSL available")


@needs_flydsl
@pytest.mark.parametrize("heads", [16, 4])
def test_compiles_for_gfx942_with_mfma_and_one_sin_cos_per_pair(heads):
    """Kimi's 16 heads x 72 (3456 columns, 54 whole 64-column tiles) and 4 heads (864
    columns: a partial last tile). A lane's 4 x 2 x 2 accumulators hold 8 column pairs: 8
    v_sin_f32 and 8 v_cos_f32 (the angle in turns, no math library), bf16 MFMAs, no spills."""
    row = qkv_flydsl.compile_in_subprocess(heads, 72, tokens=300)
    assert row["isa_counts"]["mfma"] > 0
    assert row["isa_counts"]["sin"] == row["isa_counts"]["cos"] == 8
    assert row["registers"] > 0 and row["spilled_vgprs"] == row["spilled_sgprs"] == 0
    assert row["scratch_bytes"] == 0


@needs_flydsl
def test_bias_is_an_operand_read_in_its_own_dtype_or_not_at_all():
    """As in the CuTe kernels, the bias is the layer's own vector, an operand of the kernel
    read in its dtype (bf16 or fp32) and widened to fp32: with it the ISA holds more global
    loads (W and x come by buffer loads; the turns, positions and bias by global ones) than
    the kernel built without bias, which reads none of it; the rotation is the same (8 sin,
    8 cos a lane). Failed before: the kernel read the bias from the columns 2 and 3 of
    ``rope_pair_table``, which no longer exists."""
    rows = {b: qkv_flydsl.compile_in_subprocess(4, 72, tokens=300, bias=b)
            for b in ("bfloat16", "float32", None)}
    for row in rows.values():
        assert row["isa_counts"]["sin"] == row["isa_counts"]["cos"] == 8
        assert row["spilled_vgprs"] == row["spilled_sgprs"] == row["scratch_bytes"] == 0
    assert rows["bfloat16"]["isa_counts"]["global_loads"] > rows[None]["isa_counts"]["global_loads"]
    assert rows["float32"]["isa_counts"]["global_loads"] > rows[None]["isa_counts"]["global_loads"]
    with pytest.raises(ValueError, match="bias must be one of"):
        qkv_flydsl.compile_in_subprocess(4, 72, tokens=300, bias="int8")


def test_isa_resources_read_the_metadata_and_refuse_without_it():
    isa = ("    .sgpr_count:     36\n    .sgpr_spill_count: 0\n    .vgpr_count:     57\n"
           "    .vgpr_spill_count: 2\n    .private_segment_fixed_size: 16\n"
           "    .group_segment_fixed_size: 0\n  v_sin_f32 v1, v2\n  v_cos_f32 v3, v2\n"
           "  v_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]\n"
           "  global_load_dwordx2 v[4:5], v[6:7], off\n"
           "  buffer_load_ushort v8, v9, s[0:3], 0 offen\n")
    row = qkv_flydsl.isa_resources(isa)
    assert (row["registers"], row["sgprs"], row["spilled_vgprs"], row["scratch_bytes"]) == (57, 36, 2, 16)
    assert row["isa_counts"] == {"mfma": 1, "sin": 1, "cos": 1, "global_loads": 1}
    with pytest.raises(RuntimeError, match="no registers"):
        qkv_flydsl.isa_resources(isa.replace(".vgpr_count", ".vgprs"))


def test_availability_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(qkv_flydsl, "available", lambda: False)
    assert qkv_flydsl.availability() == (
        False, "flydsl==0.4.2 is not installed (pip install '.[rocm-compile]')")
    monkeypatch.setattr(qkv_flydsl, "available", lambda: True)
    monkeypatch.setattr(qkv_flydsl, "LLD_CANDIDATES", ("/nonexistent/ld.lld",))
    ok, why = qkv_flydsl.availability()
    assert not ok and "ld.lld" in why and "/nonexistent/ld.lld" in why


def test_compile_matrix_keeps_the_other_compilers_rows(tmp_path, monkeypatch, capsys):
    """`compile-matrix --only triton` rewrites Triton's rows and keeps the CuTe DSL and FlyDSL
    ones as they were; without FlyDSL, `--only flydsl-gfx942` fails before rewriting anything
    (both failed before: the Triton matrix replaced the file, the extra rows were lost)."""
    import pandas as pd

    from rope_kernels.__main__ import main
    from rope_kernels.bench import compile_matrix as C

    csv = tmp_path / "compile_matrix.csv"
    committed = C.COMPILE_MATRIX_CSV.read_text()
    csv.write_text(committed)
    full = pd.read_csv(csv)
    assert full["kernel"].isin(C.EXTRA_KERNELS).sum() == 3

    def triton_only(path):  # what write_compile_matrix writes: Triton's rows alone
        full[~full["kernel"].isin(C.EXTRA_KERNELS)].to_csv(path, index=False)

    monkeypatch.setattr(C, "write_compile_matrix", triton_only)
    assert main(["compile-matrix", "--only", "triton", "--out", str(csv)]) == 0
    assert csv.read_text() == committed

    monkeypatch.setattr(qkv_flydsl, "available", lambda: False)
    assert main(["compile-matrix", "--only", "flydsl-gfx942", "--out", str(csv)]) == 1
    assert "flydsl==0.4.2 is not installed" in capsys.readouterr().err
    assert csv.read_text() == committed
    assert main(["compile-matrix", "--only", "bogus", "--out", str(csv)]) == 2
