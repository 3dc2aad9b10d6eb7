"""Exploration configs of our QKV kernels: what ``tools/qkv_sweep.py`` (and
``tools/qkv_power.py``) time on a GPU and ``compile_matrix.qkv_sweep_entries`` compiles.
Not the study's: notebook 05 times each kernel at its one default
(``qkv_gemm.qkv_gemm_config``, ``qkv_cute.CuteQKVConfig()``); what decided those
defaults, and what was tried and dropped, is in docs/DECISIONS.md.
"""

from __future__ import annotations

from rope_kernels.kernels.qkv_cute import CuteQKVConfig
from rope_kernels.kernels.qkv_gemm import NVIDIA_ANGLES_CONFIG, NVIDIA_TABLE_CONFIG, QKVGemmConfig

# The Triton kernel's four configs of the committed sweep (data/nvidia-h200/
# qkv_gemm_sweep.csv): the two defaults and their two rivals.
QKV_CANDIDATE_CONFIGS = (
    NVIDIA_TABLE_CONFIG,
    NVIDIA_ANGLES_CONFIG,
    QKVGemmConfig(persistent=True, programs_per_sm=2, epilogue_parts=4),
    QKVGemmConfig(block_n=256, num_warps=8, persistent=True, epilogue_parts=8),
)

# The candidates and their neighbours: one program per tile or persistent, one or two
# programs per SM, 128- or 256-wide tiles, the epilogue whole or in parts, 2-4 stages.
QKV_SWEEP_CONFIGS = tuple(dict.fromkeys(QKV_CANDIDATE_CONFIGS + (
    QKVGemmConfig(block_n=256, num_warps=8, epilogue_parts=8),
    QKVGemmConfig(block_n=256, num_warps=8, num_stages=4, persistent=True, epilogue_parts=8),
    QKVGemmConfig(block_n=256, num_warps=8, num_stages=4, epilogue_parts=8),
    QKVGemmConfig(num_warps=8, epilogue_parts=8),
    QKVGemmConfig(epilogue_parts=8),
    QKVGemmConfig(num_warps=8, persistent=True, epilogue_parts=8),
    QKVGemmConfig(persistent=True, programs_per_sm=2, epilogue_parts=8),
    QKVGemmConfig(block_m=64, block_n=256, num_stages=2, epilogue_parts=8),
    QKVGemmConfig(num_stages=2, persistent=True, programs_per_sm=2),
    QKVGemmConfig(epilogue_parts=4),
    QKVGemmConfig(epilogue_parts=2),
    QKVGemmConfig(group_m=16),
    QKVGemmConfig(group_m=4, persistent=True, programs_per_sm=2, epilogue_parts=8),
)))

# Our CuTe kernel's three configs of the committed sweep (the default first).
CUTE_CANDIDATE_CONFIGS = (CuteQKVConfig(), CuteQKVConfig(epi_n=32), CuteQKVConfig(tile_n=160))
