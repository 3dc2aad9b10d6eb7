"""Host time per eager call: the fused kernel (out of place and in place) against vLLM's
``packed_qk_rope_``, called as the encoder calls them (``Variant.packed`` on a layer's
packed qkv, cos/sin views made once per forward), timed by the study's host timer
(``timing.host_time_us``: a loop of calls that never waits for the device).

A benchmark to run, not a test. Two modes:

- on a GPU (default where CUDA is present): the real launches. This is what the
  microbench's ``host_us`` column and notebook 02 measure, for these three variants only
  (a run of seconds, no device timing).
- ``--stub`` (any machine; on the CPU set TRITON_INTERPRET=1): every Triton launch replaced
  by a recorder that takes its arguments and returns, so the figure is the Python-side
  work per call alone: checks, plan lookup, allocation, argument building. vLLM's stub sits
  at its ``kernel[grid](...)`` call, so its Triton run (argument binding, cache key) is not
  counted; ours at ``KernelLaunch.launch``, so the direct launch's driver calls are not
  either. The stub compares what each side does before Triton, not the launch.

``python -m rope_kernels.bench.host_path [--stub] [--tokens 1024 5476 ...] [--calls N]``
prints one line per (tokens, variant): median, p20 and p80 us per call and the median
over vLLM's at the same tokens; then what each way of making the two out-of-place outputs
costs (``ALLOCATIONS``), since vLLM's call is in place and allocates nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from rope_kernels.bench.timing import host_time_us
from rope_kernels.correctness import make_inputs
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.vocabulary import KIMI_HEAD_DIM, KIMI_TOKENS

VARIANTS = ("fused", "fused_inplace", "vllm_packed_qk")
REFERENCE = "vllm_packed_qk"
HEADS = 16


class _RecordingLaunch:
    """A Triton kernel stand-in: ``kernel[grid](*args, **kwargs)`` records and returns."""

    def __init__(self):
        self.calls = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls += 1
        return launch


@contextlib.contextmanager
def stubbed_launches():
    """Every launch of the fused kernel and of vLLM's ``packed_qk_rope_`` recorded, never run.
    Yields the number of launches so far (a callable)."""
    from rope_kernels.kernels.launch_plan import KernelLaunch
    from rope_kernels.peers.vllm import packed_qk_source

    module = packed_qk_source()[1]
    counts = {"ours": 0}
    vllm_stub = _RecordingLaunch()
    real_launch, real_kernel = KernelLaunch.launch, module._packed_qk_rope_kernel

    def record(self, *tensors):
        counts["ours"] += 1
        counts["args"] = (*tensors, *self._bound_tail)  # what the direct launch hands Triton

    KernelLaunch.launch = record
    module._packed_qk_rope_kernel = vllm_stub
    try:
        yield lambda: counts["ours"] + vllm_stub.calls
    finally:
        KernelLaunch.launch = real_launch
        module._packed_qk_rope_kernel = real_kernel


def _packed_set(tokens: int, dtype: torch.dtype, device) -> tuple:
    inp = make_inputs(tokens, HEADS, KIMI_HEAD_DIM, dtype, "cpu", seed=tokens)
    qkv, freqs_cis = inp.qkv.to(device), inp.freqs_cis.to(device)
    return (qkv, freqs_cis, *cos_sin_views(freqs_cis))


def host_rows(tokens_list, *, device, stub: bool, calls: int, repeats: int = 5,
              dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """One row per (tokens, variant): host us per call (median, p20, p80) and the median over
    ``REFERENCE``'s. Each variant rotates its own packed qkv (in-place ones rewrite theirs)."""
    from rope_kernels.variants import VARIANTS as REGISTRY

    rows = []
    with stubbed_launches() if stub else contextlib.nullcontext():
        for tokens in tokens_list:
            timings = {}
            for name in VARIANTS:
                variant = REGISTRY[name]
                args = _packed_set(tokens, dtype, device)
                timings[name] = host_time_us(variant.packed, [args], calls=calls,
                                             repeats=repeats, warmup=3)
            ref = timings[REFERENCE].median_us
            for name, t in timings.items():
                rows.append({"tokens": tokens, "heads": HEADS, "head_dim": KIMI_HEAD_DIM,
                             "variant": name, "mode": "stub" if stub else "launch",
                             "host_us": t.median_us, "host_p20_us": t.p20_us,
                             "host_p80_us": t.p80_us, "x_vllm": t.median_us / ref})
    return rows


# How out-of-place outputs could be made (kernels/launch_plan.new_outputs uses "empty_like"):
# each made and dropped per call, as the loop drops a call's outputs.
ALLOCATIONS = {
    "empty": lambda x: (torch.empty(x.shape, dtype=x.dtype, device=x.device),
                        torch.empty(x.shape, dtype=x.dtype, device=x.device)),
    "empty_like": lambda x: (torch.empty_like(x, memory_format=torch.contiguous_format),
                             torch.empty_like(x, memory_format=torch.contiguous_format)),
    "one_buffer_unbind": lambda x: torch.empty((2, *x.shape), dtype=x.dtype,
                                               device=x.device).unbind(0),
}


def allocation_rows(tokens_list, *, device, calls: int, repeats: int = 5,
                    dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """Host us per call of each way in ``ALLOCATIONS`` to make a (q_out, k_out) pair like
    q of the packed qkv (on a GPU: CUDA's caching allocator; on the CPU the C allocator's
    own behaviour, which says little about a GPU)."""
    rows = []
    for tokens in tokens_list:
        q = _packed_set(tokens, dtype, device)[0][:, 0]
        for name, make in ALLOCATIONS.items():
            t = host_time_us(make, [(q,)], calls=calls, repeats=repeats, warmup=3)
            rows.append({"tokens": tokens, "allocation": name, "host_us": t.median_us,
                         "host_p20_us": t.p20_us, "host_p80_us": t.p80_us})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stub", action="store_true",
                        help="launches recorded, never run: the Python-side work per call")
    parser.add_argument("--tokens", type=int, nargs="+", default=None,
                        help="token counts (default: Kimi's on a GPU, 1024 with --stub on the CPU)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops (p20/p80 over them)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.stub:
        parser.error("no GPU here: pass --stub (and set TRITON_INTERPRET=1)")
    tokens = args.tokens or (list(KIMI_TOKENS) if device == "cuda" else [1024])
    rows = host_rows(tokens, device=device, stub=args.stub, calls=args.calls, repeats=args.repeats)
    print(f"host us per eager Variant.packed call, {HEADS} x {KIMI_HEAD_DIM} bf16 on {device}"
          f" ({'launches stubbed' if args.stub else 'real launches'}; median [p20, p80])")
    for r in rows:
        print(f"{r['tokens']:>7} {r['variant']:<15} {r['host_us']:7.2f} "
              f"[{r['host_p20_us']:.2f}, {r['host_p80_us']:.2f}]  x vLLM {r['x_vllm']:.3f}")
    print("host us per (q_out, k_out) pair made and dropped, by allocation (median [p20, p80])")
    for r in allocation_rows(tokens, device=device, calls=args.calls, repeats=args.repeats):
        print(f"{r['tokens']:>7} {r['allocation']:<18} {r['host_us']:7.2f} "
              f"[{r['host_p20_us']:.2f}, {r['host_p80_us']:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
