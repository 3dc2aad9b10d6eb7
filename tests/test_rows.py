"""One selector of Kimi's microbench rows and one like-for-like ratio (study/rows.py), used
by the README's findings, the reports' sentences and the per-device summary: given rows
that the old selectors read differently (fp16 beside bf16 at Kimi's shapes, another
head_dim), all three report the bf16 rows' ratios (issue 44)."""

import re

import pandas as pd

from rope_kernels.study import findings as F
from rope_kernels.study import rows as R
from rope_kernels.study import summaries as S
from rope_kernels.study import summary
from rope_kernels.study import targets as T


def _rows(dtype_us: dict, head_dim: int = 72) -> list[dict]:
    """Cold rows at every Kimi shape: fused 10 us, SGLang's vision_rope 10 * ratio us, per
    dtype (``dtype_us``: dtype -> SGLang's ratio), scaled alike with tokens."""
    out = []
    for dtype, ratio in dtype_us.items():
        for t in T.KIMI_TOKENS:
            for h in T.KIMI_HEADS:
                for v, us in (("fused", 10.0), ("sglang_vision", 10.0 * ratio)):
                    out.append({"variant": v, "tokens": t, "heads": h, "head_dim": head_dim,
                                "dtype": dtype, "mode": T.COLD, "median_us": us * t / 1024,
                                "in_place": False, "device_name": "GPU X", "git_commit": "c0ffee",
                                "speedup_vs_native": 1.0, "pct_of_copy": 50.0})
    return out


def _micro():
    # bf16: SGLang 1.25x ours; fp16 rows at the same shapes 3x; a 128-wide family 5x
    return pd.DataFrame(_rows({"bfloat16": 1.25, "float16": 3.0}) + _rows({"bfloat16": 5.0}, 128))


def test_kimi_rows_are_bf16_at_72_and_kimis_shapes():
    micro = _micro()
    rows = R.kimi_rows(micro, T.COLD)
    assert set(rows["dtype"]) == {"bfloat16"} and set(rows["head_dim"]) == {72}
    assert len(rows) == 2 * len(T.KIMI_TOKENS) * len(T.KIMI_HEADS)
    assert R.kimi_rows(micro, T.WARM).empty
    wide = R.kimi_rows(micro.assign(tokens=micro["tokens"] + 1), T.COLD, tokens=None, heads=(16,))
    assert set(wide["heads"]) == {16} and len(wide) == 2 * len(T.KIMI_TOKENS)


def test_time_ratios_like_for_like():
    rows = R.kimi_rows(_micro(), T.COLD)
    assert R.like_for_like(rows, "sglang_vision") == "fused"
    ratios = R.time_ratios(rows, "sglang_vision", "fused")
    assert len(ratios) == len(T.KIMI_TOKENS) * len(T.KIMI_HEADS)
    assert all(abs(r - 1.25) < 1e-12 for r in ratios)
    assert len(R.time_ratios(rows, "sglang_vision", "fused", heads=(16,))) == len(T.KIMI_TOKENS)
    assert R.time_ratios(rows, "sglang_vision", None) == [] and R.time_ratios(rows, "absent", "fused") == []


def test_findings_summaries_and_summary_read_the_same_rows():
    """The README's table, the reports' sentence and the summary row all give 1.25 (bf16):
    findings' old selector took the fp16 rows too (any dtype at head_dim 72), and the
    last row read (fp16's 3.0) won."""
    micro = _micro()
    table, _ = F.peer_ratio_table(micro, T.COLD)
    cells = re.findall(r"\| ([0-9.]+)x \|", table)
    assert cells and set(cells) == {"1.25"}, table
    _, ratios = S._ratio_span(S._kimi_rows({"microbench": micro}), "sglang_vision")
    assert ratios and all(abs(r - 1.25) < 1e-12 for r in ratios)
    row = summary.device_summary(micro, pd.DataFrame())
    assert abs(row["ratio_sglang_vision"] - 1.25) < 1e-12
