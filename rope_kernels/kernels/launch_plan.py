"""The fused kernel's host path: a Triton launch derived once per layout and replayed.

``KernelLaunch`` is everything a launch needs besides its tensors: the kernel, the grid,
the scalar arguments (in the kernel's parameter order), the constexprs (by name, in
parameter order) and the warps. ``kernels.fused.rows_launch`` is the one function that
derives it; the checked launch calls it once, the plan cache keeps it.

``PlanCache``: what a call's checks and launch settings depend on, besides the tensors'
addresses, is its layout: the tensors' types, shapes, strides, dtypes and devices, their
addresses modulo 16 (vector width), whether sin sits one float after cos (the interleaved
freqs_cis views), in place or not, and any further option of the call (``extra``, e.g. a
rotation convention). A call whose layout was checked before needs only the checks that
depend on addresses: in place, that q and k do not overlap each other or cos/sin, by byte
ranges (exact: ranges that intersect go the full way). Plans hold numbers, never tensors.

How much this saves per call is measured by ``rope_kernels.bench.host_path`` (the Python
side, launch stubbed, ours against vLLM's ``packed_qk_rope_``) and on the GPU by the
microbench's ``host_us`` column; the dated figures are in docs/DECISIONS.md ("The fused
kernel's host path").
"""

from __future__ import annotations

import torch
import triton
from triton import knobs
from rope_kernels.kernels.checks import mark_written

# The direct launch repeats what JITFunction.run does after its cache lookup in Triton 3.6
# (runtime/jit.py: kernel.run(grid, stream, function, packed_metadata, launch_metadata,
# hooks, *bound_args.values())); another Triton goes through its own run every call.
_DIRECT_LAUNCH = triton.__version__.startswith("3.6.")
_JIT_RUN = triton.runtime.jit.JITFunction.run  # a patched run (launch counting) is honoured


class KernelLaunch:
    """One Triton kernel's launch on tensors of one layout: ``launch(*tensors)`` passes the
    tensors, then ``scalars``, then ``constexprs``. The first launch goes through Triton's
    run (compiling if needed); on a GPU it keeps the compiled kernel and later launches hand
    the same arguments straight to its launcher (Triton 3.6's own call, bound arguments)."""

    __slots__ = ("kernel", "grid", "scalars", "constexprs", "num_warps", "compiled", "device",
                 "_bound_tail")

    def __init__(self, kernel, grid: tuple, scalars: tuple, constexprs: dict, num_warps: int):
        self.kernel, self.grid, self.scalars, self.num_warps = kernel, grid, scalars, num_warps
        names = getattr(kernel, "arg_names", None)  # a recorder standing in for it has none
        if names is not None:  # the direct launch passes them by position
            tail = names[len(names) - len(constexprs):]
            if set(tail) != set(constexprs):
                raise ValueError(f"{getattr(kernel, '__name__', kernel)} ends in parameters "
                                 f"{tail}, got constexprs {list(constexprs)}")
            constexprs = {name: constexprs[name] for name in tail}
        self.constexprs = constexprs  # by name, in the kernel's parameter order
        self._bound_tail = (*scalars, *constexprs.values())
        self.compiled = None
        self.device = None

    def launch(self, *tensors) -> None:
        compiled = self.compiled
        if compiled is not None and type(self.kernel).run is _JIT_RUN:
            device = triton.runtime.driver.active.get_current_device()
            if device == self.device:
                stream = triton.runtime.driver.active.get_current_stream(device)
                args = (*tensors, *self._bound_tail)
                enter = knobs.runtime.launch_enter_hook
                meta = compiled.launch_metadata(self.grid, stream, *args) if enter is not None else None
                compiled.run(self.grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata,
                             meta, enter, knobs.runtime.launch_exit_hook, *args)
                return
        got = self.kernel[self.grid](*tensors, *self.scalars, **self.constexprs,
                                     num_warps=self.num_warps)
        if (_DIRECT_LAUNCH and tensors[0].device.type == "cuda"
                and hasattr(got, "packed_metadata") and hasattr(got, "function")):
            self.compiled, self.device = got, triton.runtime.driver.active.get_current_device()


def extent(x: torch.Tensor) -> int:
    """Bytes from a view's first element to the end of its last."""
    if x.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(x.shape, x.stride())) + 1) * x.element_size()


class LaunchPlan:
    """One checked layout: its launch (None where there is nothing to launch), the byte
    extents of q, k, cos and sin, and the q-k address deltas already checked in place."""

    __slots__ = ("launch", "extents", "qk_deltas")

    def __init__(self, launch: KernelLaunch | None, extents: tuple[int, int, int, int]):
        self.launch, self.extents = launch, extents
        self.qk_deltas: set[int] = set()


class PlanCache:
    """Plans by layout key (see the module docstring), at most ``max_plans`` of them (past
    that the table starts again: a bound, never a missed check)."""

    def __init__(self, max_plans: int = 256):
        self.plans: dict = {}
        self.max_plans = max_plans

    def __len__(self) -> int:
        return len(self.plans)

    def __contains__(self, key) -> bool:
        return key in self.plans

    def values(self):
        return self.plans.values()

    def clear(self) -> None:
        self.plans.clear()

    @staticmethod
    def key(xq, xk, cos, sin, inplace, extra=()):
        """The layout a plan is valid for, or None where only the full path may decide
        (not plain tensors, meta tensors, autograd involved). ``extra``: hashable options
        of the call that change its launch (each a new plan)."""
        T = torch.Tensor
        if not (type(xq) is T and type(xk) is T and type(cos) is T and type(sin) is T
                and type(inplace) is bool):
            return None
        if torch.is_grad_enabled() and (xq.requires_grad or xk.requires_grad or cos.requires_grad
                                        or sin.requires_grad):
            return None
        device = xq.device
        if device.type == "meta":
            return None
        cp = cos.data_ptr()
        return (xq.shape, xq.stride(), xk.shape, xk.stride(), xq.dtype, xk.dtype, device,
                xk.device, cos.shape, cos.stride(), sin.shape, sin.stride(), cos.dtype, sin.dtype,
                cos.device, sin.device, xq.data_ptr() % 16, xk.data_ptr() % 16, cp % 16,
                sin.data_ptr() - cp == 4, inplace, extra)

    def call(self, xq, xk, cos, sin, inplace, extra=()):
        """The call on a checked layout, or None: not seen before, or an address-dependent
        check that the full path must make. Out of place, two new contiguous outputs."""
        key = self.key(xq, xk, cos, sin, inplace, extra)
        plan = self.plans.get(key) if key is not None else None
        if plan is None:
            return None
        if inplace:
            q_len, k_len, c_len, s_len = plan.extents
            pq, pk, pc, ps = xq.data_ptr(), xk.data_ptr(), cos.data_ptr(), sin.data_ptr()
            q_end, k_end, c_end, s_end = pq + q_len, pk + k_len, pc + c_len, ps + s_len
            # byte ranges apart (written inline: this runs on every planned call)
            if not (q_end <= pk or k_end <= pq) and (pk - pq) not in plan.qk_deltas:
                return None
            if not ((q_end <= pc or c_end <= pq) and (q_end <= ps or s_end <= pq)
                    and (k_end <= pc or c_end <= pk) and (k_end <= ps or s_end <= pk)):
                return None
            mark_written(xq, xk)
            q_out, k_out = xq, xk
        else:
            q_out, k_out = new_outputs(xq)
            if (q_out.data_ptr() | k_out.data_ptr()) % 16:
                return None  # the plan's vector width assumed 16-byte aligned outputs
        if plan.launch is not None:
            plan.launch.launch(xq, xk, q_out, k_out, cos, sin)
        return q_out, k_out

    def remember(self, xq, xk, q_out, k_out, cos, sin, inplace, make_launch, extra=()):
        """After the full checks passed: this layout's plan (``make_launch()`` derives its
        launch, once), with this call's q-k delta recorded as checked; None where no plan
        applies (outputs not 16-byte aligned, which the plan's vector width assumes)."""
        key = self.key(xq, xk, cos, sin, inplace, extra)
        if key is None or (not inplace and (q_out.data_ptr() | k_out.data_ptr()) % 16):
            return None
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= self.max_plans:
                self.plans.clear()
            plan = self.plans[key] = LaunchPlan(make_launch(), (extent(xq), extent(xk),
                                                                extent(cos), extent(sin)))
        if inplace:
            if len(plan.qk_deltas) >= self.max_plans:
                plan.qk_deltas.clear()
            plan.qk_deltas.add(xk.data_ptr() - xq.data_ptr())
        return plan


_CONTIGUOUS = torch.contiguous_format


def new_outputs(xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh contiguous (q_out, k_out) like ``xq``. ``empty_like`` parses no dtype or device
    arguments, which is most of ``torch.empty``'s host time (one buffer split in two cost
    more: its ``unbind`` outweighed the allocator call it saved)."""
    return (torch.empty_like(xq, memory_format=_CONTIGUOUS),
            torch.empty_like(xq, memory_format=_CONTIGUOUS))
