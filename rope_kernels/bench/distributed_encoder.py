"""The vision encoder over several GPUs with ``torch.distributed`` (issue 45): tp and dp for real.

Notebook 04 times one GPU's share of the encoder and models the collectives (``comm_ms``,
``encoder_parallel.py``). This runner runs the modes over a real process group and
measures the collectives from their own timing (CUDA events around each collective on a GPU,
the wall clock on a CPU):

- ``tp``: every rank holds its slice of one encoder's weights (``shard_encoder``: the shapes
  ``encoder_parallel.layer_gemms`` gives, q/k/v heads ``rank``'s, the row-parallel biases split
  so that the sum over ranks adds each once) and all-reduces the proj and fc2 outputs, two per
  layer: the ranks' sum is the whole encoder's output.
- ``dp``: every rank holds the whole encoder, encodes its share of the images (the first ranks
  ceil(n / world) each, as ``gpu_images``), and one all-gather (padded to the largest share, as
  vLLM pads) assembles the outputs in image order.

Run it under torchrun, e.g. on 8 GPUs (NVLink multicast off)::

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 8 -m rope_kernels.bench.distributed_encoder \\
        --mode tp --encoder kimi_k25 --resolution 1024x1024 --images 1 4 16 --out rows.csv

On a CPU the gloo backend runs it (tests/test_distributed_encoder.py: 2 processes).
Rows (rank 0 writes them): the encoder rows' key columns, ``median_ms`` (one forward, the
collectives included, slowest rank), ``comm_ms`` (the collectives' measured time, median over
rounds), ``world_size``, ``encoder_parallel`` (``tp<world>``/``dp<world>``) and ``timer``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from rope_kernels.encoder_config import EncoderConfig
from rope_kernels.encoder_parallel import gpu_images, layer_gemms
from rope_kernels.model.vit import MoonViTEncoder, encoder_inputs, pick_attention

MODES = ("tp", "dp")
STUDY_MODE = {"tp": "tp8", "dp": "dp8"}  # the study's mode each one is (over its own world)


def shard_encoder(full: MoonViTEncoder, mode: str, rank: int, world: int) -> MoonViTEncoder:
    """Rank ``rank``'s encoder of ``world``: for "tp" the slice of ``full``'s weights it holds
    (column-parallel QKV and fc1 rows, row-parallel proj and fc2 columns, their biases divided by
    ``world``: the all-reduce sums them back once), for "dp" a copy of ``full``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..{world - 1}, got {rank}")
    p = next(full.parameters())
    cfg = full.cfg
    if mode == "dp":
        out = MoonViTEncoder(cfg, device=p.device, dtype=p.dtype, encoder_parallel="1gpu")
        out.load_state_dict(full.state_dict())
        return out
    out = MoonViTEncoder(cfg, device=p.device, dtype=p.dtype, encoder_parallel="tp8", world=world)
    g = layer_gemms(cfg.hidden, cfg.heads, cfg.mlp, "tp8", world)
    heads, d = g["heads"]
    cols = slice(rank * heads * d, (rank + 1) * heads * d)  # this rank's heads in q, k or v
    mlp = slice(rank * g["fc1"][1], (rank + 1) * g["fc1"][1])
    state = full.state_dict()
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        w = state[b + "wqkv.weight"].view(3, cfg.hidden, cfg.hidden)[:, cols].reshape(-1, cfg.hidden)
        state[b + "wqkv.weight"] = w
        state[b + "wqkv.bias"] = state[b + "wqkv.bias"].view(3, cfg.hidden)[:, cols].reshape(-1)
        state[b + "wo.weight"] = state[b + "wo.weight"][:, cols]
        state[b + "wo.bias"] = state[b + "wo.bias"] / world
        state[b + "fc0.weight"] = state[b + "fc0.weight"][mlp]
        state[b + "fc0.bias"] = state[b + "fc0.bias"][mlp]
        state[b + "fc1.weight"] = state[b + "fc1.weight"][:, mlp]
        state[b + "fc1.bias"] = state[b + "fc1.bias"] / world
    out.load_state_dict({k: v.contiguous() for k, v in state.items()})
    return out


class _Clock:
    """Time spent in collectives: CUDA events around each on a GPU, the wall clock on a CPU."""

    def __init__(self, cuda: bool):
        self.cuda, self.spans = cuda, []

    def __call__(self, fn):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            self.spans.append((start, end))
        else:
            t0 = time.perf_counter()
            out = fn()
            self.spans.append(time.perf_counter() - t0)
        return out

    def take_ms(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            ms = sum(s.elapsed_time(e) for s, e in self.spans)
        else:
            ms = sum(self.spans) * 1e3
        self.spans = []
        return ms


def _all_reduce(clock: _Clock):
    def reduce(t: torch.Tensor) -> torch.Tensor:
        return clock(lambda: (dist.all_reduce(t), t)[1])
    return reduce


def _my_images(images: int, rank: int, world: int) -> tuple[int, int]:
    """(first image, count) of ``rank``'s share: ceil(n / world) to the first ranks."""
    per = math.ceil(images / world)
    first = min(images, rank * per)
    return first, max(0, min(per, images - first))


def distributed_forward(model: MoonViTEncoder, grids, patches: torch.Tensor, mode: str, rope: str,
                        attention: str, clock: _Clock) -> torch.Tensor:
    """One forward of the whole request over the group: every rank returns the full output."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "tp":
        model.all_reduce = _all_reduce(clock)
        return model(patches, grids, rope=rope, attention=attention)
    model.all_reduce = None
    first, count = _my_images(len(grids), rank, world)
    sizes = [t * h * w for t, h, w in grids]
    start = sum(sizes[:first])
    mine = grids[first:first + count]
    merged = [s // model.cfg.merge**2 for s in sizes]
    per = math.ceil(len(grids) / world)
    longest = max(sum(merged[r * per:(r + 1) * per]) for r in range(world))
    out = torch.zeros(longest, model.cfg.text_hidden, device=patches.device, dtype=patches.dtype)
    if count:
        own = model(patches[start:start + sum(sizes[first:first + count])], mine, rope=rope, attention=attention)
        out[:own.shape[0]] = own
    parts = [torch.empty_like(out) for _ in range(world)]
    clock(lambda: dist.all_gather(parts, out))
    return torch.cat([parts[r][:sum(merged[r * per:(r + 1) * per])] for r in range(world)])


def run_rows(model: MoonViTEncoder, *, mode: str, resolution: str, images: Sequence[int],
             variants: Sequence[str], samples: int, device, seed: int = 0) -> list[dict]:
    """Time ``samples`` rounds of one distributed forward per variant at each image count;
    rows (the same on every rank) with the slowest rank's forward and collective times."""
    from rope_kernels.bench.encoder_bench import make_bucket
    from rope_kernels.percentiles import median_p20_p80

    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = torch.device(device).type == "cuda"
    clock = _Clock(cuda)
    rows = []
    for n in images:
        b = make_bucket(resolution, n)
        inp = encoder_inputs(b.grids, model.cfg, device=device, dtype=next(model.parameters()).dtype, seed=seed)
        att = pick_attention(b.grids, device)
        for v in variants:
            distributed_forward(model, b.grids, inp.patches, mode, v, att, clock)  # warm-up
            clock.take_ms()
            forward, comm = [], []
            for _ in range(samples):
                dist.barrier()
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                distributed_forward(model, b.grids, inp.patches, mode, v, att, clock)
                if cuda:
                    torch.cuda.synchronize()
                took = torch.tensor([(time.perf_counter() - t0) * 1e3, clock.take_ms()], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
                forward.append(float(took[0]))
                comm.append(float(took[1]))
            (med, lo, hi), (cmed, _, _) = median_p20_p80(forward), median_p20_p80(comm)
            rows.append({"variant": v, "resolution": b.resolution, "images": n, "vit_tokens": b.vit_tokens,
                         "mode": "eager", "encoder_parallel": f"{mode}{world}", "world_size": world,
                         "study_mode": STUDY_MODE[mode], "gpu_images": gpu_images(STUDY_MODE[mode], n, world),
                         "median_ms": med, "p20_ms": lo, "p80_ms": hi, "samples": samples, "comm_ms": cmed,
                         "comm_model": "measured: the collectives' own time (CUDA events)" if cuda
                         else "measured: the collectives' own wall-clock time (gloo)",
                         "timer": "wall_clock_synchronized" if cuda else "wall_clock_cpu",
                         "backend": dist.get_backend(), "attention_kernel": att, "layers": model.cfg.layers,
                         "rank": rank})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the vision encoder's tp/dp modes over torch.distributed "
                                             "(run under torchrun)")
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--encoder", choices=("small", "kimi_k25"), default="small")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--resolution", default="56x56")
    ap.add_argument("--images", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variants", nargs="+", default=["native", "none"])
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--out", default="", help="CSV rank 0 writes (empty: print only)")
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        print("distributed_encoder: run under torchrun (RANK, WORLD_SIZE unset)", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        cfg = {"small": EncoderConfig.small, "kimi_k25": EncoderConfig.kimi_k25}[args.encoder]()
        if args.layers:
            cfg = cfg.with_layers(args.layers)
        dtype = getattr(torch, args.dtype)
        full = MoonViTEncoder(cfg, device="cpu", dtype=dtype, seed=0)  # the same weights on every rank
        model = shard_encoder(full, args.mode, rank, world).to(device)
        del full
        rows = run_rows(model, mode=args.mode, resolution=args.resolution, images=args.images,
                        variants=args.variants, samples=args.samples, device=device)
        if rank == 0:
            import pandas as pd

            from rope_kernels.provenance import provenance

            table = pd.DataFrame(rows).assign(**{k: v for k, v in provenance().items() if k not in rows[0]})
            print(table[["variant", "images", "encoder_parallel", "median_ms", "comm_ms"]].to_string(index=False))
            if args.out:
                table.to_csv(args.out, index=False)
        dist.barrier()  # no rank tears its pairs down while rank 0 still writes
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
