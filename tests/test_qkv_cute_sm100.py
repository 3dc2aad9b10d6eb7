"""Our CuTe DSL QKV kernel for Blackwell (kernels/qkv_cute_sm100.py): compiled for sm_100a on
this GPU-less machine, in a process whose CuTe DSL target is sm_100a. No sm_100 GPU has run
it: these tests prove that it compiles and what the binary holds, not its numbers."""

import os

import pytest

from rope_kernels.kernels import qkv_cute
from rope_kernels.kernels.qkv_cute_config import SMEM_BYTES, CuteQKVConfig

needs_cute = pytest.mark.skipif(not qkv_cute.available(),
                                reason="nvidia-cutlass-dsl (CuTe DSL) not installed")


def test_tmem_columns_are_a_power_of_two_holding_the_tile():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (CuTe DSL) not installed")
    from rope_kernels.kernels.qkv_cute_sm100_kernel import tmem_columns
    assert [tmem_columns(n) for n in (16, 32, 48, 128, 160, 192, 256)] == [32, 32, 64, 128, 256,
                                                                          256, 256]


@needs_cute
def test_compiles_for_sm100a_with_umma_tensor_memory_and_the_rotation():
    """Kimi's shape (16 heads x 72, hidden 1152), bf16, 192-column tiles: the cubin holds
    tcgen05 MMAs, tensor-memory loads (one per 64-column store subtile), TMA loads and stores,
    and with the rotation one SFU cos and one sin per column pair of the tile (96 pairs);
    with the rotation compiled out, none."""
    from rope_kernels.kernels import qkv_cute_sm100
    rot, norot = qkv_cute_sm100.compile_in_subprocess(["192x1", "192x1/norot"], 16, 72)
    for row in (rot, norot):
        assert row["error"] == "", row["error"]
        assert row["registers"] > 0 and row["scratch_bytes"] == 0
        assert row["tmem_columns"] == 256 and row["ab_stages"] == 4
        # 4 stages of (128 + 192) x 64 bf16 and two 128 x 64 store buffers fit the 227 KB
        assert (4 * 320 * 64 * 2 + 2 * 128 * 64 * 2 <= row["dynamic_shared_bytes"]
                <= SMEM_BYTES)
        counts = row["sass_counts"]
        assert counts["umma"] > 0 and counts["tmem_loads"] == 192 // 64
        assert counts["tma_loads"] > 0 and counts["tma_stores"] > 0
    assert rot["sass_counts"]["sfu_cos_sin"] == 2 * 96
    assert norot["sass_counts"]["sfu_cos_sin"] == 0


@needs_cute
def test_bias_is_an_operand_read_in_its_own_dtype_or_not_at_all():
    """As in the sm_90a kernel, the bias is the layer's own vector, an operand of the kernel
    (no table column): with a bf16 or fp32 bias the cubin loads it from global memory, and
    the kernel compiled without bias loads none of it (with the rotation compiled out, no
    global load is left; with it, the turns and positions alone). Failed before: the kernel
    read the bias from the columns 2 and 3 of ``rope_pair_table``, which no longer exists."""
    from rope_kernels.kernels import qkv_cute_sm100
    loads = {}
    for bias in ("bfloat16", "float32", None):
        rows = qkv_cute_sm100.compile_in_subprocess(["192x1", "192x1/norot"], 16, 72, bias=bias)
        for row in rows:
            assert row["error"] == "", row["error"]
            assert row["scratch_bytes"] == 0
        loads[bias] = [row["sass_counts"]["global_loads"] for row in rows]
    assert loads[None][1] == 0
    for bias in ("bfloat16", "float32"):
        assert loads[bias][0] > loads[None][0] > 0
        assert loads[bias][1] > 0
    with pytest.raises(ValueError, match="bias must be one of"):
        qkv_cute_sm100.compile_in_subprocess(["192x1"], 16, 72, bias="int8")


@needs_cute
def test_a_cluster_config_is_refused_saying_why():
    from rope_kernels.kernels import qkv_cute_sm100
    (row,) = qkv_cute_sm100.compile_in_subprocess(["192x2"], 16, 72)
    assert "cluster_m must be 1" in row["error"]


@needs_cute
def test_compiling_needs_a_process_targeting_sm100a(monkeypatch):
    import torch

    from rope_kernels.kernels import qkv_cute_sm100
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    t = torch.empty(1)
    with pytest.raises(RuntimeError, match="CUTE_DSL_ARCH=sm_100a"):
        qkv_cute_sm100.compile_kernel(CuteQKVConfig(cluster_m=1), t, t, t, t, None, t, 0)
    assert os.environ["CUTE_DSL_ARCH"] == "sm_90a"
