"""The statistic every timing in the study reports: the median with the 20th and
80th percentiles (linear interpolation). Pure Python, so the study's verdicts and
the index compute it without torch."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median_p20_p80(values: Sequence[float]) -> tuple[float, float, float]:
    """The median and the 20th / 80th percentiles (linear interpolation)."""
    if not values:
        raise ValueError("no samples")
    return statistics.median(values), quantile(values, 0.2), quantile(values, 0.8)
