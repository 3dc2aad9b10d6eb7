"""Check any RoPE implementation against a float64 reference on fresh random data.

Tolerances follow flash-attention's tests: in fp32 the error must be tiny
(1e-5 of the output's scale); in bf16/fp16 a kernel may be at most 2x as far
from float64 as PyTorch's own native path in the same dtype, plus a small
floor (``lowp_tolerance``). Inputs are random normal (never zeros) and angles random, drawn anew
for every check, so a kernel must compute the function, not match a fixture;
the seed they were drawn from is in every result (``CheckResult.seed``), and
``check_variant(..., seed=that)`` draws the same inputs again.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass

import torch

from rope_kernels.kernels.checks import check_rotation
from rope_kernels.kernels.reference import native_rope, rope_reference

FP32_REL_TOL = 1e-5
LOWP_RATIO = 2.0
LOWP_FLOOR = 1e-6  # relative to max|ref|


def lowp_tolerance(native_err: float, scale: float, dtype: torch.dtype) -> float:
    """The bf16/fp16 rule: at most ``LOWP_RATIO`` x the native path's own error.

    Native's error is its largest over the sample, but never taken below its worst
    case on one rounding of the output (half an ulp of ``dtype`` at the output's
    scale, ``scale`` = max|ref|): with a handful of elements (1 token x 4 dims) the
    sample's largest error is a noisy, often far smaller yardstick, and a kernel
    that rounds once more (cos/sin in the data's dtype) failed it in 1 of 11 draws
    while passing at every realistic size. On large samples native reaches that
    half ulp anyway, so the rule there is unchanged.
    """
    half_ulp = 0.0
    if scale > 0 and math.isfinite(scale):
        half_ulp = 0.5 * torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(scale))
    return LOWP_RATIO * max(native_err, half_ulp) + LOWP_FLOOR * scale


@dataclass(frozen=True)
class RopeInputs:
    qkv: torch.Tensor | None  # the packed buffer when packed=True
    xq: torch.Tensor
    xk: torch.Tensor
    freqs_cis: torch.Tensor
    seed: int = 0  # what they were drawn from (make_inputs(..., seed=seed) draws them again)


def new_seed() -> int:
    """A fresh seed for one check's inputs (from the OS; torch's global RNG untouched)."""
    return secrets.randbits(32)


def draw_rope_inputs(gen: torch.Generator, tokens: int, heads: int, head_dim: int,
                     dtype: torch.dtype, device=None, *, packed: bool = True) -> RopeInputs:
    """The one generator of RoPE inputs (checks, benchmarks and notebooks draw here):
    q/k random normal (views of a packed (T, 3, H, D) qkv by default), angles uniform
    in +-64 pi (large angles, as far-off patches have). Drawn from ``gen`` on its own
    device, then cast to ``dtype`` and moved to ``device`` (default: gen's)."""
    device = gen.device if device is None else device

    def normal(*shape):
        return torch.randn(shape, generator=gen, device=gen.device).to(dtype).to(device)

    if packed:
        qkv = normal(tokens, 3, heads, head_dim)
        xq, xk, _ = qkv.unbind(1)
    else:
        qkv = None
        xq, xk = normal(tokens, heads, head_dim), normal(tokens, heads, head_dim)
    angles = (torch.rand(tokens, head_dim // 2, generator=gen, device=gen.device) * 2 - 1) \
        * math.pi * 64
    freqs_cis = torch.polar(torch.ones_like(angles), angles).to(device)
    return RopeInputs(qkv, xq, xk, freqs_cis, int(gen.initial_seed()))


def draw_qkv_problem(gen: torch.Generator, grids, hidden: int, heads: int, head_dim: int,
                     dtype: torch.dtype = torch.bfloat16, device=None, *, bias: bool = True):
    """The one generator of QKV-projection inputs (the QKV GEMM's tests and benchmark):
    x (T, hidden) and b random normal, W (3 H D, hidden) scaled by 1/sqrt(hidden) (outputs
    of order one), drawn from ``gen`` on its device, cast to ``dtype``, moved to
    ``device``; and Kimi's freqs_cis for the images' patch ``grids``. Returns
    (x, w, b or None, freqs_cis)."""
    from rope_kernels.kernels.freqs import grid_tokens, vision_freqs_cis

    device = gen.device if device is None else device
    tokens, out_features = grid_tokens(grids), 3 * heads * head_dim

    def normal(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen, device=gen.device) * scale).to(dtype).to(device)

    x = normal(tokens, hidden)
    w = normal(out_features, hidden, scale=hidden ** -0.5)
    b = normal(out_features) if bias else None
    return x, w, b, vision_freqs_cis(grids, head_dim, device=device)


def make_inputs(
    tokens: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    *,
    packed: bool = True,
    seed: int | None = None,
) -> RopeInputs:
    """One check's inputs (``draw_rope_inputs``) from ``seed`` (a fresh one when None;
    recorded in the result), drawn on the CPU so a seed means the same inputs on
    every device."""
    seed = new_seed() if seed is None else int(seed)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return draw_rope_inputs(gen, tokens, heads, head_dim, dtype, device, packed=packed)


@dataclass(frozen=True)
class CheckResult:
    variant: str
    tokens: int
    heads: int
    head_dim: int
    dtype: str
    packed: bool
    max_abs_err: float
    rel_err: float  # ||out - ref|| / ||ref||
    native_max_abs_err: float
    tolerance: float
    inputs_intact: bool  # v untouched (in place) / q, k, v untouched (out of place)
    passed: bool  # False where unsupported: see supported / reason
    supported: bool = True  # False: the implementation does not take these inputs (not run)
    reason: str = ""  # why unsupported
    peer_package: str = ""  # provenance of someone else's code (empty for ours)
    peer_version: str = ""
    peer_sha256: str = ""
    seed: int = 0  # the inputs' seed: check_variant(..., seed=seed) replays this check
    rotation: str = "pairs"  # vocabulary.ROTATIONS: how each head's elements pair up

    def as_dict(self) -> dict:
        return asdict(self)


def max_abs_error(outs, refs) -> float:
    """Largest |out - ref| over paired tensors (outputs against their float64 references)."""
    errs = [(o.detach().double() - r).abs().max().item() for o, r in zip(outs, refs)]
    return max(errs)


def _rel(outs, refs) -> float:
    num = sum(((o.detach().double() - r) ** 2).sum().item() for o, r in zip(outs, refs))
    den = sum((r**2).sum().item() for r in refs)
    return math.sqrt(num / den) if den > 0 else math.inf


def check_variant(
    fn,
    *,
    tokens: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    packed: bool = True,
    inplace: bool | None = None,
    seed: int | None = None,
    name: str | None = None,
    rotation: str = "pairs",
) -> CheckResult:
    """Run ``fn(xq, xk, freqs_cis) -> (q, k)`` once and judge it against float64.

    A registry ``Variant`` that does not take these inputs (dtype, layout, head_dim)
    is not run: the result says ``supported=False`` and why. Its peer columns are copied.

    ``inplace`` (default: ``fn.inplace`` if present) says the function writes
    into its inputs; it then gets the packed buffer's views and v must stay
    untouched. Out-of-place functions get inputs they must not modify.

    ``rotation`` ("pairs" or "half"): the float64 reference pairs each head that way and
    a registry ``Variant`` is called with it (``fn(xq, xk, freqs_cis, rotation)``); the
    low-precision yardstick is native's own error in that rotation (for "half", Qwen's
    PyTorch path: ``native_rope``).
    """
    check_rotation(rotation)
    if inplace is None:
        inplace = bool(getattr(fn, "inplace", False))
    seed = new_seed() if seed is None else int(seed)
    name = name or getattr(fn, "name", getattr(fn, "__name__", "custom"))
    peer = dict(getattr(fn, "peer_columns", {}))
    unsupported = (fn.unsupported(dtype, packed=packed, head_dim=head_dim, rotation=rotation)
                   if hasattr(fn, "unsupported") else "")
    if unsupported:  # recorded, not hidden: a row that says why it was not run
        return CheckResult(
            variant=name, tokens=tokens, heads=heads, head_dim=head_dim,
            dtype=str(dtype).removeprefix("torch."), packed=packed, max_abs_err=math.nan,
            rel_err=math.nan, native_max_abs_err=math.nan, tolerance=math.nan,
            inputs_intact=True, passed=False, supported=False, reason=unsupported, **peer,
            seed=seed, rotation=rotation)
    inp = make_inputs(tokens, heads, head_dim, dtype, device, packed=packed, seed=seed)
    ref = rope_reference(inp.xq, inp.xk, inp.freqs_cis, rotation)
    native = native_rope(inp.xq, inp.xk, inp.freqs_cis, rotation)
    native_err = max_abs_error(native, ref)
    yardstick = native_err
    if dtype != torch.float32 and getattr(fn, "table_in_data_dtype", False):
        # the kernel is handed cos/sin rounded to the data's dtype (its engine's contract):
        # judge it against native's error with that same table, not the fp32 one
        fc = inp.freqs_cis
        rounded = torch.complex(fc.real.to(dtype).float(), fc.imag.to(dtype).float())
        yardstick = max(native_err, max_abs_error(native_rope(inp.xq, inp.xk, rounded, rotation), ref))
    watched = _untouchable(inp, inplace)
    before = [t.clone() for t in watched]

    _poison_allocator(inp.xq)
    outs = (fn(inp.xq, inp.xk, inp.freqs_cis, rotation) if rotation != "pairs"
            else fn(inp.xq, inp.xk, inp.freqs_cis))
    if not isinstance(outs, (tuple, list)) or len(outs) != 2:
        raise TypeError(f"{name} must return a (q, k) pair")
    outs = tuple(outs)
    if any(tuple(o.shape) != tuple(inp.xq.shape) or o.dtype != dtype for o in outs):
        raise TypeError(f"{name} returned tensors of the wrong shape or dtype")

    err = max_abs_error(outs, ref)
    scale = max(r.abs().max().item() for r in ref)
    if dtype == torch.float32:
        tol = FP32_REL_TOL * scale
    else:
        tol = lowp_tolerance(yardstick, scale, dtype)
    untouched = all(torch.equal(a, b) for a, b in zip(watched, before))
    passed = bool(err <= tol) and untouched and all(bool(torch.isfinite(o).all()) for o in outs)
    return CheckResult(
        variant=name, tokens=tokens, heads=heads, head_dim=head_dim,
        dtype=str(dtype).removeprefix("torch."), packed=packed,
        max_abs_err=err, rel_err=_rel(outs, ref), native_max_abs_err=native_err,
        tolerance=tol, inputs_intact=untouched, passed=passed, **peer, seed=seed,
        rotation=rotation,
    )


def _untouchable(inp: RopeInputs, inplace: bool) -> list[torch.Tensor]:
    """What the call must leave alone: v when rotating in place, everything otherwise."""
    if inp.qkv is not None:
        return [inp.qkv[:, 2]] if inplace else [inp.qkv]
    return [] if inplace else [inp.xq, inp.xk]


def _poison_allocator(like: torch.Tensor, copies: int = 8) -> None:
    """Leave NaN-filled blocks of the output's size in the CUDA caching allocator,
    so an output element a kernel forgets to write reads NaN, not stale data.
    (On the CPU freed memory is not reused predictably; tests poison ``out=``.)"""
    if like.device.type != "cuda":
        return
    blocks = [torch.full(like.shape, float("nan"), dtype=like.dtype, device=like.device)
              for _ in range(copies)]
    del blocks
