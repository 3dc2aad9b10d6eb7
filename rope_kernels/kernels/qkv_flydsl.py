"""Kimi's QKV projection with its 2D RoPE in the epilogue for AMD CDNA3 (gfx942: MI300X), in
FlyDSL (AMD's CuTe-style DSL, pip ``flydsl``, pinned in pyproject's ``rocm-compile`` extra):
compiled ahead of time on a machine without the GPU, never run here.

Layout: the GEMM is computed transposed, out^T = W x^T (W as ``nn.Linear`` stores it, N x K,
is MFMA's A operand, x its B). An MFMA 16x16 accumulator gives each lane four consecutive rows
of its tile at one column: transposed, four consecutive output columns of one token, so a
pair (2j, 2j+1) sits in two adjacent registers of one lane and one token's patch position
serves both of its pairs; the rotation needs no data movement between lanes and no weight
permutation. The epilogue is the CuTe kernels' (``qkv_cute``): the layer's bias read as an
operand in its own dtype (fp32/bf16/fp16, widened to fp32; a kernel built without bias reads
none), added first; the same per-pair turns (``rope_pair_turns``: turns per patch row and
column), angle = row * t[p, 0] + column * t[p, 1] turns reduced to [-1/2, 1/2] turn; the
hardware's ``v_sin_f32``/``v_cos_f32`` take their argument in turns, so it goes in without a
2*pi.

The kernel is deliberately plain (no LDS staging, no software pipelining, one 64 x 64 tile a
workgroup of 4 waves, element-wise buffer loads): it proves that the epilogue compiles with
the GEMM in FlyDSL for gfx942, not a tuned kernel. Buffer loads and stores (hardware-checked
against the tensor's size) take care of partial tiles.

Compiling needs no GPU but does need a linker: FlyDSL's MLIR hands the gfx942 object to
``$ROCM_PATH/llvm/bin/ld.lld``; where ROCm is not installed, any ld.lld of LLVM 19 or newer
(Debian's ``lld-19``) is linked there (``toolchain``). Math library calls (``math.sin``) would
also need ROCm's device bitcode; the epilogue uses the hardware instructions and needs none.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rope_kernels.kernels.packages import imports, installed_version

ARCH = "gfx942"
FLYDSL_VERSION = "0.4.2"  # pyproject's rocm-compile extra
TILE_N, TILE_T, TILE_K = 64, 64, 16  # out^T tile (columns x tokens), MFMA 16x16x16 bf16
LLD_CANDIDATES = ("/opt/rocm/llvm/bin/ld.lld", "/usr/lib/llvm-19/bin/ld.lld",
                  "/usr/lib/llvm-20/bin/ld.lld")


def available() -> bool:
    """Whether FlyDSL imports here."""
    return imports("flydsl")


def flydsl_version() -> str:
    """The installed FlyDSL's version ("" where it is not installed)."""
    return installed_version("flydsl")


def find_lld() -> str | None:
    """An ld.lld that links gfx942 code objects (LLVM 19+): ROCm's, or a distribution's."""
    for path in LLD_CANDIDATES:
        if os.path.isfile(path):
            return path
    return None


def availability() -> tuple[bool, str]:
    """(compiles here, why not)."""
    if not available():
        return False, f"flydsl=={FLYDSL_VERSION} is not installed (pip install '.[rocm-compile]')"
    if find_lld() is None:
        return False, ("no ld.lld of LLVM 19+ to link the gfx942 object (ROCm's, or Debian's "
                       "lld-19); looked at " + ", ".join(LLD_CANDIDATES))
    return True, ""


def toolchain(tmp: Path) -> dict:
    """Environment for a compile-only FlyDSL process: no GPU, gfx942, IR and ISA dumped to
    ``tmp``; ROCM_PATH is ROCm's where ROCm is installed, else a folder whose llvm/bin/ld.lld
    is the distribution's."""
    lld = find_lld()
    if lld is None:
        raise RuntimeError(availability()[1])
    rocm = Path(lld).parents[2] if lld.startswith("/opt/rocm/") else tmp / "rocm"
    if rocm == tmp / "rocm":
        (rocm / "llvm" / "bin").mkdir(parents=True, exist_ok=True)
        (rocm / "llvm" / "bin" / "ld.lld").symlink_to(lld)
    return {"FLYDSL_COMPILE_ONLY": "1", "FLYDSL_COMPILE_ARCH": ARCH, "FLYDSL_DUMP_IR": "1",
            "FLYDSL_DUMP_DIR": str(tmp / "dump"), "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
            "ROCM_PATH": str(rocm)}


def build_kernel(rot_cols: int, has_bias: bool = True):
    """The jitted launcher ``launch(w, x, out_t, turns, bias, coords, stream)`` (FlyDSL
    imported here). ``out_t``: the (T, N) output seen as (N, T), i.e. ``out.t()``; ``turns``:
    ``rope_pair_turns``; ``bias``: the layer's (N,) vector in its own dtype, read at every
    launch, or where ``has_bias`` is False any tensor, never read (``qkv_cute``'s
    ``_bias_operand``: the turns' memory); ``rot_cols``: the q|k columns (2*H*D), rotated;
    v's columns get the bias only."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from flydsl._mlir.dialects import rocdl as rocdl_ops
    from flydsl.expr.typing import T as ir_types
    from flydsl.expr.typing import as_ir_value

    def hw(op, turns):  # v_sin_f32 / v_cos_f32: the argument in turns
        return fx.Float32(op(ir_types.f32, as_ir_value(turns)))

    @flyc.kernel
    def qkv_rope_kernel(W: fx.Tensor, X: fx.Tensor, OutT: fx.Tensor, Turns: fx.Tensor,
                        Bias: fx.Tensor, Pos: fx.Tensor):
        tid = fx.thread_idx.x
        bid_n, bid_t = fx.block_idx.x, fx.block_idx.y
        N, K = W.shape.unpack()
        T = X.shape[0]
        W = fx.rocdl.make_buffer_tensor(W, max_size=False)
        X = fx.rocdl.make_buffer_tensor(X, max_size=False)
        OutT = fx.rocdl.make_buffer_tensor(OutT, max_size=False)
        gW = fx.flat_divide(W, (TILE_N, TILE_K))
        gX = fx.flat_divide(X, (TILE_T, TILE_K))
        gO = fx.flat_divide(OutT, (TILE_N, TILE_T))[None, None, bid_n, bid_t]

        # 2 x 2 waves of 16x16x16 bf16 MFMA; each lane ends with (4 columns, 2, 2) values
        mma = fx.make_mma_atom(fx.rocdl.MFMA(16, 16, 16, fx.BFloat16))
        tiled_mma = fx.make_tiled_mma(mma, fx.make_layout((2, 2, 1), (1, 2, 0)))
        thr_mma = tiled_mma.thr_slice(tid)
        elem = fx.make_copy_atom(fx.rocdl.BufferCopy16b(), fx.BFloat16)
        copy_w = fx.make_tiled_copy_A(elem, tiled_mma).get_slice(tid)
        copy_x = fx.make_tiled_copy_B(elem, tiled_mma).get_slice(tid)
        copy_out = fx.make_tiled_copy_C(elem, tiled_mma).get_slice(tid)

        frag_w = thr_mma.make_fragment_A(gW[None, None, 0, 0])
        frag_x = thr_mma.make_fragment_B(gX[None, None, 0, 0])
        acc = thr_mma.make_fragment_C(gO)
        acc.fill(0)
        regs_w = copy_w.retile(frag_w)
        regs_x = copy_x.retile(frag_x)
        src_w = copy_w.partition_S(gW[None, None, bid_n, None])
        src_x = copy_x.partition_S(gX[None, None, bid_t, None])
        for kt in range(K // TILE_K):
            fx.copy(elem, src_w[None, None, None, kt], regs_w, pred=None)
            fx.copy(elem, src_x[None, None, None, kt], regs_x, pred=None)
            fx.gemm(mma, acc, frag_w, frag_x, acc)

        # epilogue: (column, token) of every accumulator value; values 2q and 2q+1 are a
        # pair's two columns (an even column and the next) of one token
        coord = thr_mma.partition_C(fx.flat_divide(
            fx.make_view((0, 0), fx.make_identity_layout((N, T))),
            (TILE_N, TILE_T))[None, None, bid_n, bid_t])
        last_token = fx.get_scalar(T) - 1
        last_pair = fx.get_scalar(N) // 2 - 1
        for q in fx.range_constexpr(fx.size(acc.shape).unpack() // 2):
            c = coord[2 * q]
            n = fx.get_scalar(fx.get(c, 0))
            t = fx.get_scalar(fx.get(c, 1))
            p = n // 2
            # a partial tile's columns and tokens are not stored: clamped to read in bounds
            p = (p < last_pair).select(p, last_pair)
            t = (t < last_token).select(t, last_token)
            x0 = acc[2 * q]
            x1 = acc[2 * q + 1]
            if has_bias:  # the bias in its own dtype, widened to fp32, added before the turn
                x0 = x0 + fx.Float32(Bias[2 * p])
                x1 = x1 + fx.Float32(Bias[2 * p + 1])
            turns = fx.Float32(Pos[t, 0]) * Turns[p, 0] + fx.Float32(Pos[t, 1]) * Turns[p, 1]
            turns = turns - fx.math.roundeven(turns)
            cos = hw(rocdl_ops.cos, turns)
            sin = hw(rocdl_ops.sin, turns)
            rotated = n < rot_cols  # v's columns: bias only
            acc[2 * q] = rotated.select(x0 * cos - x1 * sin, x0)
            acc[2 * q + 1] = rotated.select(x0 * sin + x1 * cos, x1)
        out = fx.make_fragment_like(acc, dtype=fx.BFloat16)
        out.store(acc.load().to(fx.BFloat16))
        fx.copy(elem, copy_out.retile(out), copy_out.partition_S(gO), pred=None)

    @flyc.jit
    def launch(W: fx.Tensor, X: fx.Tensor, OutT: fx.Tensor, Turns: fx.Tensor, Bias: fx.Tensor,
               Pos: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        grid_n = fx.get_scalar(fx.ceil_div(W.shape[0], TILE_N))
        grid_t = fx.get_scalar(fx.ceil_div(X.shape[0], TILE_T))
        qkv_rope_kernel(W, X, OutT, Turns, Bias, Pos).launch(grid=(grid_n, grid_t, 1),
                                                             block=(256, 1, 1), stream=stream)

    return launch


_AMDGCN = {
    "registers": re.compile(r"^\s*\.vgpr_count:\s+(\d+)", re.M),
    "sgprs": re.compile(r"^\s*\.sgpr_count:\s+(\d+)", re.M),
    "spilled_vgprs": re.compile(r"^\s*\.vgpr_spill_count:\s+(\d+)", re.M),
    "spilled_sgprs": re.compile(r"^\s*\.sgpr_spill_count:\s+(\d+)", re.M),
    "scratch_bytes": re.compile(r"^\s*\.private_segment_fixed_size:\s+(\d+)", re.M),
    "shared_bytes": re.compile(r"^\s*\.group_segment_fixed_size:\s+(\d+)", re.M),
}
# global loads: the epilogue's (turns, positions, bias); W and x come in by buffer loads
_ISA_COUNTS = {"mfma": r"v_mfma_f32_16x16x16_?bf16", "sin": r"v_sin_f32", "cos": r"v_cos_f32",
               "global_loads": r"\bglobal_load_\w+"}


def isa_resources(isa: str) -> dict:
    """What the gfx942 ISA's kernel metadata says it uses, and its MFMA, sin/cos and global
    load counts."""
    row = {}
    for key, pattern in _AMDGCN.items():
        m = pattern.search(isa)
        if m is None:
            raise RuntimeError(f"no {key} in the gfx942 ISA's metadata")
        row[key] = int(m.group(1))
    row["isa_counts"] = {k: len(re.findall(p, isa)) for k, p in _ISA_COUNTS.items()}
    return row


BIAS_DTYPES = ("bfloat16", "float32", "float16")  # the layer's bias as the kernel reads it


def compile_gfx942(heads: int = 16, head_dim: int = 72, hidden: int = 1152,
                   tokens: int = 4096, bias: str | None = "bfloat16") -> dict:
    """Compile (this process; FlyDSL's compile-only settings must be in the environment, see
    ``compile_in_subprocess``) at Kimi's shape, bf16, with a bias of dtype ``bias`` (bf16 as a
    bf16 ``nn.Linear`` holds it; None: the kernel without bias), and read the kernel's
    resources from the final ISA."""
    import torch

    from rope_kernels.kernels.freqs import vision_rope_frequencies
    from rope_kernels.kernels.qkv_cute import _bias_operand, rope_pair_turns

    if bias is not None and bias not in BIAS_DTYPES:
        raise ValueError(f"bias must be one of {BIAS_DTYPES} or None, got {bias!r}")

    n = 3 * heads * head_dim
    w = torch.randn(n, hidden, dtype=torch.bfloat16)
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    out = torch.empty(tokens, n, dtype=torch.bfloat16)
    turns = rope_pair_turns(heads, head_dim, vision_rope_frequencies(head_dim))
    b = None if bias is None else torch.randn(n, dtype=getattr(torch, bias))
    coords = torch.zeros(tokens, 2, dtype=torch.int32)
    import flydsl.compiler as flyc
    flyc.compile(build_kernel(2 * heads * head_dim, b is not None), w, x, out.t(), turns,
                 _bias_operand(b, turns), coords)
    dump = Path(os.environ["FLYDSL_DUMP_DIR"])
    isas = sorted(dump.glob("qkv_rope_kernel*/*final_isa.s"))
    if len(isas) != 1:
        raise RuntimeError(f"expected one final ISA under {dump}, found {isas}")
    return isa_resources(isas[0].read_text())


def compile_in_subprocess(heads: int = 16, head_dim: int = 72, tokens: int = 4096,
                          timeout_s: float = 600, bias: str | None = "bfloat16") -> dict:
    """``compile_gfx942`` in a fresh process with the compile-only environment."""
    import json
    if bias is not None and bias not in BIAS_DTYPES:
        raise ValueError(f"bias must be one of {BIAS_DTYPES} or None, got {bias!r}")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, **toolchain(Path(tmp))}
        proc = subprocess.run([sys.executable, "-m", "rope_kernels.kernels.qkv_flydsl",
                               json.dumps({"heads": heads, "head_dim": head_dim,
                                           "tokens": tokens, "bias": bias})],
                              env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or len(lines) != 1:
        raise RuntimeError(f"gfx942 FlyDSL compile failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[0])


if __name__ == "__main__":
    import json
    req = json.loads(sys.argv[1])
    print(json.dumps(compile_gfx942(req["heads"], req["head_dim"], tokens=req["tokens"],
                                    bias=req["bias"])), flush=True)
    shutil.rmtree(os.environ["FLYDSL_DUMP_DIR"], ignore_errors=True)
