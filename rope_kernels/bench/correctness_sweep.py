"""Float64 correctness rows for everything the study can time: every registered
variant on every dtype and shape (``correctness.check_variant``), and, for every
peer the registry knows that cannot run here, rows that say so and why. A peer
never silently drops out of ``correctness.csv``."""

from __future__ import annotations

import math

from rope_kernels.correctness import CheckResult, check_variant

ABSENT = "absent here: "  # how a row of a peer that could not run here starts its reason


def absent_rows(status: list[dict], dtypes, shapes, rotations=("pairs",)) -> list[dict]:
    """Rows for peers that could not run here (``variants.peer_status()`` entries
    with ``available`` False), one per dtype, shape and rotation: not run, ``supported``
    False, and the reason."""
    rows = []
    for s in status:
        if s["available"]:
            continue
        for dt in dtypes:
            for (tokens, heads, head_dim), rotation in ((sh, r) for sh in shapes for r in rotations):
                rows.append(CheckResult(
                    variant=s["name"], tokens=tokens, heads=heads, head_dim=head_dim,
                    dtype=str(dt).removeprefix("torch."), packed=True, max_abs_err=math.nan,
                    rel_err=math.nan, native_max_abs_err=math.nan, tolerance=math.nan,
                    inputs_intact=True, passed=False, supported=False,
                    reason=ABSENT + s["reason"], peer_package=s.get("package", ""),
                    peer_version=s.get("version", ""), peer_sha256=s.get("sha256", ""),
                    rotation=rotation,
                ).as_dict())
    return rows


def correctness_rows(names, dtypes, shapes, *, device, seed: int | None = None,
                     status: list[dict] | None = None, rotations=("pairs",)) -> list[dict]:
    """``check_variant`` of every named variant on every dtype and shape, and rows
    saying why each named peer that cannot run here did not. Empty ``names``: every
    registered variant and every peer the registry knows (``peer_status()``),
    available or not. ``dtypes``: names or torch dtypes; ``shapes``: [tokens, heads,
    head_dim] triples; ``seed``: the inputs' seed (None: a fresh one per check);
    ``rotations``: each shape is checked in each (a variant that does not implement one
    gets a row saying so, ``supported`` False)."""
    from rope_kernels.bench.microbench import parse_dtype
    from rope_kernels.variants import VARIANTS, get_variant, peer_status

    status = peer_status() if status is None else status
    absent = {s["name"]: s for s in status if not s["available"]}
    names = list(names) or list(VARIANTS) + [n for n in absent if n not in VARIANTS]
    dts = [parse_dtype(d) for d in dtypes]
    rows = []
    for name in names:
        if name in absent and name not in VARIANTS:
            rows += absent_rows([absent[name]], dts, shapes, rotations)
            continue
        variant = get_variant(name)
        for dt in dts:
            for (tokens, heads, head_dim), rotation in ((sh, r) for sh in shapes for r in rotations):
                rows.append(check_variant(variant, tokens=tokens, heads=heads, head_dim=head_dim,
                                          dtype=dt, device=device, seed=seed,
                                          rotation=rotation).as_dict())
    return rows


def absent(rows) -> "pd.Series":
    """Which rows (a DataFrame of these rows) are a peer that could not run here."""
    return rows["reason"].astype(str).str.startswith(ABSENT)
