"""Kimi's QKV projection with its 2D RoPE in the epilogue for Blackwell (sm_100a), in CuTe
DSL: compiled ahead of time on a machine without the GPU, never run here.

The sm_90a kernel (``qkv_cute.py``) accumulates with warpgroup MMA in registers; Blackwell's
UMMA (``tcgen05.mma``) accumulates in tensor memory, so the epilogue first reads the
accumulator back (``tcgen05.ld.32x32b``: one row of the tile a thread, a pair's two columns
in two adjacent registers) and then applies the sm_90a kernel's bias and rotation with the
same operands (the layer's bias read in its own dtype, the turns of ``rope_pair_turns``) and
the same arithmetic. The kernel is in ``qkv_cute_sm100_kernel.py``; it takes
``CuteQKVConfig`` (``qkv_cute_config.py``: tile_n, store columns, stages, rotate; no cluster).

What is proven here: CuTe DSL compiles it for sm_100a and ptxas accepts it (``compile_kernel``;
``resources`` reads what the cubin asks for). What is not: that it computes the right numbers
or how fast it is on a B200; no sm_100 GPU has run it.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from rope_kernels.kernels.qkv_cute import _bias_operand, _cute_tensor, rope_pair_turns
from rope_kernels.kernels.qkv_cute_config import CuteQKVConfig

ARCH = "sm_100a"


def compile_kernel(cfg: CuteQKVConfig, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                   turns: torch.Tensor, bias: torch.Tensor | None, coords: torch.Tensor,
                   rot_cols: int, dump_dir: str | None = None):
    """Compile the kernel for sm_100a (tensors may be CPU tensors: only their dtypes, widths
    and alignment are read; the token count stays a runtime value). The operands are the
    sm_90a kernel's (``qkv_cute.compile_kernel``): ``turns`` from ``rope_pair_turns``, ``bias``
    the layer's own (3*H*D,) vector in its dtype (fp32/bf16/fp16), None compiling the kernel
    without bias. CuTe DSL admits tcgen05 operations only when its target is an sm_100 one:
    the process must have started with ``CUTE_DSL_ARCH=sm_100a`` (``compile_in_subprocess``
    does that). ``dump_dir``: keep the cubin there. Returns (compiled function, the kernel object)."""
    if os.environ.get("CUTE_DSL_ARCH") != ARCH:
        raise RuntimeError(f"CuTe DSL's target is {os.environ.get('CUTE_DSL_ARCH')!r}, not "
                           f"{ARCH!r}: compile in a process started with CUTE_DSL_ARCH={ARCH} "
                           f"(compile_in_subprocess)")
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    from rope_kernels.kernels.qkv_cute_sm100_kernel import KimiQKVRopeSm100

    kernel = KimiQKVRopeSm100(cfg, rot_cols, bias is not None, x.element_size())
    b = _bias_operand(bias, turns)
    options = f"--gpu-arch {ARCH}"
    if dump_dir is not None:
        options += f" --keep-cubin --dump-dir {dump_dir}"
    fn = cute.compile(kernel, _cute_tensor(x, True), _cute_tensor(w, False),
                      _cute_tensor(out, True), _cute_tensor(turns, False),
                      _cute_tensor(b, False, b.element_size()), _cute_tensor(coords, True),
                      cuda.CUstream(0), options=options)
    return fn, kernel


def _cuobjdump() -> str:
    """Triton's bundled cuobjdump (the project's Triton wheel carries one)."""
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
# tcgen05 MMA, tensor-memory loads, TMA loads/stores, the SFU's cos/sin and the global
# loads (the epilogue's: turns, positions, bias) in the SASS
_SASS = {"umma": r"UTC\w*MMA", "tmem_loads": r"LDTM", "tma_loads": r"UTMALDG",
         "tma_stores": r"UTMASTG", "sfu_cos_sin": r"MUFU\.(?:COS|SIN)",
         "global_loads": r"\bLDG\."}


def cubin_resources(cubin: Path) -> dict:
    """What the cubin's one kernel asks for (cuobjdump --dump-resource-usage) and how many
    of the instructions that make it a Blackwell UMMA kernel its SASS holds."""
    tool = _cuobjdump()
    usage = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    m = _RESOURCES.search(usage)
    if m is None:
        raise RuntimeError(f"no resource usage in cuobjdump's report:\n{usage}")
    regs, stack, shared, local = (int(v) for v in m.groups())
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    counts = {k: len(re.findall(p, sass)) for k, p in _SASS.items()}
    return {"registers": regs, "scratch_bytes": stack + local, "static_shared_bytes": shared,
            "binary_bytes": cubin.stat().st_size, "sass_counts": counts}


def resources(cfg: CuteQKVConfig, heads: int = 16, head_dim: int = 72, hidden: int = 1152,
              dtype: torch.dtype = torch.bfloat16,
              bias_dtype: torch.dtype | None = torch.bfloat16, tokens: int = 4096) -> dict:
    """Compile for sm_100a (this process must target it, see ``compile_kernel``) at Kimi's
    shape by default, with a bias of ``bias_dtype`` (bf16, as a bf16 ``nn.Linear`` holds it;
    None: the kernel without bias), and report the kernel's resources: registers, scratch,
    shared memory (the static part ptxas reports plus the kernel's dynamic storage),
    tensor-memory columns, cubin size and SASS instruction counts."""
    # the token count is a runtime value: any count compiles the same kernel
    x = torch.randn(tokens, hidden, dtype=dtype)
    w = torch.randn(3 * heads * head_dim, hidden, dtype=dtype)
    out = torch.empty(tokens, 3 * heads * head_dim, dtype=dtype)
    from rope_kernels.kernels.freqs import vision_rope_frequencies
    turns = rope_pair_turns(heads, head_dim, vision_rope_frequencies(head_dim))
    bias = (None if bias_dtype is None
            else torch.randn(3 * heads * head_dim, dtype=bias_dtype))
    coords = torch.zeros(tokens, 2, dtype=torch.int32)
    with tempfile.TemporaryDirectory() as tmp:
        fn, kernel = compile_kernel(cfg, x, w, out, turns, bias, coords, 2 * heads * head_dim,
                                    dump_dir=tmp)
        del fn
        cubins = sorted(Path(tmp).glob(f"*.{ARCH}.cubin"))
        if len(cubins) != 1:
            raise RuntimeError(f"expected one {ARCH} cubin in the dump, found {cubins}")
        row = cubin_resources(cubins[0])
    row["dynamic_shared_bytes"] = int(kernel.storage.size_in_bytes())
    row["shared_bytes"] = row["static_shared_bytes"] + row["dynamic_shared_bytes"]
    row["tmem_columns"] = kernel.tmem_cols
    row["ab_stages"] = kernel.ab_stages
    row["num_warps"] = 4
    return row


BIAS_DTYPES = ("bfloat16", "float32", "float16")  # the layer's bias as the kernel reads it


def compile_in_subprocess(configs: list[str], heads: int = 16, head_dim: int = 72,
                          tokens: int = 4096, timeout_s: float = 600,
                          bias: str | None = "bfloat16") -> list[dict]:
    """``resources`` of each config (``CuteQKVConfig.parse`` labels; add ``/norot`` for the
    rotation compiled out) in a fresh process targeting sm_100a: CuTe DSL reads its target
    once per process. ``bias``: the bias's dtype by name, or None (no bias). A failed compile
    is a dict with ``error``."""
    if bias is not None and bias not in BIAS_DTYPES:
        raise ValueError(f"bias must be one of {BIAS_DTYPES} or None, got {bias!r}")
    env = {**os.environ, "CUTE_DSL_ARCH": ARCH}
    proc = subprocess.run([sys.executable, "-m", "rope_kernels.kernels.qkv_cute_sm100",
                           json.dumps({"configs": configs, "heads": heads,
                                       "head_dim": head_dim, "tokens": tokens,
                                       "bias": bias})],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or len(lines) != len(configs):
        raise RuntimeError(f"sm_100a compile process failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return [json.loads(ln) for ln in lines]


def _parse_label(label: str) -> CuteQKVConfig:
    rotate = not label.endswith("/norot")
    cfg = CuteQKVConfig.parse(label.removesuffix("/norot"))
    return CuteQKVConfig(**{**cfg.__dict__, "rotate": rotate})


def main(argv: list[str]) -> int:
    req = json.loads(argv[0])
    for label in req["configs"]:
        row = {"config": label}
        try:
            bias = req["bias"]
            row.update(resources(_parse_label(label), req["heads"], req["head_dim"],
                                 bias_dtype=None if bias is None else getattr(torch, bias),
                                 tokens=req["tokens"]))
            row["error"] = ""
        except Exception as exc:  # recorded, and the caller fails on it
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[-400:]}"
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
