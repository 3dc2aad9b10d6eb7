"""Which microbench rows are Kimi's, and ratios of times like for like: one place for the
README's findings (``findings.py``), the reports' and 06's sentences (``summaries.py``) and
the per-device headline row (``summary.py``), so they cannot pick different rows from the
same data (``findings`` selected by the literal head_dim 72 with any dtype,
``summaries`` by ``KIMI_HEAD_DIM`` in bf16 only; issue 44).

Kimi's rows: head_dim ``KIMI_HEAD_DIM``, bf16 (the model's dtype; a file without a dtype
column is taken as it is), one timing mode, Kimi's head counts (TP 1, 4, 8) and token
counts (``targets.KIMI_TOKENS``) unless a caller narrows or widens them.
"""

from __future__ import annotations

import pandas as pd

from rope_kernels.study import targets as T
from rope_kernels.vocabulary import KIMI_HEAD_DIM

KIMI_DTYPE = "bfloat16"


def kimi_rows(micro: pd.DataFrame, mode: str, *, heads=T.KIMI_HEADS, tokens=T.KIMI_TOKENS,
              dtype: str = KIMI_DTYPE) -> pd.DataFrame:
    """Microbench rows at Kimi's head_dim in ``mode`` and ``dtype``, at ``heads`` and
    ``tokens`` (None: every head count / token count measured), in Kimi's rotation
    (interleaved pairs: Qwen3-VL's rotate-half rows are 16 x 72 too; rows from before the
    rotation column are pairs)."""
    if micro is None or micro.empty:
        return pd.DataFrame() if micro is None else micro
    m = micro[(micro["mode"] == mode) & (micro["head_dim"] == KIMI_HEAD_DIM)]
    if "rotation" in m.columns:
        m = m[m["rotation"].fillna("pairs") == "pairs"]
    if "dtype" in m.columns:
        m = m[m["dtype"] == dtype]
    if heads is not None:
        m = m[m["heads"].isin(heads)]
    if tokens is not None:
        m = m[m["tokens"].isin(tokens)]
    return m


def like_for_like(rows: pd.DataFrame, peer: str) -> str | None:
    """Our kernel that works like ``peer`` (in place or not); None when unknown."""
    place = T.in_place(rows, peer)
    if place is None:
        return None
    return next((o for o in T.OURS if T.in_place(rows, o) == place), None)


def ours_for(rows: pd.DataFrame, peer: str) -> str:
    """Our kernel like for like with ``peer`` (in place with in place), else ``fused``."""
    return like_for_like(rows, peer) or "fused"


def times(rows: pd.DataFrame) -> dict:
    """(variant, tokens, heads) -> median us of ``rows`` (one shape family, one mode)."""
    return {(r.variant, int(r.tokens), int(r.heads)): float(r.median_us) for r in rows.itertuples()}


def time_ratios(rows: pd.DataFrame, numerator: str, denominator: str | None, *,
                heads=None) -> list[float]:
    """time(numerator) / time(denominator) at every (tokens, heads) of ``rows`` where both
    were measured (``heads``: only those head counts), tokens ascending then heads
    ascending; [] where ``denominator`` is None."""
    if denominator is None or rows.empty:
        return []
    t = times(rows)
    shapes = sorted({(k, h) for _, k, h in t if heads is None or h in heads})
    return [t[(numerator, k, h)] / t[(denominator, k, h)] for k, h in shapes
            if (numerator, k, h) in t and (denominator, k, h) in t]
