"""One device call (about a minute on an H200): the fused kernel's launch candidates
against the default and the peers to beat, at Kimi's shapes.

Times, per shape (2, 4 and 16 heads x 72 at 21904 and 87616 tokens; --quick: 21904
only, fewer candidates), with the project's own timing (``bench.microbench.bench_shape``:
bf16, CUDA graphs, inputs rotated past the L2, shuffled rounds, in-place runs on input
sets of their own): the default ``fused`` and ``fused_inplace``, each candidate of
``bench/fused_candidates.py`` (whole-token rows at 1-8 KB tiles, padded rows, the
tiles kernel that was the default before rows, cache hints on rows and on tiles; out of
place and in place) and the peers from
the registry, SGLang's Triton ``sglang_vision`` (out of place) and vLLM 0.33's
``vllm_packed_qk`` (in place); an absent peer is listed with its reason. Every
candidate is first checked against float64 at a small shape (a wrong one is dropped
and named). Prints one compact table per shape: time, % of the copy ceiling, % of an
SM copy of the same bytes, and the like-for-like ratio (time of the peer / time of
the row: in place against vllm_packed_qk, out of place against sglang_vision; > 1:
the row is faster). Writes $OUT/fused_explore.csv (or ./probe-out).

    python tools/fused_explore.py [--quick]      # carry .peers (vLLM's, SGLang's pinned files)

Only the two peers above are needed: without ``tools/device_setup.sh``'s environment the
CUDA-JIT peers (SGLang's Kimi-K2.5 path, FlashInfer) are absent at once instead of being
built when the registry loads (10-60 s).

Runs on a CPU too (a smoke test of the plumbing under TRITON_INTERPRET=1, tiny shapes:
not a measurement).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

t_start = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rope_kernels

from rope_kernels.bench.microbench import Shape, bench_shape  # noqa: E402
from rope_kernels.bench.timing import copy_bandwidth_gbps  # noqa: E402
from rope_kernels.correctness import check_variant  # noqa: E402
from rope_kernels.kernels.fused import (ROWS_TILE_BYTES, fused_launch_config,  # noqa: E402
                                        rows_launch_config)
from rope_kernels.bench.fused_candidates import (FusedCandidate, TilesConfig,  # noqa: E402
                                                   tiles_launch_config)
from rope_kernels.kernels.reference import cos_sin_views  # noqa: E402
from rope_kernels.provenance import provenance  # noqa: E402
from rope_kernels.variants import VARIANTS, Variant, absent_reason  # noqa: E402

PEER_OUT_OF_PLACE = "sglang_vision"
PEER_IN_PLACE = "vllm_packed_qk"
HINTS = {"evict_first": ("evict_first", ""), "cs": ("", ".cs"), "hints": ("evict_first", ".cs")}


def _default(in_place=False):
    def make(heads, head_dim, size):
        return FusedCandidate("rows", fused_launch_config(heads, head_dim, size),
                              in_place=in_place)
    return make


def _tiles(hints="", in_place=False):
    def make(heads, head_dim, size):
        d = tiles_launch_config(heads, head_dim, size)
        return FusedCandidate("tiles", TilesConfig(d.block_t, d.block_h, d.num_warps,
                                                   *HINTS.get(hints, ("", ""))),
                              in_place=in_place)
    return make


def _rows(tile=ROWS_TILE_BYTES, hints="", padded=False, in_place=False):
    def make(heads, head_dim, size):
        ev, cm = HINTS.get(hints, ("", ""))
        cfg = rows_launch_config(heads, head_dim, size, tile, eviction_policy=ev,
                                 store_cache_modifier=cm, padded=padded)
        return FusedCandidate("rows", cfg, in_place=in_place)
    return make


# name -> (in --quick, candidate for (heads, head_dim, element size))
CANDIDATES = {
    "tiles": (True, _tiles()),
    "tiles_inplace": (True, _tiles(in_place=True)),
    "tiles_hints": (False, _tiles("hints")),
    "tiles_hints_inplace": (False, _tiles("hints", in_place=True)),
    "rows_512": (False, _rows(512)),
    "rows_512_inplace": (False, _rows(512, in_place=True)),
    "rows_1k": (False, _rows(1024)),
    "rows_1k_inplace": (False, _rows(1024, in_place=True)),
    "rows_2k": (True, _rows(2048)),
    "rows_4k": (True, _rows(4096)),
    "rows_8k": (False, _rows(8192)),
    "rows_2k_inplace": (True, _rows(2048, in_place=True)),
    "rows_4k_inplace": (False, _rows(4096, in_place=True)),
    "rows_padded_2k": (True, _rows(2048, padded=True)),
    "rows_padded_2k_inplace": (True, _rows(2048, padded=True, in_place=True)),
    "rows_hints_2k": (False, _rows(2048, "hints")),
    "rows_hints_2k_inplace": (False, _rows(2048, "hints", in_place=True)),
    "rows_padded_hints_2k": (False, _rows(2048, "hints", padded=True)),
    "rows_padded_hints_2k_inplace": (False, _rows(2048, "hints", padded=True, in_place=True)),
}


def candidate_variant(name: str, make) -> Variant:
    """A candidate as a registry-shaped Variant, so bench_shape times it like the others."""
    in_place = make(2, 8, 2).in_place

    def fn(xq, xk, freqs_cis):
        cand = make(xq.shape[1], xq.shape[2], xq.element_size())
        return cand(xq, xk, *cos_sin_views(freqs_cis))

    return Variant(name=name, fn=fn, launches=1, launches_fp32=1, inplace=in_place,
                   description=f"fused launch candidate {name}")


def describe(name: str, make, shape: Shape) -> str:
    if name in CANDIDATES or name in ("fused", "fused_inplace"):
        cand = make(shape.heads, shape.head_dim, 2)
        c = cand.config
        tile = (f"{c.block_t}t x {shape.heads if cand.strategy == 'rows' else c.block_h}h"
                + (" padded" if cand.label == "rows_padded" else ""))
        hints = "/".join(h for h in (c.eviction_policy, c.store_cache_modifier) if h)
        return f"{cand.label} {tile} {c.num_warps}w{' ' + hints if hints else ''}"
    return "peer"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="21904 tokens only and the main candidates (about half the time)")
    ap.add_argument("--tokens", type=int, nargs="+", help="token counts (default 21904 87616)")
    ap.add_argument("--heads", type=int, nargs="+", default=[2, 4, 16])
    ap.add_argument("--head-dim", type=int, default=72)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--candidates", nargs="+", choices=sorted(CANDIDATES),
                    help="time only these candidates (besides the defaults and the peers)")
    args = ap.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = device == "cuda"
    tokens = args.tokens or ([21904] if args.quick else [21904, 87616])
    if not gpu:  # the interpreter: a smoke test of the plumbing
        tokens, args.heads = [7], args.heads[:1]
    samples = args.samples or (8 if args.quick else 10) if gpu else 1
    out = Path(os.environ.get("OUT", "probe-out"))
    out.mkdir(parents=True, exist_ok=True)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    print(provenance(), flush=True)

    makers = {"fused": _default(), "fused_inplace": _default(in_place=True)}
    variants = [VARIANTS["fused"], VARIANTS["fused_inplace"]]
    for name, (quick, make) in CANDIDATES.items():
        if (name in args.candidates) if args.candidates else (quick or not args.quick):
            makers[name] = make
            variants.append(candidate_variant(name, make))
    peers = {}
    for name in (PEER_OUT_OF_PLACE, PEER_IN_PLACE):
        why = absent_reason(name)
        if why:
            print(f"{name}: absent ({why})", flush=True)
        else:
            peers[name] = VARIANTS[name]
    # a candidate that disagrees with float64 is named and dropped, never timed; checked
    # at the most heads timed (the same compiled kernels the timing runs: tokens are not
    # specialised), an odd token count
    checked = []
    for v in variants:
        res = check_variant(v, tokens=37 if gpu else 5, heads=max(args.heads),
                            head_dim=args.head_dim, dtype=torch.bfloat16, device=device)
        if res.passed:
            checked.append(v)
        else:
            print(f"DROPPED {v.name}: error {res.max_abs_err:.3g} > tol {res.tolerance:.3g}, "
                  f"inputs intact {res.inputs_intact}", flush=True)
    copy = copy_bandwidth_gbps(device)
    mode = "cudagraph" if gpu else "eager"
    print(f"checks done, copy ceiling {copy:.0f} GB/s, at {time.time() - t_start:.0f} s",
          flush=True)

    rows = []
    for t in tokens:
        for h in args.heads:
            shape = Shape(t, h, args.head_dim)
            # a candidate that launches what another already does at this shape is timed once
            seen, todo, same = {}, [], {}
            for v in checked:
                key = makers[v.name](h, args.head_dim, 2) if v.name in makers else v.name
                if key in seen:
                    same[v.name] = seen[key]
                else:
                    seen[key] = v.name
                    todo.append(v)
            timed = bench_shape(todo + list(peers.values()), shape, torch.bfloat16, [mode],
                                device=device, copy_gbps=copy, samples=samples,
                                rounds=args.rounds)
            by_name = {r["variant"]: r for r in timed}
            for name, twin in same.items():
                by_name[name] = {**by_name[twin], "variant": name, "same_launch_as": twin}
            for name, r in by_name.items():
                peer = PEER_IN_PLACE if r["in_place"] else PEER_OUT_OF_PLACE
                peer_us = by_name[peer]["median_us"] if peer in by_name else float("nan")
                rows.append({**r, "launch": describe(name, makers.get(name), shape),
                             "like_for_like_peer": peer if name not in peers else "",
                             "peer_over_this": peer_us / r["median_us"]
                             if name not in peers else float("nan")})
            print(f"{t} x {h} x {args.head_dim} done at {time.time() - t_start:.0f} s",
                  flush=True)

    df = pd.DataFrame(rows)
    df.assign(**provenance()).to_csv(out / "fused_explore.csv", index=False)
    what = "cudagraph, cold L2" if gpu else "eager on the CPU interpreter (not a measurement)"
    print(f"\nbf16, {what}; copy ceiling {copy:.0f} GB/s; peer/this > 1: this row is faster "
          f"than {PEER_OUT_OF_PLACE} (out of place) or {PEER_IN_PLACE} (in place)")
    for (t, h), g in df.groupby(["tokens", "heads"], sort=True):
        g = g.sort_values(["in_place", "median_us"])
        table = pd.DataFrame({
            "variant": g["variant"], "in_place": g["in_place"], "launch": g["launch"],
            "us": g["median_us"].round(2), "pct_copy": g["pct_of_copy"].round(1),
            "pct_same_bytes_copy": g["pct_of_same_bytes_copy"].round(1),
            "peer/this": g["peer_over_this"].round(3),
            "same_launch_as": g.get("same_launch_as", pd.Series("", index=g.index)).fillna(""),
        })
        print(f"\n{t} tokens x {h} heads x {args.head_dim}")
        print(table.to_string(index=False))
    print(f"\nwrote {out / 'fused_explore.csv'}; done in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
