"""Input validation shared by every kernel entry point.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right
kind, wrong value) with a message that names the argument, so bad input never
reaches a Triton kernel, where it would crash or silently compute garbage.
The runtime switches the checks consult (Triton's interpreter, launch recording)
are in ``switches.py``, imported first: it makes the interpreter decision before
any Triton kernel is defined.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rope_kernels.kernels.switches import (  # noqa: F401  (before any kernel: the interpreter decision)
    launches_recorded,
    recording_launches,
    triton_interpreter_enabled,
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_qk(xq: torch.Tensor, xk: torch.Tensor) -> None:
    """q and k: 3-D (tokens, heads, head_dim), same shape/dtype/device, even head_dim."""
    for name, x in (("xq", xq), ("xk", xk)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(
                f"{name} must be 3-D (tokens, heads, head_dim), got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} dtype {x.dtype} is not supported; use float32, float16 or bfloat16"
            )
    if xq.shape != xk.shape:
        raise ValueError(f"xq and xk differ in shape: {tuple(xq.shape)} vs {tuple(xk.shape)}")
    if xq.dtype != xk.dtype:
        raise TypeError(f"xq and xk differ in dtype: {xq.dtype} vs {xk.dtype}")
    if xq.device != xk.device:
        raise ValueError(f"xq and xk are on different devices: {xq.device} vs {xk.device}")
    check_not_meta(xq, "the rotation")
    head_dim = xq.shape[-1]
    if head_dim == 0 or head_dim % 2 != 0:
        raise ValueError(f"head_dim must be positive and even (pairs are rotated), got {head_dim}")
    for name, x in (("xq", xq), ("xk", xk)):
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(
                f"{name} must have a unit-stride last dimension, got strides {tuple(x.stride())}"
            )


def check_rotation(rotation) -> str:
    """A rotation name (``vocabulary.ROTATIONS``): "pairs" (interleaved) or "half" (rotate-half)."""
    from rope_kernels.vocabulary import ROTATIONS

    if not isinstance(rotation, str):
        raise TypeError(f"rotation must be a string, one of {ROTATIONS}; got {rotation!r}")
    if rotation not in ROTATIONS:
        raise ValueError(f"unknown rotation {rotation!r}; known: {', '.join(ROTATIONS)} "
                         "(pairs: x[2j] with x[2j+1]; half: x[j] with x[j + head_dim/2])")
    return rotation


def check_cos_sin(cos: torch.Tensor, sin: torch.Tensor, xq: torch.Tensor) -> None:
    """cos/sin: float32 (tokens, head_dim/2), matching each other and q's device."""
    tokens, _, head_dim = xq.shape
    want = (tokens, head_dim // 2)
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (math is done in fp32), got {t.dtype}")
        if tuple(t.shape) != want:
            raise ValueError(
                f"{name} must have shape (tokens, head_dim/2) = {want}, got {tuple(t.shape)}"
            )
        if t.device != xq.device:
            raise ValueError(f"{name} is on {t.device} but xq is on {xq.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin differ in shape: {tuple(cos.shape)} vs {tuple(sin.shape)}")


def check_freqs_cis(freqs_cis: torch.Tensor, xq: torch.Tensor) -> None:
    """freqs_cis: complex64 (tokens, head_dim/2) on q's device."""
    if not isinstance(freqs_cis, torch.Tensor):
        raise TypeError(f"freqs_cis must be a torch.Tensor, got {type(freqs_cis).__name__}")
    if freqs_cis.dtype != torch.complex64:
        raise TypeError(f"freqs_cis must be complex64, got {freqs_cis.dtype}")
    tokens, _, head_dim = xq.shape
    want = (tokens, head_dim // 2)
    if tuple(freqs_cis.shape) != want:
        raise ValueError(
            f"freqs_cis must have shape (tokens, head_dim/2) = {want}, "
            f"got {tuple(freqs_cis.shape)}"
        )
    if freqs_cis.device != xq.device:
        raise ValueError(f"freqs_cis is on {freqs_cis.device} but xq is on {xq.device}")


def check_writable_in_place(xq: torch.Tensor, xk: torch.Tensor,
                            reads: Sequence[tuple[str, torch.Tensor]] = (), *,
                            names: tuple[str, str] = ("xq", "xk")) -> None:
    """In-place rotation needs every element of q and k at its own address:
    no broadcast or self-overlapping views, and no element shared by q and k.
    ``reads`` are the call's other inputs (cos, sin, freqs_cis): q and k, being
    written, may share no memory with them. ``names``: what the caller calls the two
    tensors written (``("q_out", "k_out")`` for an ``out=`` pair), as messages name them."""
    q_name, k_name = names
    written = "rotated in place" if names == ("xq", "xk") else "written"
    for name, x in ((q_name, xq), (k_name, xk)):
        for size, stride in zip(x.shape, x.stride()):
            if size > 1 and stride == 0:
                raise ValueError(
                    f"{name} is a broadcast (stride-0) view; it cannot be {written}"
                )
        if _nested_dims(x) is None:
            raise ValueError(
                f"{name}'s strides {tuple(x.stride())} may map two elements to one address; "
                "it cannot be written in place"
            )
    if xq.numel() > 0 and xq.data_ptr() == xk.data_ptr():
        raise ValueError(f"{q_name} and {k_name} are the same memory; they cannot both be "
                         f"{written}")
    if may_overlap(xq, xk):
        raise ValueError(f"{q_name} and {k_name} share memory (overlapping views); they cannot "
                         f"both be {written}")
    check_writes_do_not_overlap_reads(((q_name, xq), (k_name, xk)), reads)


# torch.autograd.graph.increment_version's own C call, without its Python wrapper (about half
# its host time: docs/DECISIONS.md, "In-place writes and autograd"); else the public one
_increment_version = getattr(torch._C, "_increment_version", None)
if _increment_version is None:  # pragma: no cover
    from torch.autograd.graph import increment_version as _increment_version

# torch's own words for an in-place write to an inference tensor outside inference mode
INFERENCE_TENSOR_WRITE = ("Inplace update to inference tensor outside InferenceMode is not "
                          "allowed. You can make a clone to get a normal tensor before doing "
                          "inplace update.")


def mark_written(xq: torch.Tensor, xk: torch.Tensor | None = None) -> None:
    """Tell autograd a kernel is about to write ``xq`` (and ``xk``) through their pointers,
    as torch's own in-place ops do: their version counters go up (a graph that saved either
    then refuses ``backward()`` with torch's error), and an inference-mode tensor is
    refused outside inference mode as ``x.mul_`` refuses it. No tensor op: two flag
    reads and one counter bump per call."""
    written = (xq,) if xk is None else (xq, xk)
    if (xq.is_inference() or xk is not None and xk.is_inference()) and \
            not torch.is_inference_mode_enabled():
        raise RuntimeError(INFERENCE_TENSOR_WRITE)
    _increment_version(written)


def check_writes_do_not_overlap_reads(writes: Sequence[tuple[str, torch.Tensor]],
                                      reads: Sequence[tuple[str, torch.Tensor]]) -> None:
    """No tensor a call writes may share memory with one it only reads (cos and sin
    read by every program while others write: the result would depend on timing)."""
    for out_name, out in writes:
        for in_name, x in reads:
            if isinstance(x, torch.Tensor) and may_overlap(out, x):
                raise ValueError(f"{out_name} is written but shares memory with {in_name}, "
                                 f"which the call reads; give {in_name} its own memory")


def check_outputs_do_not_overlap(xq: torch.Tensor, xk: torch.Tensor,
                                 q_out: torch.Tensor, k_out: torch.Tensor,
                                 reads: Sequence[tuple[str, torch.Tensor]] = ()) -> None:
    """``out=`` tensors: each may be its own input exactly (that is rotating in
    place), but no output may share memory with the other output or the other
    input, nor partly with its own input (programs would read what others wrote),
    nor with any of ``reads`` (cos, sin)."""
    check_writable_in_place(q_out, k_out, names=("q_out", "k_out"))
    check_writes_do_not_overlap_reads((("q_out", q_out), ("k_out", k_out)), reads)
    pairs = (("q_out", q_out, "xq", xq, True), ("q_out", q_out, "xk", xk, False),
             ("k_out", k_out, "xq", xq, False), ("k_out", k_out, "xk", xk, True))
    for out_name, out, in_name, x, own_input in pairs:
        if own_input and _same_view(out, x):
            continue
        if may_overlap(out, x):
            raise ValueError(f"{out_name} shares memory with {in_name}; give outputs that do "
                             f"not overlap the inputs (or {in_name} itself, or inplace=True)")


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def _nested_dims(x: torch.Tensor) -> list[tuple[int, int]] | None:
    """(size, stride) of the dims with more than one element, largest stride first, when
    each stride exceeds the span of every smaller-strided dim (then no two elements share
    an address, and an offset has at most two candidate indices per dim); else None."""
    dims = sorted(((n, s) for n, s in zip(x.shape, x.stride()) if n > 1), key=lambda d: d[1])
    span = 0
    for n, s in dims:
        if s <= span:
            return None
        span += (n - 1) * s
    return dims[::-1]


def _reachable(delta: int, dims: list[tuple[int, int]]) -> bool:
    """Is ``delta == sum(i_k * stride_k)`` for some |i_k| < size_k? Exact for nested dims:
    the rest spans less than this stride, so i_k is floor or ceil of delta / stride_k."""
    if not dims:
        return delta == 0
    (n, s), rest = dims[0], dims[1:]
    rest_span = sum((m - 1) * t for m, t in rest)
    for i in {delta // s, -(-delta // s)}:
        if abs(i) <= n - 1 and abs(delta - i * s) <= rest_span and _reachable(delta - i * s, rest):
            return True
    return False


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether any element of ``a`` shares a byte with an element of ``b``.

    Exact when both views have the same shape, strides and element size with nested
    strides (e.g. q and k unbound from one packed (T, 3, H, D) qkv: they interleave
    within one storage range without sharing an element); otherwise conservative:
    intersecting byte ranges count as overlap."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    spans = []
    for x in (a, b):
        start = x.data_ptr()
        end = start + (sum((n - 1) * s for n, s in zip(x.shape, x.stride())) + 1) * x.element_size()
        spans.append((start, end))
    (a0, a1), (b0, b1) = spans
    if a1 <= b0 or b1 <= a0:
        return False
    dims = _nested_dims(a)
    if (dims is None or a.shape != b.shape or a.stride() != b.stride()
            or a.element_size() != b.element_size()):
        return True
    size = a.element_size()
    delta_bytes = b0 - a0
    # Elements of size `size` share a byte when their offsets differ by less than one
    # element: the index difference is floor or ceil of delta / size.
    return any(_reachable(d, dims) for d in {delta_bytes // size, -(-delta_bytes // size)}
               if abs(delta_bytes - d * size) < size)


def check_not_meta(x: torch.Tensor, what: str) -> None:
    """``meta`` tensors (shapes without data) are refused except while launches are recorded."""
    if x.device.type == "meta" and not launches_recorded():
        raise ValueError(f"{what} got meta tensors (shapes without data): there is nothing "
                         "to read or write; pass tensors on a GPU (or on the CPU with "
                         "TRITON_INTERPRET=1)")


def check_triton_device(x: torch.Tensor, what: str) -> None:
    """Triton kernels need a GPU tensor, or the interpreter for CPU tensors; ``meta``
    tensors (shapes without data) only while launches are recorded."""
    check_not_meta(x, what)
    if x.device.type == "cpu" and not triton_interpreter_enabled():
        raise ValueError(
            f"{what} runs a Triton kernel and got CPU tensors; use a GPU "
            "(CUDA or ROCm) or set TRITON_INTERPRET=1 before rope_kernels.kernels is imported"
        )


def packed_qkv_of(xq: torch.Tensor, xk: torch.Tensor, who: str = "vllm_packed_qk") -> torch.Tensor:
    """The contiguous (T, 3, H, D) buffer that xq and xk are the q and k slices of.

    Packed-qkv kernels (vLLM's, QuACK's) rotate the packed buffer itself; q and k given
    any other way (separate tensors, another layout) cannot be handed to them.
    """
    tokens, heads, head_dim = xq.shape
    row = 3 * heads * head_dim
    packed = (xq.stride() == (row, head_dim, 1) and xk.stride() == xq.stride()
              and xq.untyped_storage().data_ptr() == xk.untyped_storage().data_ptr()
              and xk.storage_offset() == xq.storage_offset() + heads * head_dim
              and xq.untyped_storage().nbytes()
              >= (xq.storage_offset() + tokens * row) * xq.element_size())
    if not packed:
        raise ValueError(f"{who} rotates a packed qkv in place: xq and xk must be the "
                         "q and k slices (qkv.unbind(1)) of one contiguous (T, 3, H, D) tensor")
    return xq.as_strided((tokens, 3, heads, head_dim), (row, heads * head_dim, head_dim, 1))


# --------------------------------------------------------------------------
# The QKV projection with RoPE (kernels/qkv_gemm.py, kernels/qkv_cute.py, kernels/qkv.py)
# --------------------------------------------------------------------------

GEMM_DTYPES = (torch.bfloat16, torch.float16)


def check_positive_int(name: str, value) -> int:
    """``value`` as a positive int: TypeError for a non-int (2.0, "2", True), ValueError
    for zero or less."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_no_autograd(what: str, **tensors) -> None:
    """The QKV kernels record no autograd graph: refuse inputs that require grad while
    grad mode is on (their output would silently carry no grad_fn)."""
    if not torch.is_grad_enabled():
        return
    needing = [name for name, t in tensors.items()
               if isinstance(t, torch.Tensor) and t.requires_grad]
    if needing:
        raise ValueError(f"{what} does not support autograd, but {', '.join(needing)} "
                         f"require{'s' if len(needing) == 1 else ''} grad: run it under "
                         "torch.no_grad() or torch.inference_mode(), or detach the inputs")


def check_qkv_operands(x, w_qkv, b_qkv, head_dim: int, heads: int | None = None,
                       head_dim_from: str = "head_dim") -> int:
    """x (T, hidden) and W_qkv (3*heads*head_dim, hidden) of one GEMM dtype, b_qkv
    (3*heads*head_dim,) floating point or None, all on x's device; W contiguous, x with a
    unit last stride. ``heads`` None: read from W's rows (``head_dim_from`` names where
    head_dim came from, for the message). Returns heads."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (tokens, hidden), got shape {tuple(x.shape)}")
    if x.dtype not in GEMM_DTYPES:
        raise TypeError(f"x must be bfloat16 or float16, got {x.dtype}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"x must have a unit-stride last dimension, got strides {tuple(x.stride())}")
    check_positive_int("head_dim", head_dim)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 for Kimi's 2D RoPE, got {head_dim}")
    if not isinstance(w_qkv, torch.Tensor):
        raise TypeError(f"w_qkv must be a torch.Tensor, got {type(w_qkv).__name__}")
    if w_qkv.dtype != x.dtype:
        raise TypeError(f"w_qkv dtype {w_qkv.dtype} differs from x dtype {x.dtype}")
    if w_qkv.dim() != 2 or w_qkv.shape[1] != x.shape[1]:
        raise ValueError(f"w_qkv must have shape (3*heads*head_dim, {x.shape[1]}) for x of "
                         f"shape {tuple(x.shape)}, got {tuple(w_qkv.shape)}")
    if w_qkv.device != x.device:
        raise ValueError(f"w_qkv is on {w_qkv.device} but x is on {x.device}")
    if heads is None:
        if w_qkv.shape[0] % (3 * head_dim):
            raise ValueError(f"{head_dim_from} implies head_dim {head_dim}, which does not "
                             f"divide the {w_qkv.shape[0] // 3} columns of each of q, k, v")
        heads = w_qkv.shape[0] // (3 * head_dim)
    check_positive_int("heads", heads)
    if w_qkv.shape[0] != 3 * heads * head_dim:
        raise ValueError(f"w_qkv has {w_qkv.shape[0]} rows: not 3 * heads * head_dim = "
                         f"3 * {heads} * {head_dim} = {3 * heads * head_dim} (heads={heads} "
                         f"does not match the weight)")
    if not w_qkv.is_contiguous():
        raise ValueError(f"w_qkv must be contiguous, got strides {tuple(w_qkv.stride())}")
    if b_qkv is not None:
        if not isinstance(b_qkv, torch.Tensor):
            raise TypeError(f"b_qkv must be a torch.Tensor or None, got {type(b_qkv).__name__}")
        if tuple(b_qkv.shape) != (w_qkv.shape[0],):
            raise ValueError(f"b_qkv must have shape ({w_qkv.shape[0]},), got {tuple(b_qkv.shape)}")
        if not b_qkv.is_floating_point():
            raise TypeError(f"b_qkv must be floating point, got {b_qkv.dtype}")
        if b_qkv.device != w_qkv.device:
            raise ValueError(f"b_qkv is on {b_qkv.device} but w_qkv is on {w_qkv.device}")
    return heads


def check_patch_coords(coords, x: torch.Tensor, x_name: str = "x") -> None:
    """``coords``: each token's patch (row, column), int32 (tokens, 2), contiguous, one row
    per row of ``x`` and on its device (``x_name``: how the message names ``x``)."""
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"coords must be a torch.Tensor, got {type(coords).__name__}")
    if coords.device != x.device:
        raise ValueError(f"coords is on {coords.device} but {x_name} is on {x.device}")
    if coords.dtype != torch.int32:
        raise TypeError(f"coords must be int32 (row, column) pairs, got {coords.dtype}")
    if tuple(coords.shape) != (x.shape[0], 2) or not coords.is_contiguous():
        raise ValueError(f"coords must be contiguous with shape (tokens, 2) = ({x.shape[0]}, 2), "
                         f"got {tuple(coords.shape)}")


def check_qkv_out(out, shape: tuple, x: torch.Tensor, inputs: dict) -> None:
    """A given ``out=``: a contiguous tensor of the packed shape, x's dtype and device,
    sharing no memory with any of ``inputs`` (name -> tensor or None). Each message names
    ``out`` and what is wrong with it. A good one is marked written (``mark_written``):
    every caller writes it next."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)} (tokens, 3, heads, head_dim), "
                         f"got {tuple(out.shape)}")
    if out.dtype != x.dtype:
        raise TypeError(f"out must have x's dtype {x.dtype}, got {out.dtype}")
    if out.device != x.device:
        raise ValueError(f"out is on {out.device} but x is on {x.device}")
    if not out.is_contiguous():
        raise ValueError(f"out must be contiguous, got strides {tuple(out.stride())}")
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor) and may_overlap(out, t):
            raise ValueError(f"out shares memory with {name}; give an out that overlaps no input "
                             "(the kernel reads inputs while other tiles write out)")
    mark_written(out)  # every caller writes out next
