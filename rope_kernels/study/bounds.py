"""Sizes a run can hold, judged before it starts.

Each notebook's largest working set is estimated from its parameters: the tensors it must
hold at once for its largest shape, counted as a lower bound (allocator slack, the timer's
cache-flush buffer and the kernels' temporaries come on top). A run whose estimate is over
the memory of the device it runs on is refused with the estimate, before anything runs:
it could only fail allocating after the notebooks before it had spent their time. The
runner calls ``memory_problems`` with the device's memory (``device_memory_bytes``);
``submit`` cannot know a compute node's memory and leaves the check to the run there.

The counts, per notebook (``es``: the dtype's element size; q, k: tokens x heads x head_dim):
01 q and k, their outputs and the float64 reference of both (2 x (2 es + 8) per element);
02 and 03 the packed qkv (3 es) and the two outputs (2 es); 04 the largest bucket's qkv
projection and MLP activations (tokens x (3 hidden + mlp)), in the run's dtype and in the
float32 copy of the encoder its outputs are checked against; 05 the input and the
projection's output (tokens x (hidden + 3 hidden) in bf16).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

from rope_kernels.study.specs import SPECS

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
QKV_HIDDEN = 1152  # the QKV benchmark's projection, 1152 -> 3 x 1152 (bench/qkv_bench.py)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def _largest(items: Iterator[tuple[int, str]]) -> tuple[int, str] | None:
    return max(items, default=None, key=lambda item: item[0])


def _qk_shapes(nb: str, v: Mapping) -> Iterator[tuple[int, str]]:
    """(bytes, what) for each shape a rotation notebook allocates."""
    if nb == "01_kernels":
        for t, h, d in v["shapes"]:
            for dtype in v["dtypes"]:
                es = ELEMENT_BYTES[dtype]
                yield 2 * t * h * d * (2 * es + 8), f"shape [{t}, {h}, {d}] in {dtype}"
    elif nb == "02_microbench":
        es = max(ELEMENT_BYTES[d] for d in v["dtypes"])
        from rope_kernels.towers import tower_families

        for family in v["families"]:
            if isinstance(family, dict) and set(family) == {"tower"}:  # a tower's own family
                family = tower_families([family["tower"]])[0]
            sizes = [x if isinstance(x, list) else [x] for x in
                     (family["tokens"], family["heads"], family["head_dim"])]
            t, h, d = (max(s) for s in sizes)
            yield 5 * t * h * d * es, f"family tokens {t} x heads {h} x head_dim {d}"
        if v["config_sweep"]:
            for t, h, d in v["sweep_shapes"]:
                yield 5 * t * h * d * ELEMENT_BYTES["bfloat16"], f"sweep shape [{t}, {h}, {d}]"
    elif nb == "03_profile":
        t, h, d = v["tokens"], v["heads"], v["head_dim"]
        yield 5 * t * h * d * ELEMENT_BYTES[v["dtype"]], f"tokens {t} x heads {h} x head_dim {d}"


def _tower_tokens(name: str, resolution: str, images: int) -> int:
    from rope_kernels.towers import get_tower

    return get_tower(name).tokens(resolution, images)


def _encoder_buckets(v: Mapping) -> Iterator[tuple[int, str]]:
    from rope_kernels.encoder_config import EncoderConfig
    from rope_kernels.vocabulary import resolution_tokens

    cfg = EncoderConfig.for_encoder(v["encoder"])
    per_token = (3 * cfg.hidden + cfg.mlp) * (ELEMENT_BYTES[v["dtype"]] + 4)
    by_resolution = v.get("image_counts_by_resolution") or {}
    for r in v["resolutions"]:
        for n in by_resolution.get(r, v["image_counts"]):
            # the main encoder's image rule: Kimi's, or its tower's (qwen3_vl, qwen25_vl)
            tokens = _tower_tokens(cfg.tower, r, n) if cfg.tower else resolution_tokens(r) * n
            if tokens <= v["max_tokens"]:  # the notebook skips larger buckets
                yield tokens * per_token, f"{n} images of {r} ({tokens} vision tokens)"
    # the further towers (notebook 04's `towers`), each by its own image rule and width
    tower_counts = v.get("tower_image_counts") or {}
    for name in v.get("towers") or ():
        tcfg = EncoderConfig.for_encoder(name)
        per_token = (3 * tcfg.hidden + tcfg.mlp * (2 if tcfg.gated_mlp else 1)) * (ELEMENT_BYTES[v["dtype"]] + 4)
        for r in v["resolutions"]:
            if tower_counts and r not in tower_counts:
                continue
            for n in tower_counts.get(r, by_resolution.get(r, v["image_counts"])):
                tokens = _tower_tokens(name, r, n)
                if tokens <= v["max_tokens"]:
                    yield tokens * per_token, f"{name}: {n} images of {r} ({tokens} vision tokens)"


def working_set(nb: str, values: Mapping) -> tuple[int, str] | None:
    """(bytes, what) of ``nb``'s largest working set with ``values`` (its defaults filled
    in from the spec), or None for a notebook that allocates no sized tensors."""
    v = {**SPECS[nb].defaults, **values}
    if nb in ("01_kernels", "02_microbench", "03_profile"):
        return _largest(_qk_shapes(nb, v))
    if nb == "04_ttft":
        return _largest(_encoder_buckets(v))
    if nb == "05_qkv_gemm":
        return _largest((t * 4 * QKV_HIDDEN * ELEMENT_BYTES["bfloat16"], f"qkv_tokens {t}")
                        for t in v["qkv_tokens"])
    return None


def memory_problems(params: Mapping[str, Mapping], memory: int, where: str) -> list[str]:
    """One line per notebook whose working set (``working_set``) is over ``memory``
    bytes, the memory of ``where`` (e.g. 'this GPU')."""
    problems = []
    for nb, values in params.items():
        found = working_set(nb, values)
        if found is not None and found[0] > memory:
            need, what = found
            problems.append(f"{nb}: {what} needs at least {_gb(need)} at once (estimated from "
                            f"the parameters), more than the {_gb(memory)} of {where}; "
                            "choose a smaller size")
    return problems


def device_memory_bytes(kind: str) -> tuple[int, str] | None:
    """(total memory, its name) of the device a ``kind`` run uses: the first GPU's, or
    this machine's RAM for 'cpu'; None where it cannot be told."""
    if kind == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's RAM"
        except (ValueError, OSError, AttributeError):
            return None
    import torch

    try:
        return torch.cuda.mem_get_info()[1], "this GPU"
    except (RuntimeError, AssertionError):
        return None
