"""Every project kernel compiles for AMD gfx942/gfx90a and NVIDIA sm_90/sm_100
with Triton's real compiler, on this GPU-less machine (a subprocess with the
interpreter off), and a kernel that cannot compile makes the matrix fail."""

import textwrap

import pandas as pd
import pytest

from rope_kernels.bench.compile_matrix import KERNELS, TARGETS, write_compile_matrix

pytestmark = pytest.mark.compile_matrix


def test_every_kernel_compiles_for_every_target(tmp_path):
    table = write_compile_matrix(tmp_path / "compile_matrix.csv")
    assert table["compiled"].all()
    assert set(table["kernel"]) == {k.name for k in KERNELS}
    assert set(table["target"]) == {t.label for t in TARGETS} == {"gfx942", "gfx90a", "sm_90",
                                                                  "sm_100"}
    fused = table[table["kernel"] == "fused"]
    assert set(fused["head_dim"]) == {72, 80, 128}
    assert set(fused["dtype"]) == {"bfloat16", "float16", "float32"}
    # Every cell of the matrix is there once, with what the assembler reported.
    cells = table.groupby(["kernel", "heads", "head_dim", "dtype", "target"]).size()
    assert (cells == 1).all()
    # every target of its backends (the rotate-half QKV GEMM: one entry per vendor's config)
    backends = {k.name: set(k.backends) for k in KERNELS}
    per_target = {t.label: t.backend for t in TARGETS}
    shapes = table.drop_duplicates(["kernel", "heads", "head_dim", "dtype"])
    assert len(cells) == sum(sum(b in backends[k] for b in per_target.values())
                             for k in shapes["kernel"])
    assert set(table.loc[table["kernel"] == "qkv_gemm_half", "backend"]) == {"cuda"}
    assert set(table.loc[table["kernel"] == "qkv_gemm_half_amd", "backend"]) == {"hip"}
    # rotate-half: the halves layout and the QKV epilogue compile without a spill everywhere
    half = table[table["kernel"].isin(["fused_half", "qkv_gemm_half", "qkv_gemm_half_amd"])]
    assert len(half) and not half["spills"].any(), half[["kernel", "target", "registers"]]
    assert (table["registers"] > 0).all() and (table["binary_bytes"] > 0).all()
    amd = table[table["backend"] == "hip"]
    assert (amd["warp_size"] == 64).all() and (amd["binary"] == "hsaco").all()
    assert amd["waves_per_simd"].notna().all()
    assert (table.loc[table["backend"] == "cuda", "binary"] == "cubin").all()
    assert table["triton_version"].notna().all() and table["git_commit"].notna().all()
    # The QKV GEMM: TMA path (Hopper and newer) and pointer path (AMD), and on AMD its
    # operand buffers fit the 64 KB of LDS a workgroup may use on MI300X/MI250.
    assert {"qkv_gemm_tma", "qkv_gemm_pointers"} <= set(table["kernel"])
    qkv_amd = amd[amd["kernel"] == "qkv_gemm_pointers"]
    assert len(qkv_amd) == 2 and (qkv_amd["shared_bytes"] <= 64 * 1024).all()


BROKEN = '''
import torch
import triton
import triton.language as tl

from rope_kernels.bench.compile_matrix import KernelEntry


@triton.jit
def _broken_kernel(x_ptr, N: tl.constexpr):
    offs = tl.arange(0, N - 2)  # 6 lanes: Triton blocks must be powers of two
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2)


def launch(tokens, heads, head_dim, dtype):
    x = torch.empty(head_dim, dtype=dtype, device="meta")
    _broken_kernel[(1,)](x, N=head_dim)


KERNELS = (KernelEntry("broken", __name__, "_broken_kernel", launch, dtypes=("float32",),
                       heads_by_head_dim={8: (1,)}),)
'''


def test_a_kernel_that_does_not_compile_fails_the_matrix(tmp_path):
    (tmp_path / "broken_kernels.py").write_text(textwrap.dedent(BROKEN))
    csv = tmp_path / "compile_matrix.csv"
    with pytest.raises(RuntimeError, match=r"4 of 4 compiles failed"):
        write_compile_matrix(csv, entries="broken_kernels:KERNELS",
                             extra_env={"PYTHONPATH": str(tmp_path)})
    table = pd.read_csv(csv)
    assert not table["compiled"].any()
    assert table["error"].str.contains("power of 2").all(), table["error"].tolist()
