"""Every Triton kernel the project owns, compiled ahead of time for GPUs this
machine does not have: AMD MI300X (gfx942) and MI250 (gfx90a), NVIDIA H100/H200
(sm_90) and B200 (sm_100).

What this proves: Triton's own compiler (``triton.compile``, the same passes a
launch on that GPU runs) accepts each kernel for each target and yields a
binary (hsaco or cubin), with the register count, spills, scratch and shared
memory the target's assembler reports. What it does not prove: that the binary
computes the right numbers or how fast it runs there; that needs the GPU.

Each kernel is compiled with exactly the arguments its launcher passes: the
launcher is called on ``meta`` tensors (shapes, strides and alignment, no
data) with the kernel swapped for a recorder, and Triton's own binder turns the
recorded call into the signature, constexprs and specialisations (16-byte
divisibility) a real launch would compile. So the launch config is the one the
launcher's heuristic picks, and a launcher change is compiled as it launches.

The compiler only exists outside the interpreter; ``rope_kernels`` turns the
interpreter on for CPU machines, so ``write_compile_matrix`` runs the work in a
subprocess with ``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pandas as pd
import torch

from rope_kernels.provenance import REPO_ROOT

COMPILE_MATRIX_CSV = REPO_ROOT / "data" / "compile" / "compile_matrix.csv"


@dataclass(frozen=True)
class Target:
    """A GPU architecture Triton can compile for without the GPU present."""

    backend: str  # "hip" | "cuda"
    arch: str | int  # "gfx942" | 90
    warp_size: int
    gpus: str  # which GPUs it stands for, for the reader

    @property
    def label(self) -> str:
        return self.arch if self.backend == "hip" else f"sm_{self.arch}"


TARGETS = (
    Target("hip", "gfx942", 64, "AMD MI300X / MI300A / MI325X"),
    Target("hip", "gfx90a", 64, "AMD MI250X / MI210"),
    Target("cuda", 90, 32, "NVIDIA H100 / H200"),
    Target("cuda", 100, 32, "NVIDIA B200 / GB200"),
)

# The study's shapes per head_dim: Kimi-K2.5 at TP 1 and 8 (16 and 2 heads of 72),
# the 80-wide head of the CUDA profile, the PR table's 12 and 3 heads of 128.
HEADS_BY_HEAD_DIM = {72: (16, 2), 80: (2,), 128: (12, 3)}
DTYPES = ("bfloat16", "float16", "float32")
# Exit status of the module when it ran but a compile failed (a crash exits 1).
EXIT_COMPILE_FAILED = 3
# Only the merged path's kernel specialises on the token count (divisible by 16 or not).
TOKENS = 4096


@dataclass(frozen=True)
class KernelEntry:
    """A project kernel, found as ``module.kernel``, launched by ``launch(tokens,
    heads, head_dim, dtype)`` on meta tensors through the project's own launcher."""

    name: str
    module: str
    kernel: str
    launch: Callable[[int, int, int, torch.dtype], None]
    dtypes: Sequence[str] = DTYPES
    heads_by_head_dim: dict[int, Sequence[int]] | None = None  # None: the study's shapes
    backends: Sequence[str] = ("hip", "cuda")  # the targets it is compiled for, by backend


def _packed_qk(tokens: int, heads: int, head_dim: int, dtype: torch.dtype):
    """q, k as the vision tower hands them over: views of a packed (T, 3, H, D) qkv,
    and complex64 freqs_cis (T, D/2)."""
    qkv = torch.empty(tokens, 3, heads, head_dim, dtype=dtype, device="meta")
    q, k, _ = qkv.unbind(1)
    freqs_cis = torch.empty(tokens, head_dim // 2, dtype=torch.complex64, device="meta")
    return q, k, freqs_cis


def _launch_fused(tokens, heads, head_dim, dtype):
    from rope_kernels.variants import fused_rope

    fused_rope(*_packed_qk(tokens, heads, head_dim, dtype))


def _launch_fused_half(tokens, heads, head_dim, dtype):
    """Rotate-half (Qwen's towers) as the microbench hands it over: the halves layout."""
    from rope_kernels.variants import fused_rope

    fused_rope(*_packed_qk(tokens, heads, head_dim, dtype), rotation="half")


def _launch_fused_tiles(tokens, heads, head_dim, dtype):
    from rope_kernels.bench.fused_candidates import fused_qk_rope_tiles
    from rope_kernels.kernels.reference import cos_sin_views

    q, k, freqs_cis = _packed_qk(tokens, heads, head_dim, dtype)
    fused_qk_rope_tiles(q, k, *cos_sin_views(freqs_cis))


def _launch_vllm_merged_recreated(tokens, heads, head_dim, dtype):
    from rope_kernels.kernels.vllm_merged_recreated import apply_rotary_interleaved

    # What the merged path hands its rotary kernel: q upcast, cos/sin copied out.
    q, _, freqs_cis = _packed_qk(tokens, heads, head_dim, dtype)
    apply_rotary_interleaved(q.float(), freqs_cis.real.contiguous(), freqs_cis.imag.contiguous())


def _launch_floor(tokens, heads, head_dim, dtype):
    from rope_kernels.bench.microbench import launch_floor

    launch_floor(torch.empty(1, dtype=torch.int32, device="meta"))  # the shape is not read


def _qkv_gemm_launch(use_tma: bool):
    """The Triton QKV GEMM (Kimi's 1152 -> 3 x heads x head_dim) as ``qkv_rope_linear``
    launches it: with TMA at the NVIDIA angles config (the persistent kernel the encoder's
    ``gemm_epilogue`` runs on Hopper and newer; here with the table's rotation, which
    compiles for every target: the angles' SFU instructions are PTX), with pointer loads
    at the AMD config (what MI300X/MI250 run; on the NVIDIA targets, what pre-Hopper GPUs
    would)."""
    def launch(tokens, heads, head_dim, dtype):
        from rope_kernels.kernels.qkv_gemm import QKVGemmConfig, qkv_gemm_config, qkv_rope_linear

        hidden = 1152
        x = torch.empty(tokens, hidden, dtype=dtype, device="meta")
        w = torch.empty(3 * heads * head_dim, hidden, dtype=dtype, device="meta")
        b = torch.empty(3 * heads * head_dim, dtype=dtype, device="meta")
        _, _, freqs_cis = _packed_qk(tokens, heads, head_dim, dtype)
        gpu = qkv_gemm_config(heads, head_dim, torch.device("cuda"), x.element_size(),
                              angles=use_tma, amd=not use_tma)
        config = QKVGemmConfig(**{**gpu.__dict__, "use_tma": use_tma})
        qkv_rope_linear(x, w, b, freqs_cis.real, freqs_cis.imag, config=config)
    return launch


# The QKV GEMM's kernels at Kimi's shape (16 heads x 72) in bf16: each compile takes
# seconds, so not every study shape and dtype.
QKV_GEMM_SHAPES = {72: (16,)}


def _qkv_gemm_half_launch(amd: bool):
    """The Triton QKV GEMM with the rotate-half epilogue (its reordered columns) as
    ``qkv_rope_linear(rotation="half")`` launches it: on an NVIDIA GPU at
    ``NVIDIA_HALF_CONFIG`` (pointer loads), on an AMD GPU at the AMD config; at the tower's
    own hidden width."""
    def launch(tokens, heads, head_dim, dtype):
        from rope_kernels.kernels.qkv_gemm import qkv_gemm_config, qkv_rope_linear
        from rope_kernels.towers import TOWERS

        hidden = next(t.hidden for t in TOWERS.values()
                      if t.rotation == "half" and t.head_dim == head_dim and t.heads == heads)
        x = torch.empty(tokens, hidden, dtype=dtype, device="meta")
        w = torch.empty(3 * heads * head_dim, hidden, dtype=dtype, device="meta")
        b = torch.empty(3 * heads * head_dim, dtype=dtype, device="meta")
        _, _, freqs_cis = _packed_qk(tokens, heads, head_dim, dtype)
        config = qkv_gemm_config(heads, head_dim, torch.device("cuda"), x.element_size(),
                                 amd=amd, rotation="half")
        qkv_rope_linear(x, w, b, freqs_cis.real, freqs_cis.imag, config=config, rotation="half")
    return launch


# Qwen's rotate-half towers: Qwen3-VL 16 x 72, Qwen2.5-VL 16 x 80 (towers.TOWERS).
HALF_SHAPES = {72: (16,), 80: (16,)}


def _qkv_config_launch(config):
    """``qkv_rope_linear`` at ``config`` through TMA."""
    def launch(tokens, heads, head_dim, dtype):
        from rope_kernels.kernels.qkv_gemm import QKVGemmConfig, qkv_rope_linear

        x = torch.empty(tokens, 1152, dtype=dtype, device="meta")
        w = torch.empty(3 * heads * head_dim, 1152, dtype=dtype, device="meta")
        b = torch.empty(3 * heads * head_dim, dtype=dtype, device="meta")
        _, _, freqs_cis = _packed_qk(tokens, heads, head_dim, dtype)
        qkv_rope_linear(x, w, b, freqs_cis.real, freqs_cis.imag,
                        config=QKVGemmConfig(**{**config.__dict__, "use_tma": True}))
    return launch


def _qkv_nvidia_default_kernel() -> str:
    """The kernel the angles path launches with its NVIDIA config."""
    from rope_kernels.kernels.qkv_gemm import qkv_gemm_config

    return qkv_gemm_config(16, 72, torch.device("cuda"), angles=True, amd=False).kernel_name


def qkv_config_entries(configs) -> tuple[KernelEntry, ...]:
    """One entry per QKV GEMM config (Hopper-and-newer TMA path, Kimi's shape, bf16),
    named ``qkv_gemm <label>``: ``qkv_sweep_entries`` compiles what
    ``tools/qkv_sweep.py`` times (``write_compile_matrix(entries=..., targets=["sm_90"])``)."""
    return tuple(KernelEntry(f"qkv_gemm {c.label}", "rope_kernels.kernels.qkv_gemm",
                             c.kernel_name,
                             _qkv_config_launch(c), dtypes=("bfloat16",),
                             heads_by_head_dim=QKV_GEMM_SHAPES) for c in configs)


KERNELS = (
    # what fused_qk_rope launches (whole-token rows, fused_launch_config)
    KernelEntry("fused", "rope_kernels.kernels.fused", "_fused_qk_rope_rows_kernel",
                _launch_fused),
    # rotate-half (Qwen's towers): the halves layout fused_qk_rope(rotation="half") launches
    KernelEntry("fused_half", "rope_kernels.kernels.fused", "_fused_qk_rope_rows_kernel",
                _launch_fused_half, dtypes=("bfloat16", "float16"), heads_by_head_dim=HALF_SHAPES),
    # the tiles candidate (the earlier default, fused_candidates.py) at Kimi's shapes
    KernelEntry("fused_tiles", "rope_kernels.bench.fused_candidates",
                "_fused_qk_rope_tiles_kernel", _launch_fused_tiles, dtypes=("bfloat16",),
                heads_by_head_dim={72: (16, 2)}),
    # The merged path upcasts q and k to fp32 before its rotary kernel: fp32 is the
    # only variant it launches, whatever the model's dtype.
    KernelEntry("vllm_merged_recreated", "rope_kernels.kernels.vllm_merged_recreated",
                "_rotary_interleaved_kernel", _launch_vllm_merged_recreated, dtypes=("float32",)),
    # the microbench's launch floor: a one-program kernel storing one int
    KernelEntry("launch_floor", "rope_kernels.bench.microbench", "_launch_floor_kernel", _launch_floor,
                dtypes=("bfloat16",), heads_by_head_dim={72: (16,)}),
    KernelEntry("qkv_gemm_pointers", "rope_kernels.kernels.qkv_gemm", "_qkv_rope_kernel",
                _qkv_gemm_launch(use_tma=False), dtypes=("bfloat16",),
                heads_by_head_dim=QKV_GEMM_SHAPES),
    # the QKV GEMM with the rotate-half epilogue (qkv_rope(rotation="half"), triton_table)
    KernelEntry("qkv_gemm_half", "rope_kernels.kernels.qkv_gemm", "_qkv_rope_kernel",
                _qkv_gemm_half_launch(amd=False), dtypes=("bfloat16",),
                heads_by_head_dim=HALF_SHAPES, backends=("cuda",)),
    KernelEntry("qkv_gemm_half_amd", "rope_kernels.kernels.qkv_gemm", "_qkv_rope_kernel",
                _qkv_gemm_half_launch(amd=True), dtypes=("bfloat16",),
                heads_by_head_dim=HALF_SHAPES, backends=("hip",)),
    # the NVIDIA angles default's kernel (_qkv_nvidia_default_kernel: persistent)
    KernelEntry("qkv_gemm_tma", "rope_kernels.kernels.qkv_gemm", _qkv_nvidia_default_kernel(),
                _qkv_gemm_launch(use_tma=True), dtypes=("bfloat16",),
                heads_by_head_dim=QKV_GEMM_SHAPES),
)



def qkv_sweep_entries() -> tuple[KernelEntry, ...]:
    """``qkv_config_entries`` of ``QKV_SWEEP_CONFIGS`` (what tools/qkv_sweep.py times)."""
    from rope_kernels.bench.qkv_configs import QKV_SWEEP_CONFIGS

    return qkv_config_entries(QKV_SWEEP_CONFIGS)


class _LaunchRecorder:
    """Stands in for a JITFunction: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def recorded_launch(entry: KernelEntry, tokens: int, heads: int, head_dim: int, dtype: str):
    """(kernel, args, kwargs) of the first launch the entry's launcher makes."""
    module = importlib.import_module(entry.module)
    kernel = getattr(module, entry.kernel)
    recorder = _LaunchRecorder()
    from rope_kernels.kernels.switches import recording_launches

    with mock.patch.object(module, entry.kernel, recorder), recording_launches():
        entry.launch(tokens, heads, head_dim, getattr(torch, dtype))
    if not recorder.calls:
        raise RuntimeError(f"{entry.name}'s launcher did not launch {entry.module}.{entry.kernel}")
    _, args, kwargs = recorder.calls[0]
    return kernel, args, kwargs


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "scratch_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_store_bytes": re.compile(r"(\d+) bytes spill stores"),
    "spill_load_bytes": re.compile(r"(\d+) bytes spill loads"),
}
_AMDGCN = {
    "registers": re.compile(r"^\s*\.vgpr_count:\s+(\d+)", re.M),
    "sgprs": re.compile(r"^\s*\.sgpr_count:\s+(\d+)", re.M),
    "spilled_vgprs": re.compile(r"^\s*\.vgpr_spill_count:\s+(\d+)", re.M),
    "spilled_sgprs": re.compile(r"^\s*\.sgpr_spill_count:\s+(\d+)", re.M),
    "scratch_bytes": re.compile(r"; ScratchSize: (\d+)"),
    "waves_per_simd": re.compile(r"; Occupancy: (\d+)"),
}


def _first_int(pattern: re.Pattern, text: str):
    m = pattern.search(text)
    return int(m.group(1)) if m else None


def compile_for_target(kernel, args, kwargs, target: Target) -> dict:
    """Compile one recorded launch for one target; the resources its assembler reports."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    if not hasattr(kernel, "params"):
        raise RuntimeError("Triton's interpreter is on (TRITON_INTERPRET=1): nothing to compile; "
                           "run write_compile_matrix() or `python -m rope_kernels compile-matrix`")
    gpu = GPUTarget(target.backend, target.arch, target.warp_size)
    backend = make_backend(gpu)
    # What JITFunction.run does before compiling: bind, specialise, pack.
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound,
                                                              specialization, options)
    log = io.StringIO()
    # ptxas' -v report is printed only when asked for, and only on a cache miss.
    with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs),
                                  target=gpu, options=options.__dict__)
    row = {"shared_bytes": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps}
    if target.backend == "hip":
        asm = compiled.asm["amdgcn"]
        row.update({k: _first_int(p, asm) for k, p in _AMDGCN.items()})
        row["spilled_registers"] = (row.pop("spilled_vgprs") or 0) + (row.pop("spilled_sgprs") or 0)
        row["spills"] = row["spilled_registers"] > 0 or (row["scratch_bytes"] or 0) > 0
        row["binary"], row["binary_bytes"] = "hsaco", len(compiled.asm["hsaco"])
    else:
        report = log.getvalue()
        row.update({k: _first_int(p, report) for k, p in _PTXAS.items()})
        if row["registers"] is None:
            raise RuntimeError(f"no ptxas register report for {kernel.__name__} on {target.label}")
        row["spill_bytes"] = row.pop("spill_store_bytes") + row.pop("spill_load_bytes")
        row["spills"] = row["spill_bytes"] > 0 or (row["scratch_bytes"] or 0) > 0
        row["binary"], row["binary_bytes"] = "cubin", len(compiled.asm["cubin"])
    # a constexpr may be a jit function (the QKV kernel's ROTATION epilogue): by its name
    row["constexprs"] = json.dumps({k: v for k, v in kwargs.items() if k != "num_warps"},
                                   sort_keys=True, default=lambda v: getattr(v, "__name__", repr(v)))
    return row


def _resources(row: dict) -> str:
    spills = "SPILLS" if row["spills"] else "no spills"
    return f"{row['registers']:.0f} regs, {spills}, {row['shared_bytes']:.0f} B shared"


def compile_matrix(kernels: Sequence[KernelEntry] = KERNELS,
                   targets: Sequence[Target] = TARGETS, log=print) -> pd.DataFrame:
    """One row per kernel x shape x dtype x target; a failed compile is a row with
    ``compiled`` False and the compiler's message, not an exception."""
    from rope_kernels.provenance import git_commit, triton_version

    provenance = {"triton_version": triton_version(), "torch_version": torch.__version__,
                  "git_commit": git_commit()}
    rows = []
    for entry in kernels:
        for head_dim, heads_list in (entry.heads_by_head_dim or HEADS_BY_HEAD_DIM).items():
            for heads in heads_list:
                for dtype in entry.dtypes:
                    kernel, args, kwargs = recorded_launch(entry, TOKENS, heads, head_dim, dtype)
                    for target in (t for t in targets if t.backend in entry.backends):
                        row = {"kernel": entry.name, "triton_kernel": entry.kernel,
                               "target": target.label, "backend": target.backend,
                               "warp_size": target.warp_size, "gpus": target.gpus,
                               "tokens": TOKENS, "heads": heads, "head_dim": head_dim,
                               "dtype": dtype}
                        try:
                            row.update(compile_for_target(kernel, args, kwargs, target),
                                       compiled=True, error="")
                        except Exception as exc:  # recorded, and the caller fails on it
                            # Triton's message quotes the source first, the cause last.
                            message = " ".join(f"{exc} {exc.__cause__ or ''}".split())
                            row.update(compiled=False,
                                       error=f"{type(exc).__name__}: {message[-400:]}")
                        rows.append({**row, **provenance})
                        log(f"{entry.name:21s} {heads:2d}x{head_dim:<3d} {dtype:8s} "
                            f"{target.label:7s} " + (
                                _resources(row) if row["compiled"]
                                else f"FAILED {row['error'][-160:]}"))
    return pd.DataFrame(rows)


def load_entries(spec: str) -> Sequence[KernelEntry]:
    """'package.module:NAME' -> the KernelEntry sequence it names (NAME may be a
    function returning one)."""
    module, _, name = spec.partition(":")
    entries = getattr(importlib.import_module(module), name or "KERNELS")
    if callable(entries):
        entries = entries()
    if not all(isinstance(e, KernelEntry) for e in entries):
        raise TypeError(f"{spec} must be a sequence of KernelEntry")
    return entries


def write_compile_matrix(csv_path: Path = COMPILE_MATRIX_CSV, *, entries: str | None = None,
                         targets: Sequence[str] | None = None, timeout_s: float = 900,
                         extra_env: dict | None = None) -> pd.DataFrame:
    """Run the matrix with the real compiler (a subprocess with the interpreter off)
    and replace ``csv_path`` with its table. Raises RuntimeError if any compile failed.

    ``entries``: 'module:NAME' of other KernelEntry objects than ``KERNELS``;
    ``targets``: labels of some of ``TARGETS`` (e.g. ["sm_90"]); None: all."""
    csv_path = Path(csv_path)
    labels = [t.label for t in TARGETS]
    if targets is not None:
        unknown = sorted(set(targets) - set(labels))
        if unknown or not targets:
            raise ValueError(f"targets must be some of {labels}, got {list(targets)}")
    env = {**os.environ, **(extra_env or {}), "TRITON_INTERPRET": "0"}
    args = [str(csv_path)]
    if entries or targets:
        args.append(entries or "rope_kernels.bench.compile_matrix:KERNELS")
    if targets:
        args.append(",".join(targets))
    with tempfile.TemporaryDirectory() as tmp:
        # A private cache: every kernel is really compiled, none read back from disk.
        env["TRITON_CACHE_DIR"] = tmp
        proc = subprocess.run([sys.executable, "-m", "rope_kernels.bench.compile_matrix", *args],
                              env=env, cwd=REPO_ROOT, timeout=timeout_s,
                              text=True, capture_output=True)
    print(proc.stdout, end="")
    if proc.returncode not in (0, EXIT_COMPILE_FAILED):
        raise RuntimeError(f"compile matrix crashed (exit {proc.returncode}):\n{proc.stderr}")
    table = pd.read_csv(csv_path)
    failed = table[~table["compiled"]]
    if len(failed):
        raise RuntimeError(f"{len(failed)} of {len(table)} compiles failed:\n"
                           + failed[["kernel", "heads", "head_dim", "dtype", "target",
                                     "error"]].to_string(index=False))
    return table


def compile_matrix_table(csv_path: Path = COMPILE_MATRIX_CSV) -> pd.DataFrame:
    """The stored matrix, wide for reading: registers / spills / shared bytes per target."""
    table = pd.read_csv(csv_path)
    order = [t.label for t in TARGETS]
    table["cell"] = [_resources(r) if r["compiled"] else "FAILED"
                     for r in table.to_dict("records")]
    wide = table.pivot_table(index=["kernel", "heads", "head_dim", "dtype"], columns="target",
                             values="cell", aggfunc="first")
    return wide[[t for t in order if t in wide.columns]]


# Our CuTe DSL QKV kernel for Blackwell (kernels/qkv_cute_sm100.py), compiled by CuTe DSL
# (not Triton) for sm_100a: kernel name -> CuteQKVConfig label (+ "/norot": rotation
# compiled out), at Kimi's shape (16 heads x 72, hidden 1152) in bf16.
CUTE_SM100_ROWS = {"qkv_cute_sm100": "192x1", "qkv_cute_sm100_norot": "192x1/norot"}
# The bias of the sm_100a and gfx942 rows, an operand of the kernel read in its own dtype:
# bf16, as a bf16 nn.Linear holds it.
EXTRA_BIAS = "bfloat16"


def cute_sm100_matrix(rows: dict[str, str] = CUTE_SM100_ROWS, log=print) -> pd.DataFrame:
    """One row per entry of ``rows``: the sm_100a kernel compiled in a process targeting
    sm_100a, with what its cubin asks for (registers, scratch, shared memory, tensor-memory
    columns). A failed compile is a row with ``compiled`` False, as in ``compile_matrix``."""
    from rope_kernels.kernels import qkv_cute, qkv_cute_sm100
    from rope_kernels.provenance import git_commit

    heads, head_dim = 16, 72
    if not qkv_cute.available():
        raise RuntimeError("the sm_100a rows need nvidia-cutlass-dsl (CuTe DSL) installed")
    results = qkv_cute_sm100.compile_in_subprocess(list(rows.values()), heads, head_dim, TOKENS,
                                                   bias=EXTRA_BIAS)
    out = []
    for (name, label), res in zip(rows.items(), results):
        row = {"kernel": name, "triton_kernel": "KimiQKVRopeSm100", "target": "sm_100a",
               "backend": "cuda", "warp_size": 32, "gpus": "NVIDIA B200 / GB200",
               "tokens": TOKENS, "heads": heads, "head_dim": head_dim, "dtype": "bfloat16",
               "constexprs": json.dumps({"config": label, "bias": EXTRA_BIAS}), "compiler":
               f"nvidia-cutlass-dsl {qkv_cute.cutlass_dsl_version()}",
               "torch_version": torch.__version__, "git_commit": git_commit()}
        if res["error"]:
            row.update(compiled=False, error=res["error"])
        else:
            row.update({k: res[k] for k in ("registers", "scratch_bytes", "shared_bytes",
                                            "num_warps", "binary_bytes", "tmem_columns")},
                       binary="cubin", spills=res["scratch_bytes"] > 0, compiled=True,
                       error="")
        out.append(row)
        log(f"{name:21s} {heads:2d}x{head_dim:<3d} bfloat16 sm_100a " + (
            f"{_resources(row)}, {row['tmem_columns']} TMEM columns" if row["compiled"]
            else f"FAILED {row['error'][-160:]}"))
    return pd.DataFrame(out)


def flydsl_gfx942_matrix(log=print) -> pd.DataFrame:
    """The row of our FlyDSL QKV + RoPE kernel (kernels/qkv_flydsl.py) compiled for gfx942 at
    Kimi's shape in bf16, with what its ISA's metadata reports (beside the Triton ROCm rows)."""
    from rope_kernels.kernels import qkv_flydsl
    from rope_kernels.provenance import git_commit

    heads, head_dim = 16, 72
    ok, why = qkv_flydsl.availability()
    if not ok:
        raise RuntimeError(f"the gfx942 FlyDSL row cannot be compiled here: {why}")
    row = {"kernel": FLYDSL_GFX942_ROW, "triton_kernel": "qkv_rope_kernel", "target": "gfx942",
           "backend": "hip", "warp_size": 64, "gpus": "AMD MI300X / MI300A / MI325X",
           "tokens": TOKENS, "heads": heads, "head_dim": head_dim, "dtype": "bfloat16",
           "num_warps": 4, "constexprs": json.dumps({"tile": [qkv_flydsl.TILE_N,
                                                              qkv_flydsl.TILE_T,
                                                              qkv_flydsl.TILE_K],
                                             "bias": EXTRA_BIAS}),
           "compiler": f"flydsl {qkv_flydsl.flydsl_version()}",
           "torch_version": torch.__version__, "git_commit": git_commit()}
    try:
        res = qkv_flydsl.compile_in_subprocess(heads, head_dim, TOKENS, bias=EXTRA_BIAS)
        spilled = res["spilled_vgprs"] + res["spilled_sgprs"]
        row.update({k: res[k] for k in ("registers", "sgprs", "scratch_bytes", "shared_bytes")},
                   spilled_registers=spilled, spills=spilled > 0 or res["scratch_bytes"] > 0,
                   binary="hsaco", compiled=True, error="")
    except RuntimeError as exc:
        row.update(compiled=False, error=" ".join(str(exc).split())[-400:])
    log(f"{FLYDSL_GFX942_ROW:21s} {heads:2d}x{head_dim:<3d} bfloat16 gfx942  " + (
        _resources(row) if row["compiled"] else f"FAILED {row['error'][-160:]}"))
    return pd.DataFrame([row])


FLYDSL_GFX942_ROW = "qkv_flydsl"
EXTRA_ROWS = {"cute-sm100": cute_sm100_matrix, "flydsl-gfx942": flydsl_gfx942_matrix}


EXTRA_KERNELS = (*CUTE_SM100_ROWS, FLYDSL_GFX942_ROW)


def merge_rows(csv_path: Path, new: pd.DataFrame) -> pd.DataFrame:
    """Write ``new`` into ``csv_path`` in place of the rows of the same kernels, keeping the
    others; returns the table written."""
    from rope_kernels.atomic_io import write_atomic

    csv_path = Path(csv_path)
    old = pd.read_csv(csv_path) if csv_path.is_file() else pd.DataFrame()
    if len(old):
        old = old[~old["kernel"].isin(new["kernel"])]
    table = pd.concat([old, new], ignore_index=True) if len(old) else new
    # counts stay integers where a row lacks one (a FlyDSL row has no binary size)
    for col in ("binary_bytes", "tmem_columns", "registers", "shared_bytes", "num_warps"):
        if col in table:
            table[col] = pd.to_numeric(table[col]).astype("Int64")
    write_atomic(csv_path, table.to_csv(index=False))
    return table


def write_extra_rows(csv_path: Path = COMPILE_MATRIX_CSV,
                     which: Sequence[str] = tuple(EXTRA_ROWS)) -> pd.DataFrame:
    """Compile the rows of ``EXTRA_ROWS[w]`` for each ``w`` in ``which`` (kernels compiled by
    CuTe DSL or FlyDSL, not Triton), all before writing (so every row names the same commit),
    and put them into ``csv_path`` in place of any earlier ones, the other rows kept as they
    are. Raises RuntimeError if one failed."""
    unknown = sorted(set(which) - set(EXTRA_ROWS))
    if unknown or not which:
        raise ValueError(f"which must be some of {list(EXTRA_ROWS)}, got {list(which)}")
    new = pd.concat([EXTRA_ROWS[w]() for w in which], ignore_index=True)
    table = merge_rows(csv_path, new)
    failed = new[~new["compiled"]]
    if len(failed):
        raise RuntimeError(f"{len(failed)} compile(s) of {', '.join(which)} failed:\n"
                           + failed[["kernel", "error"]].to_string(index=False))
    return table


README_BEGIN = ("<!-- compile:begin (generated by `python -m rope_kernels findings --write` from "
                "data/compile/compile_matrix.csv; edit rope_kernels/bench/compile_matrix.py) -->")
README_END = "<!-- compile:end -->"


def _range(values) -> str:
    lo, hi = int(min(values)), int(max(values))
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _bytes(n: float) -> str:
    return f"{int(n)} B" if n < 1024 else f"{n / 1024:.0f} KB"


def _budget(rows: pd.DataFrame, reg_name: str) -> str:
    """'23-33 VGPRs, no spills, no scratch, 0 B to 2 KB of LDS' for the rows of one kernel."""
    spilled = rows[rows["spills"].astype(bool)]
    scratch = rows["scratch_bytes"].fillna(0)
    lo, hi = rows["shared_bytes"].min(), rows["shared_bytes"].max()
    memory = "LDS" if reg_name == "VGPRs" else "shared memory"
    return ", ".join([f"{_range(rows['registers'])} {reg_name}",
                      "no spills" if spilled.empty else f"spills in {len(spilled)} of {len(rows)}",
                      "no scratch" if (scratch == 0).all() else f"{_range(scratch)} B of scratch",
                      f"{_bytes(hi)} of {memory}" if _bytes(lo) == _bytes(hi)
                      else f"{_bytes(lo)} to {_bytes(hi)} of {memory}"])


def readme_block(table: pd.DataFrame) -> str:
    """README's paragraph on what the compile matrix recorded (every number from ``table``):
    register budgets on AMD and NVIDIA, spills, LDS/shared memory, waves per SIMD."""
    if not table["compiled"].all():
        failed = table[~table["compiled"]]
        return (f"The compile matrix holds {len(failed)} failed compile(s) of {len(table)}: "
                + ", ".join(sorted(set(failed["kernel"] + " on " + failed["target"]))) + ".\n")
    cute = table[table["kernel"].isin(CUTE_SM100_ROWS)]
    fly = table[table["kernel"] == FLYDSL_GFX942_ROW]
    table = table[~table["kernel"].isin([*CUTE_SM100_ROWS, FLYDSL_GFX942_ROW])]  # Triton's
    amd = table[table["backend"] == "hip"]
    nv = table[table["backend"] == "cuda"]
    commits = ", ".join(f"`{c}`" for c in sorted(table["git_commit"].astype(str).unique()))
    versions = ", ".join(sorted(table["triton_version"].astype(str).unique()))
    lines = [f"What `data/compile/compile_matrix.csv` records ({len(table)} compiles, Triton {versions}, "
             f"commit {commits}; generated from its rows), as each target's assembler reports it:"]
    fused_amd = amd[amd["kernel"] == "fused"]
    if len(fused_amd):
        waves = fused_amd["waves_per_simd"].dropna()
        cells = len(fused_amd.drop_duplicates(["heads", "head_dim", "dtype"]))
        if waves.empty:
            occupancy = ""
        elif waves.min() >= 8:  # 8 waves: the most a CDNA2/CDNA3 SIMD holds
            occupancy = (f"; {int(waves.min())} waves per SIMD, the most a SIMD holds, so its occupancy "
                         "is not register-limited")
        else:
            occupancy = f"; at least {int(waves.min())} waves per SIMD"
        lines.append(f"- AMD gfx942/gfx90a: the fused kernel (whole-token rows; {cells} head shapes and "
                     f"dtypes, each for both) {_budget(fused_amd, 'VGPRs')}{occupancy}.")
    for name, what in (("vllm_merged_recreated", "the re-created merged-path kernel"),
                       ("qkv_gemm_pointers", "the QKV GEMM's pointer path (the path a ROCm GPU runs)")):
        rows = amd[amd["kernel"] == name]
        if len(rows):
            limit = " (a workgroup may use 64 KB of LDS)" if name == "qkv_gemm_pointers" else ""
            lines.append(f"- AMD: {what} {_budget(rows, 'VGPRs')}{limit}.")
    for name, what in (("fused", "the fused kernel"), ("vllm_merged_recreated", "the merged-path kernel")):
        rows = nv[nv["kernel"] == name]
        if len(rows):
            lines.append(f"- NVIDIA sm_90/sm_100: {what} {_budget(rows, 'registers')}.")
    half = table[table["kernel"] == "fused_half"]
    if len(half):
        lines.append("- Rotate-half (Qwen's towers, `fused_half`: the halves layout at "
                     + ", ".join(f"{h} x {d}" for h, d in sorted(set(zip(half["heads"], half["head_dim"]))))
                     + f"): AMD {_budget(half[half['backend'] == 'hip'], 'VGPRs')}; NVIDIA "
                     f"{_budget(half[half['backend'] == 'cuda'], 'registers')}.")
    for name, side, what in (("qkv_gemm_half", nv, "NVIDIA sm_90/sm_100 (`NVIDIA_HALF_CONFIG`)"),
                             ("qkv_gemm_half_amd", amd, "AMD gfx942/gfx90a (`AMD_HALF_CONFIG`)")):
        rows = side[side["kernel"] == name]
        if len(rows):
            unit = "VGPRs" if side is amd else "registers"
            lines.append(f"- {what}: the QKV GEMM with the rotate-half epilogue (`{name}`) "
                         f"{_budget(rows, unit)}; compiled, never run on that GPU.")
    for target, gpu in (("sm_90", "H100/H200"), ("sm_100", "B200")):
        rows = nv[(nv["target"] == target) & (nv["kernel"] == "qkv_gemm_tma")]
        if len(rows):
            r = rows.iloc[0]
            tail = ("" if not bool(r["spills"]) else
                    f" ({int(r['spill_bytes'])} B spilled: a run there would want another config; not measured)")
            lines.append(f"- NVIDIA {target} ({gpu}): the QKV GEMM's NVIDIA default (TMA, the "
                         f"`qkv_gemm_tma` rows) {int(r['registers'])} registers, "
                         f"{'spills' if bool(r['spills']) else 'no spills'}, "
                         f"{_bytes(r['shared_bytes'])} of shared memory{tail}.")
    for r in fly.to_dict("records"):
        lines.append(f"- AMD gfx942 (MI300X), {r['compiler']} (commit `{r['git_commit']}`): our "
                     f"FlyDSL QKV GEMM with the same RoPE epilogue (MFMA, the pairs in one lane's "
                     f"registers) {int(r['registers'])} VGPRs, "
                     f"{'spills' if bool(r['spills']) else 'no spills'}, "
                     f"{_bytes(r['shared_bytes'])} of LDS; compiled, never run.")
    for name, what in (("qkv_cute_sm100", "our CuTe DSL QKV kernel with its RoPE epilogue"),
                       ("qkv_cute_sm100_norot", "the same kernel with the rotation compiled out")):
        rows = cute[cute["kernel"] == name]
        if len(rows):
            r = rows.iloc[0]
            config = json.loads(r["constexprs"])["config"]
            lines.append(f"- NVIDIA sm_100a (B200), {r['compiler']} (commit `{r['git_commit']}`): "
                         f"{what} (UMMA, the accumulator in tensor memory; config {config}) "
                         f"{int(r['registers'])} registers, "
                         f"{'spills' if bool(r['spills']) else 'no spills'}, "
                         f"{_bytes(r['shared_bytes'])} of shared memory, "
                         f"{int(r['tmem_columns'])} tensor-memory columns; compiled, never run.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from rope_kernels.atomic_io import write_atomic

    argv = sys.argv[1:] if argv is None else argv
    csv_path = Path(argv[0]) if argv else COMPILE_MATRIX_CSV
    targets = TARGETS
    if len(argv) > 2:
        targets = tuple(t for t in TARGETS if t.label in argv[2].split(","))
    table = compile_matrix(load_entries(argv[1]) if len(argv) > 1 else KERNELS, targets)
    write_atomic(csv_path, table.to_csv(index=False))
    print(f"{int(table['compiled'].sum())}/{len(table)} compiled -> {csv_path}")
    return 0 if table["compiled"].all() else EXIT_COMPILE_FAILED


if __name__ == "__main__":
    # Through the imported module, so its KernelEntry is the one entry files import.
    from rope_kernels.bench.compile_matrix import main as _main

    sys.exit(_main())
