"""Kimi's QKV projection with its 2D RoPE in the epilogue: a Hopper (sm_90a) kernel of
our own in CuTe DSL (``nvidia-cutlass-dsl``; optional, imported only when used).

Why a second kernel beside ``qkv_gemm.py``'s Triton one: in the committed rows
(``data/nvidia-h200/qkv_gemm.csv``; notebook 05 and docs/DECISIONS.md give the ratios) the
Triton kernel with its rotation compiled out is slower than cuBLAS at Kimi's token counts
and QuACK's plain GEMM faster; what QuACK does differently (warp specialization on Hopper, the weight tile multicast over a
cluster) is not expressible in Triton 3.6 (``docs/DECISIONS.md``). This kernel is built from CUTLASS's own
primitives (TMA atoms, WGMMA, mbarrier pipelines, the static persistent tile scheduler),
run from the installed package; the kernel and its epilogue are ours:

- layout: none. W is read as ``nn.Linear`` stores it (N x K, K-major) and the output is
  the packed (T, 3*H*D) row: Kimi's pairs are interleaved (2j, 2j+1) and a WGMMA
  accumulator holds each pair's two columns in one thread's two adjacent registers,
  so the rotation needs no weight permutation and no data movement between threads.
- mainloop: one producer warp (TMA loads of x and W tiles into a ring of shared-memory
  stages; W's tile multicast to the ``cluster_m`` CTAs along M that share it) and two
  consumer warp groups in ping-pong: each owns every other tile of the CTA's persistent
  sequence, so one group's epilogue runs under the other's mainloop; their mainloops
  take turns (two mbarriers), which the stage ring's parity waits need to be right.
- epilogue: bias and rotation on the fp32 accumulator in registers (the bias read from
  the layer's own vector, an operand of the kernel like x and W; angles in turns
  from each token's patch (row, column) and a per-pair table, ``rope_pair_turns``;
  reduced to [-1/2, 1/2] turn and taken by the SFU's cos/sin.approx, as the Triton
  kernel's ``_cos_sin_of``), then bf16/fp16 through shared memory to TMA stores in
  (64, ``store_cols``) subtiles. Tiles wholly in v (columns >= 2*H*D) skip the rotation.

This module is torch-only (table, checks, launch, the compile cache); the launch settings
(``CuteQKVConfig``) and the tile constants are in ``qkv_cute_config.py`` (neither torch nor
CuTe DSL), the kernel class in ``qkv_cute_kernel.py``, which imports CuTe DSL and is
imported (by ``compile_kernel`` only) when a kernel is first compiled: the launcher imports
the kernel module, never the reverse. Its H200 times (with the rotation and compiled out, beside
cuBLAS and QuACK) are the study's rows in ``data/nvidia-h200/qkv_gemm.csv`` (notebook 05).
"""

import functools
import math

import torch

from rope_kernels.kernels.checks import (check_no_autograd, check_positive_int,
                                         check_qkv_operands, check_qkv_out)
from rope_kernels.kernels.packages import imports, installed_version
from rope_kernels.kernels.qkv_cute_config import CuteQKVConfig  # noqa: F401  (the launcher's settings)

def available() -> bool:
    """Whether CuTe DSL imports here (the kernel itself also needs an sm_90 GPU)."""
    return imports("cutlass", "cutlass.cute")


def cutlass_dsl_version() -> str:
    """The installed nvidia-cutlass-dsl's version ("" where it is not installed)."""
    return installed_version("nvidia-cutlass-dsl")


def availability(device=None) -> tuple[bool, str]:
    """(runs here, why not): the kernel needs an sm_90 GPU and nvidia-cutlass-dsl."""
    if not torch.cuda.is_available():
        return False, "needs an NVIDIA sm_90 GPU (no CUDA device here)"
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda" or getattr(torch.version, "hip", None):
        return False, "needs an NVIDIA sm_90 GPU"
    major, minor = torch.cuda.get_device_capability(dev)
    if major != 9:
        return False, f"needs an NVIDIA sm_90 GPU (this one is sm_{major}{minor})"
    if not available():
        return False, "nvidia-cutlass-dsl (CuTe DSL) is not installed"
    return True, ""


def rope_pair_turns(heads: int, head_dim: int, freqs: torch.Tensor) -> torch.Tensor:
    """(3*H*D/2, 2) fp32, one row per column pair p of the packed (q | k | v) row:
    [turns per patch row, turns per patch column]. A function of the frequencies only,
    not of the layer: built once per forward (``qkv.qkv_rope_operands``).

    Kimi's 2D RoPE: within a head, pair j = 2i turns by column * f_i and pair 2i+1 by
    row * f_i (``vision_rope_frequencies``; the Triton kernel's ``_cos_sin``); the
    kernel's angle is row * t[p, 0] + column * t[p, 1] turns, so one of the two is zero
    on every pair, and both on v's pairs."""
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 (interleaved 2D pairs), got {head_dim}")
    if tuple(freqs.shape) != (head_dim // 4,):
        raise ValueError(f"freqs must have shape (head_dim/4,) = ({head_dim // 4},), "
                         f"got {tuple(freqs.shape)}")
    pairs = head_dim // 2
    dev = freqs.device
    turns = freqs.detach().to(torch.float64) / (2 * math.pi)
    j = torch.arange(pairs, device=dev)
    zero = torch.zeros((), dtype=torch.float64, device=dev)
    row = torch.where(j % 2 == 1, turns[j // 2], zero)  # odd pairs: the patch row
    col = torch.where(j % 2 == 0, turns[j // 2], zero)  # even pairs: the patch column
    table = torch.zeros(3, heads, pairs, 2, dtype=torch.float64, device=dev)
    table[:2, :, :, 0] = row
    table[:2, :, :, 1] = col
    return table.view(3 * heads * pairs, 2).to(torch.float32)


BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# Compiled kernels, one per (config, dtype, W's shape, rotated columns, bias dtype or None,
# clusters): everything a compile depends on but the token count (a runtime value).
_COMPILED_KERNELS: dict = {}


def _cute_tensor(t: torch.Tensor, dynamic_rows: bool, align: int = 16):
    from cutlass.cute.runtime import from_dlpack
    ct = from_dlpack(t.detach(), assumed_align=align)
    if dynamic_rows:
        ct = ct.mark_compact_shape_dynamic(mode=0, stride_order=(0, 1), divisibility=1)
    return ct


def _bias_operand(bias: torch.Tensor | None, turns: torch.Tensor) -> torch.Tensor:
    """The kernel's bias operand: the bias itself (a view of its memory, read at every
    launch), or where there is none the turns' own memory, of the same length, which the
    kernel compiled without bias never reads: nothing is built either way."""
    return bias.detach() if bias is not None else turns.view(-1)


def compile_kernel(cfg: CuteQKVConfig, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                   turns: torch.Tensor, bias: torch.Tensor | None, coords: torch.Tensor,
                   rot_cols: int, max_active_clusters: int, stream=None):
    """Compile (or fetch) the kernel for these dtypes, widths and settings; the token
    count is a runtime value. ``bias`` None compiles the kernel without bias. Tensors may
    live on the CPU: compiling needs no GPU (``CUTE_DSL_ARCH=sm_90a`` names the target
    where there is none)."""
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    from rope_kernels.kernels.qkv_cute_kernel import KimiQKVRopeSm90

    key = (cfg, x.dtype, tuple(w.shape), rot_cols, None if bias is None else bias.dtype,
           max_active_clusters)
    if key not in _COMPILED_KERNELS:
        kernel = KimiQKVRopeSm90(cfg, rot_cols, bias is not None, x.element_size())
        b = _bias_operand(bias, turns)
        _COMPILED_KERNELS[key] = cute.compile(
            kernel, _cute_tensor(x, True), _cute_tensor(w, False), _cute_tensor(out, True),
            _cute_tensor(turns, False), _cute_tensor(b, False, b.element_size()),
            _cute_tensor(coords, True), max_active_clusters,
            stream if stream is not None else cuda.CUstream(0))
    return _COMPILED_KERNELS[key]


@functools.cache
def _max_clusters(cluster_m: int) -> int:
    """Clusters of ``cluster_m`` CTAs the GPU holds at once (the persistent grid)."""
    import cutlass.utils
    return cutlass.utils.HardwareInfo().get_max_active_clusters(cluster_m)


def qkv_rope_linear_cute(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    turns: torch.Tensor,
    coords: torch.Tensor,
    *,
    heads: int,
    head_dim: int,
    config: CuteQKVConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rope(x @ w_qkv^T + b_qkv)`` in one CuTe DSL kernel (sm_90): packed (T, 3, H, D).

    Args:
        x: (T, hidden) bf16/fp16, contiguous; hidden a multiple of 8.
        w_qkv: (3*H*D, hidden), contiguous, x's dtype (``nn.Linear``'s layout as is).
        b_qkv: (3*H*D,) contiguous fp32/bf16/fp16, or None: an operand of the kernel,
            read from its own memory at every launch (nothing is built from it, and no
            edit of it, in place or through ``.data``, can be missed).
        turns: ``rope_pair_turns(heads, head_dim, freqs)``: the turns of every column pair.
        coords: int32 (T, 2) contiguous, each token's (row, column) in its patch grid.
        config: launch settings (``CuteQKVConfig()`` by default; ``rotate=False``: the
            plain projection, benchmarks only).
        out: optional preallocated (T, 3, H, D) contiguous output.
    No autograd: inputs that require grad are refused while grad mode is on.
    """
    cfg = config if config is not None else CuteQKVConfig()
    if not isinstance(cfg, CuteQKVConfig):
        raise TypeError(f"config must be a CuteQKVConfig, got {type(cfg).__name__}")
    check_positive_int("heads", heads)
    check_qkv_operands(x, w_qkv, b_qkv, head_dim, heads)
    named = {"x": x, "w_qkv": w_qkv, "turns": turns, "coords": coords}
    if b_qkv is not None:
        named["b_qkv"] = b_qkv
        if b_qkv.dtype not in BIAS_DTYPES:
            raise TypeError(f"b_qkv must be float32, bfloat16 or float16 (the kernel reads it "
                            f"as it is), got {b_qkv.dtype}")
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():  # the compiled kernel assumes compact rows
            raise ValueError(f"{name} must be contiguous")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    check_no_autograd("qkv_rope_linear_cute", x=x, w_qkv=w_qkv, b_qkv=b_qkv, turns=turns)
    n_cols = 3 * heads * head_dim
    if x.shape[1] % 8 or x.shape[0] < 1:
        raise ValueError(f"x must be (tokens >= 1, hidden) with hidden a multiple of 8 "
                         f"(16-byte TMA rows), got {tuple(x.shape)}")
    if turns.dtype != torch.float32 or tuple(turns.shape) != (n_cols // 2, 2):
        raise ValueError(f"turns must be rope_pair_turns' fp32 ({n_cols // 2}, 2), got "
                         f"{turns.dtype} {tuple(turns.shape)}")
    if coords.dtype != torch.int32 or tuple(coords.shape) != (x.shape[0], 2):
        raise ValueError(f"coords must be int32 (tokens, 2) = ({x.shape[0]}, 2), got "
                         f"{coords.dtype} {tuple(coords.shape)}")
    shape = (x.shape[0], 3, heads, head_dim)
    if out is not None:
        check_qkv_out(out, shape, x, named)
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] != 9:
        raise ValueError("qkv_rope_linear_cute runs on sm_90 GPUs (Hopper) only")
    if out is None:
        out = torch.empty(shape, device=x.device, dtype=x.dtype)
    out2d = out.view(x.shape[0], n_cols)
    for name, t in (("x", x), ("w_qkv", w_qkv), ("turns", turns), ("coords", coords),
                    ("out", out)):
        if t.data_ptr() % 16:  # TMA and the compiled kernel assume 16-byte aligned bases
            raise ValueError(f"{name} must start at a 16-byte aligned address (a view with an "
                             f"offset is not; pass a copy)")
    import cuda.bindings.driver as cuda
    stream = cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    fn = compile_kernel(cfg, x, w_qkv, out2d, turns, b_qkv, coords, 2 * heads * head_dim,
                        _max_clusters(cfg.cluster_m), stream)
    bias = _bias_operand(b_qkv, turns)
    fn(_cute_tensor(x, True), _cute_tensor(w_qkv, False), _cute_tensor(out2d, True),
       _cute_tensor(turns, False), _cute_tensor(bias, False, bias.element_size()),
       _cute_tensor(coords, True), stream)
    return out
