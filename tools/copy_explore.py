"""Is the same-bytes copy family a limit? (H200 exploration, ~60 s.)

For a few shapes, times the RoPE variants and every copy tiling in the same rounds
(``bench.microbench.bench_shape``, cold L2, CUDA graphs) and prints each tiling's
median beside the variants', and which variants beat the fastest copy of their kind.
Usage: python tools/copy_explore.py [--quick] [--small [--extra]] [--shapes 87616x16x72,...]
        [--repeat N] [--pairs]

--pairs: time SGLang's cut (``pairs``) and vLLM's (``heads``) at other blocks and warps too;
--small: the launch-bound shapes (at most 5,476 tokens); --extra: time, beside the
family, candidate tilings that are not in it (more warps per token, other flat blocks),
to find a member that is a limit where the family is not; --shapes: these shapes only
(no JIT-built peer); --repeat: time each shape N times (is a row's lead over the copy
reproducible, or one run's noise?)."""

import sys

import pandas as pd
import torch

from rope_kernels.bench import microbench as mb
from rope_kernels.bench.timing import copy_bandwidth_gbps
from rope_kernels.variants import registry

captured = []
_fastest = mb.fastest_copy_timing


def spy(timings, inplace):
    captured.append({k: t.median_us for k, t in timings.items()})
    return _fastest(timings, inplace)


mb.fastest_copy_timing = spy
EXTRA = []
if "--extra" in sys.argv:
    from rope_kernels.bench import same_bytes_copy as sbc
    EXTRA = [sbc.CopyTiling("tokens", block_t=t, num_warps=w) for t, w in ((1, 2), (1, 4), (2, 4), (4, 8))]
    EXTRA += [sbc.CopyTiling("flat", block=b, num_warps=w)
              for b, w in ((128, 1), (512, 2), (512, 4), (2048, 4), (4096, 8))]
    EXTRA += [sbc.CopyTiling("fused", block_t=t, num_warps=w) for t, w in ((1, 1), (1, 2), (1, 4), (2, 4))]
if "--pairs" in sys.argv:  # SGLang's cut at other blocks and warps
    from rope_kernels.bench import same_bytes_copy as sbc
    EXTRA += [sbc.CopyTiling("pairs", block=b, num_warps=w)
              for b, w in ((64, 2), (128, 2), (128, 1), (256, 2), (256, 4), (512, 4), (512, 8),
                           (1024, 8))]
    EXTRA += [sbc.CopyTiling("heads", block_t=t, num_warps=w) for t, w in ((2, 4), (8, 4), (4, 2))]
if EXTRA:
    _family = mb.same_bytes_copy_tilings
    mb.same_bytes_copy_tilings = lambda *a: tuple(dict.fromkeys(_family(*a) + tuple(EXTRA)))


def _option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


NAMES = ("fused", "fused_inplace", "sglang_vision", "vllm_packed_qk", "sglang_kimi_k25")
if "--small" in sys.argv or "--shapes" in sys.argv:  # no JIT-built peer (QuACK needs its install)
    NAMES = NAMES[:4]
variants = [v for n, v in registry().items() if n in NAMES]
print("variants:", [v.name for v in variants], flush=True)
shapes = [mb.Shape(256, 3, 128), mb.Shape(1024, 2, 72), mb.Shape(21904, 2, 72),
          mb.Shape(87616, 2, 72), mb.Shape(21904, 4, 72), mb.Shape(21904, 16, 72),
          mb.Shape(87616, 16, 72), mb.Shape(5476, 16, 72)]
if "--quick" in sys.argv:
    shapes = shapes[1:4]
if "--small" in sys.argv:
    shapes = [mb.Shape(256, 3, 128), mb.Shape(256, 6, 128), mb.Shape(256, 16, 72),
              mb.Shape(1024, 2, 72), mb.Shape(1024, 16, 72), mb.Shape(5476, 2, 72)]
if "--shapes" in sys.argv:
    shapes = [mb.Shape(*map(int, s.split("x"))) for s in _option("--shapes", "").split(",")]
shapes = shapes * int(_option("--repeat", "1"))
ceiling = copy_bandwidth_gbps("cuda")
print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
pd.set_option("display.width", 250)
for shape in shapes:
    captured.clear()
    rows = mb.bench_shape(variants, shape, torch.bfloat16, ["cudagraph"], device="cuda",
                          copy_gbps=ceiling, samples=9, rounds=3)
    copies = {k: v for k, v in captured[-1].items() if k.startswith("same_bytes")}
    line = "  ".join(f"{k.replace('same_bytes_copy', 'c')}={v:.2f}" for k, v in sorted(copies.items()))
    print(f"\n== {shape.tokens}x{shape.heads}x{shape.head_dim}: {line}")
    df = pd.DataFrame(rows)[["variant", "in_place", "median_us", "pct_of_copy",
                             "same_bytes_copy_us", "same_bytes_copy_tiling",
                             "pct_of_same_bytes_copy"]]
    print(df.round(2).to_string(index=False), flush=True)
