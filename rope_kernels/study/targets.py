"""Every target the study judges, in one declarative table, and its evaluation.

A target names what is compared (one of ours against a peer, native, the copy
ceiling, the physical minimum, or PR #50400's published table), on which rows (a
result table, its shapes or buckets, its timing mode), by which metric, with which
threshold, and how ours is paired with the other side (like for like: an in-place
peer against our in-place kernel, an out-of-place one against our out-of-place
kernel). ``evaluate`` turns result rows into verdict rows, one per shape or
bucket a target covers; ``summarize`` gives one line per target.

Verdicts:

- ``met``: the threshold holds beyond noise: for a ratio of times, the peer's p20
  over our p80 meets it (ours at its slow tail against the peer at its fast one;
  ``<=`` targets: our p80 over the peer's p20); for an encoder target, the p20 (or
  p80, for a cost) of the per-round pairs; "near the floor" is two-sided (the whole
  per-round band within +-threshold of the floor). Compared exactly as stated
  (1.0483 against ">= 1.05" is not met);
- ``within noise``: the medians meet the threshold and the bands do not, or the
  measurement cannot decide (a time below the physical minimum of its bytes: no
  kernel can do that, so the noise exceeds the cost); rows without p20/p80 (or
  per-round times) can show no band, so their passing medians read within noise;
- ``missed``: the medians do not meet it;
- ``not measured``: the rows the target needs are absent (a peer that did not
  run, a table not written, a bucket not timed).

Targets are benchmarks judged on a device's committed rows, never timed tests.
Notebooks, the index and the README's findings display these verdicts; none is
computed anywhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pandas as pd

from rope_kernels import catalogue
from rope_kernels.provenance import REPO_ROOT
from rope_kernels.study.specs import CORRECTNESS_CSV, ENCODER_LATENCY_CSV, MICROBENCH_CSV, QKV_GEMM_CSV, RESULT_FILES
from rope_kernels.vocabulary import KIMI_HEAD_DIM, KIMI_HEADS, KIMI_IMAGES, KIMI_TOKENS

VERDICTS = ("met", "missed", "within noise", "not measured")
KIMI_SHAPES = tuple((t, h, KIMI_HEAD_DIM) for h, t in product(KIMI_HEADS, KIMI_TOKENS))
OURS = catalogue.names("rope", "ours")  # our standalone kernel, out of place and in place
# The engines' shipped kernels a Kimi-K2.5 deployment would use instead of ours (the
# catalogue's contenders): each is judged like for like; one that did not run reads
# "not measured".
ENGINE_PEERS = catalogue.names("rope", contender=True)
ENCODER_BUCKET = ("1024x1024", KIMI_IMAGES[-1])  # resolution, images: 87,616 vision tokens
QKV_TOKENS = KIMI_TOKENS[2:]  # 4, 8 and 16 images of 1024x1024
COLD, WARM = "cudagraph", "cudagraph_warm"
KIND_NAMES = ("time_ratio", "copy_fraction", "pr_table", "encoder_paired", "encoder_floor_gap",
              "encoder_saving", "encoder_cost", "qkv_ratio", "host_ratio")
_OPS = {">=": lambda v, t: v >= t, ">": lambda v, t: v > t, "<=": lambda v, t: v <= t}


@dataclass(frozen=True)
class Target:
    """One target: a declarative row of ``TARGETS``.

    ``kind`` picks the evaluator (``KINDS``); ``ours`` are the candidate variants
    of this project (``pairing`` says how one is picked per comparison);
    ``against`` is the other side; ``shapes`` the (tokens, heads, head_dim) it
    covers (empty: every shape in the rows with at least ``min_tokens`` tokens);
    ``modes`` the timing modes (``cudagraph`` = cold L2, ``cudagraph_warm`` =
    warm L2, ``eager``) it is judged in; the value must satisfy ``op threshold``."""

    id: str
    what: str
    source: str
    kind: str
    table: str
    metric: str
    ours: tuple[str, ...]
    against: str
    op: str
    threshold: float
    modes: tuple[str, ...] = (COLD,)
    shapes: tuple[tuple[int, int, int], ...] = ()
    min_tokens: int = 0
    pairing: str = "like for like"  # like for like | fixed | best of ours | fastest of ours
    unit: str = "x"
    notes: str = ""

    def __post_init__(self):
        if self.kind not in KIND_NAMES:
            raise ValueError(f"target {self.id}: unknown kind {self.kind!r}; one of {', '.join(KIND_NAMES)}")
        if self.op not in _OPS:
            raise ValueError(f"target {self.id}: op must be one of {', '.join(_OPS)}, got {self.op!r}")
        if self.pairing not in ("like for like", "fixed", "best of ours", "fastest of ours"):
            raise ValueError(f"target {self.id}: unknown pairing {self.pairing!r}")
        if not (isinstance(self.threshold, (int, float)) and math.isfinite(self.threshold)):
            raise ValueError(f"target {self.id}: threshold must be a finite number, got {self.threshold!r}")

    @property
    def rule(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"

    @property
    def regime(self) -> str:
        names = {COLD: "cold L2, CUDA graph", WARM: "warm L2, CUDA graph", "eager": "eager"}
        return "; ".join(names.get(m, m) for m in self.modes)


def _peer_targets() -> list[Target]:
    return [Target(
        f"kimi_1.05x_{peer}", f"ours at least 1.05x {peer} on every Kimi shape, like for like",
        "issue 9 (sglang_vision), issue 17 (every engine peer)", "time_ratio", "microbench",
        f"time({peer}) / time(ours)", OURS, peer, ">=", 1.05, shapes=KIMI_SHAPES)
        for peer in ENGINE_PEERS]


# Our RoPE-in-the-QKV-GEMM kernels: the Triton one (table, angles), the CuTe DSL one
QKV_OURS = catalogue.names("qkv", "ours")
GEMM_EPILOGUES = tuple(n for n in catalogue.names("encoder", "ours") if n not in OURS)  # the same in the encoder

TARGETS: tuple[Target, ...] = (
    Target("vllm_2x_16_heads", "ours at least 2.0x vLLM packed_qk_rope_ at 16 x 72, every token count",
           "issue 9; issue 17 (fused_inplace, like for like)", "time_ratio", "microbench",
           "time(vllm_packed_qk) / time(ours)", OURS, "vllm_packed_qk", ">=", 2.0,
           shapes=tuple(s for s in KIMI_SHAPES if s[1] == 16)),
    Target("vllm_faster_4_2_heads", "ours faster than vLLM packed_qk_rope_ at 4 and 2 heads x 72",
           "issue 9", "time_ratio", "microbench", "time(vllm_packed_qk) / time(ours)", OURS,
           "vllm_packed_qk", ">", 1.0, shapes=tuple(s for s in KIMI_SHAPES if s[1] != 16)),
    *_peer_targets(),
    Target("compiled_1.5x", "fused at least 1.5x torch.compile at 16 x 72, every Kimi token count",
           "notebook 02", "time_ratio", "microbench", "time(compiled) / time(ours)", OURS,
           "compiled", ">=", 1.5, shapes=tuple(s for s in KIMI_SHAPES if s[1] == 16)),
    Target("liger_3x", "fused at least 3x Liger-Kernel at 16 x 72, every Kimi token count",
           "notebook 02", "time_ratio", "microbench", "time(liger) / time(ours)", OURS,
           "liger", ">=", 3.0, shapes=tuple(s for s in KIMI_SHAPES if s[1] == 16)),
    Target("copy_90pct", "fused at least 90% of the copy ceiling, every shape of 8192+ tokens",
           "notebook 02", "copy_fraction", "microbench", "minimal bytes at the ceiling / time [%]",
           ("fused",), "copy ceiling", ">=", 90.0, min_tokens=8192, pairing="fixed", unit="%",
           notes="a time below the physical minimum reads within noise"),
    Target("copy_90pct_kimi_16_heads", f"fused at least 90% of the copy ceiling at {QKV_TOKENS[0]}-"
           f"{QKV_TOKENS[-1]} x 16 x {KIMI_HEAD_DIM}",
           "issue 17", "copy_fraction", "microbench", "minimal bytes at the ceiling / time [%]",
           ("fused",), "copy ceiling", ">=", 90.0,
           shapes=tuple(s for s in KIMI_SHAPES if s[1] == 16 and s[0] >= QKV_TOKENS[0]), pairing="fixed", unit="%"),
    Target("pr_table_cold", "fused at or under PR #50400's fused time on its 12 shapes, cold L2",
           "notebook 02", "pr_table", "microbench", "time(fused) / PR's fused time", ("fused",),
           "PR #50400's table", "<=", 1.0, pairing="fixed",
           notes="a time below the physical minimum reads within noise"),
    Target("pr_table_warm", "fused at or under PR #50400's fused time on its 12 shapes, warm L2",
           "notebook 02", "pr_table", "microbench", "time(fused) / PR's fused time", ("fused",),
           "PR #50400's table", "<=", 1.0, modes=(WARM,), pairing="fixed"),
    Target("encoder_vs_vllm", "encoder with our RoPE faster than with vLLM's packed_qk_rope_, per round (p20 > 0)",
           "issue 9", "encoder_paired", "encoder", "per-round gain over vllm_packed_qk [%]", OURS,
           "vllm_packed_qk", ">", 0.0, modes=(COLD, "eager"), unit="%"),
    Target("encoder_saving_7pct", "encoder with fused at least 7% faster than with native, per round (p20)",
           "notebook 04", "encoder_saving", "encoder", "per-round 100 (native - fused) / native [%]", ("fused",),
           "native", ">=", 7.0, modes=(COLD, "eager"), pairing="fixed", unit="%"),
    Target("encoder_cost_1.2x", "fused RoPE's encoder cost (fused - none per round, p80) at most 1.2x its minimum",
           "notebook 04", "encoder_cost", "encoder", "(fused - none) / physical minimum", ("fused",),
           "physical minimum", "<=", 1.2, modes=(COLD, "eager"), pairing="fixed",
           notes="physical minimum: 27 layers x minimal bytes / copy ceiling; below it reads within noise"),
    Target("encoder_cost_1.1x", "our RoPE's encoder cost (best of ours - none per round, p80) at most 1.1x its minimum",
           "issue 17", "encoder_cost", "encoder", "(ours - none) / physical minimum", OURS,
           "physical minimum", "<=", 1.1, modes=(COLD, "eager"), pairing="best of ours"),
    Target("gemm_epilogue_vs_fused", "encoder with RoPE in the QKV GEMM faster than with fused, per round (p20 > 0)",
           "issue 18", "encoder_paired", "encoder", "per-round gain over fused [%]", GEMM_EPILOGUES,
           "fused", ">", 0.0, modes=(COLD, "eager"), pairing="fastest of ours", unit="%"),
    Target("gemm_epilogue_near_floor", "encoder with RoPE in the QKV GEMM within +-0.3% of the RoPE-free floor, per round (p20..p80)",
           "notebook 04", "encoder_floor_gap", "encoder", "per-round slowdown over none [%], two-sided",
           GEMM_EPILOGUES, "none", "<=", 0.3, modes=(COLD, "eager"), pairing="fastest of ours", unit="%"),
    Target("gemm_epilogue_cute_rope_cost", "RoPE's own cost in our CuTe DSL QKV GEMM at most 0.3% of the encoder",
           "issue 34", "encoder_floor_gap", "encoder",
           "per-round slowdown over gemm_epilogue_cute_norot, median [%]",
           ("gemm_epilogue_cute",), "gemm_epilogue_cute_norot", "<=", 0.3, modes=(COLD, "eager"),
           pairing="fixed", unit="%",
           notes="the floor is our own GEMM: the gap is RoPE's, not the GEMM's speed against cuBLAS"),
    Target("host_1.2x_vllm", "our fused and in-place calls' host time per eager call at most 1.2x vLLM "
           "packed_qk_rope_'s, every Kimi shape", "issue 35", "host_ratio", "microbench",
           "host_us(ours) / host_us(vllm_packed_qk)", OURS, "vllm_packed_qk", "<=", 1.2,
           modes=("eager",), shapes=KIMI_SHAPES, pairing="fixed",
           notes="host_us: a Python loop of eager calls that never waits for the GPU (microbench); "
                 "each of ours is judged"),
    Target("qkv_vs_cublas_fused_rope", "RoPE-epilogue GEMM at most cuBLAS + fused RoPE (the fusion pays)",
           "issue 18 (required)", "qkv_ratio", "qkv_gemm", "time(best of ours) / time(cublas_linear+fused_rope)",
           QKV_OURS, "cublas_linear+fused_rope", "<=", 1.0,
           shapes=tuple((t, max(KIMI_HEADS), KIMI_HEAD_DIM) for t in QKV_TOKENS), pairing="best of ours"),
    Target("qkv_vs_quack", "RoPE-epilogue GEMM at most QuACK's RoPE-epilogue GEMM",
           "issue 18 (goal)", "qkv_ratio", "qkv_gemm", "time(best of ours) / time(quack_gemm_rope)",
           QKV_OURS, "quack_gemm_rope", "<=", 1.0,
           shapes=tuple((t, max(KIMI_HEADS), KIMI_HEAD_DIM) for t in QKV_TOKENS), pairing="best of ours"),
    Target("qkv_vs_cublas", "RoPE-epilogue GEMM at most cuBLAS alone",
           "issue 18 (moonshot)", "qkv_ratio", "qkv_gemm", "time(best of ours) / time(cublas_linear)",
           QKV_OURS, "cublas_linear", "<=", 1.0,
           shapes=tuple((t, max(KIMI_HEADS), KIMI_HEAD_DIM) for t in QKV_TOKENS), pairing="best of ours"),
)


def targets_for(table: str) -> list[Target]:
    """The targets judged on one result table ("microbench", "encoder", "qkv_gemm")."""
    if table not in TABLE_FILES:
        raise ValueError(f"unknown table {table!r}; one of {', '.join(TABLE_FILES)}")
    return [t for t in TARGETS if t.table == table]


# -- reading a device's rows -------------------------------------------------------

PR_TABLE_CSV = REPO_ROOT / "data" / "reference" / "pr50400_table.csv"
# Each table the targets read, by the file names it has had (newest first).
TABLE_FILES = {table: (name, *RESULT_FILES[name].formerly) for table, name in (
    ("microbench", MICROBENCH_CSV), ("encoder", ENCODER_LATENCY_CSV), ("qkv_gemm", QKV_GEMM_CSV),
    # not judged: read for why a peer has no timed rows (refused or absent)
    ("correctness", CORRECTNESS_CSV))}


# The columns a judged table's rows must carry, what they are and what was measured
# (a file without them is refused, not shown as "not measured").
TABLE_VALUES = {"microbench": ("variant", "tokens", "heads", "head_dim", "mode", "median_us"),
                "encoder": ("variant", "resolution", "images", "mode", "median_ms"),
                "qkv_gemm": ("variant", "tokens", "mode", "median_us")}
PR_TABLE_COLUMNS = ("tokens", "heads", "head_dim", "fused_us")


def table_file(device_dir: Path, table: str) -> Path | None:
    """The file under ``device_dir`` that holds ``table``'s rows (None: none)."""
    for name in TABLE_FILES[table]:
        if (Path(device_dir) / name).exists():
            return Path(device_dir) / name
    return None


def result_folders(data_root: Path) -> list[Path]:
    """Device folders under ``data_root`` that hold result rows (reference data and
    the compile matrix excluded)."""
    return sorted(p for p in Path(data_root).iterdir() if p.is_dir()
                  and any(table_file(p, t) for t in TABLE_FILES if t != "correctness"))\
        if Path(data_root).is_dir() else []


def load_tables(device_dir: Path, pr_table: Path | None = PR_TABLE_CSV) -> dict[str, pd.DataFrame]:
    """A device folder's result rows by table name (an absent file: an empty
    frame), older column names migrated as ``results.TABLES`` declares, plus
    PR #50400's published table as ``pr_table``."""
    from rope_kernels.study.results import read_table

    device_dir = Path(device_dir)
    if not device_dir.is_dir():
        raise ValueError(f"no result folder {device_dir}")
    out = {}
    for table in TABLE_FILES:
        path = table_file(device_dir, table)
        if path is None:
            out[table] = pd.DataFrame()
            continue
        # read_table renames older columns (TABLES) and refuses a file lacking these
        rows = read_table(path, required=TABLE_VALUES.get(table, ()))
        if "rotation" in rows.columns:  # the targets are Kimi's: interleaved pairs (issue 43)
            rows = rows[rows["rotation"].fillna("pairs") == "pairs"]
        if table == "encoder":  # the targets judge the whole encoder on one GPU (not tp8/dp8 shards)
            from rope_kernels.encoder_parallel import kimi_encoder_rows, one_gpu_rows
            rows = kimi_encoder_rows(one_gpu_rows(rows))  # Kimi's (the towers' rows: notebook 04)
        out[table] = rows
    out["pr_table"] = read_table(pr_table, required=PR_TABLE_COLUMNS) \
        if pr_table is not None and Path(pr_table).exists() else pd.DataFrame()
    return out


# -- helpers -----------------------------------------------------------------------

def _truthy(value) -> bool | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        low = value.strip().lower()
        return True if low in ("true", "1", "yes") else False if low in ("false", "0", "no") else None
    return bool(value)


def in_place(rows: pd.DataFrame, variant: str) -> bool | None:
    """Whether ``variant`` rotates its inputs in place: the rows' ``in_place``
    column where it has a value, else the registry's ``Variant.inplace`` (as the
    catalogue's ``Entry.inplace`` states it); None for a name neither knows."""
    if "in_place" in rows.columns and "variant" in rows.columns:
        for value in rows.loc[rows["variant"] == variant, "in_place"]:
            known = _truthy(value)
            if known is not None:
                return known
    # the registry's answer without building it (loading every peer to read one flag)
    entry = catalogue.entry(variant)
    return entry.inplace if entry is not None and "rope" in entry.kinds else None


def _ceiling(rows: pd.DataFrame) -> pd.Series:
    for name in ("copy_ceiling_gbps", "copy_gbps"):
        if name in rows.columns:
            return rows[name].astype(float)
    return pd.Series(float("nan"), index=rows.index)


def _shape_text(shape) -> str:
    return "x".join(str(int(x)) for x in shape)


def _verdict_row(target: Target, mode: str, shape: str, ours: str, value: float, verdict: str,
                 detail: str = "", **extra) -> dict:
    return {"target": target.id, "mode": mode, "shape": shape, "ours": ours, "against": target.against,
            "value": value, "op": target.op, "threshold": target.threshold, "unit": target.unit,
            "verdict": verdict, "detail": detail, **extra}


def _judge(target: Target, value: float) -> str:
    """met / missed; a value that is not a finite number was not measured (an absent
    peer's row has no time), never missed."""
    ok = op_ok(target, value)
    return "not measured" if ok is None else "met" if ok else "missed"


def judge_banded(target: Target, median_value: float, band_value: float) -> str:
    """The noise rule: ``median_value`` is the metric on medians, ``band_value`` the same
    metric at the bands' unfavourable ends (e.g. the peer's p20 over our p80). met: the
    band value meets the threshold; within noise: only the medians do (or no band is
    known: NaN); missed: the medians do not; not measured: no median value."""
    ok = op_ok(target, median_value)
    if ok is None:
        return "not measured"
    if not ok:
        return "missed"
    return "met" if op_ok(target, band_value) else "within noise"


def _band_words(band_value: float, unit: str = "x") -> str:
    if band_value is None or not math.isfinite(band_value):
        return "; no p20/p80 in the rows: cannot pass beyond noise"
    return f"; beyond noise (p20/p80) {_fmt(band_value, unit)}"


def judge_against_minimum(value: float, minimum: float, target_ratio: float) -> tuple[str, str]:
    """(verdict, reason) for a cost target "``value`` at most ``target_ratio`` x its
    physical ``minimum``" (a time; e.g. the minimal bytes at copy bandwidth).
    Verdicts: "met", "missed", "within noise" (below 1.0x the minimum: no kernel
    can do that, so the measurement's noise exceeds the cost and it confirms
    nothing), "not measured" (NaN)."""
    if not (isinstance(target_ratio, (int, float)) and target_ratio >= 1.0):
        raise ValueError(f"target_ratio must be a number >= 1.0, got {target_ratio!r}")
    if not (isinstance(minimum, (int, float)) and math.isfinite(minimum) and minimum > 0):
        raise ValueError(f"minimum must be a positive finite number, got {minimum!r}")
    if value is None or not math.isfinite(value):
        return "not measured", "no measurement"
    ratio = value / minimum
    if ratio < 1.0:
        return "within noise", (f"{value:.4g} is {ratio:.3f}x the physical minimum {minimum:.4g}: "
                                "below what its bytes allow, so noise exceeds the cost; not a pass")
    verdict = "met" if ratio <= target_ratio else "missed"
    return verdict, f"{ratio:.3f}x the minimum {minimum:.4g} (target <= {target_ratio:g}x)"


def _band_rows(rows: pd.DataFrame, keys: list[str], column: str) -> dict:
    """``_median_rows`` of a band column (p20/p80); empty where the rows lack it."""
    if rows.empty or column not in rows.columns:
        return {}
    return _median_rows(rows, keys, column)


def _ratio(num, den) -> float:
    """num / den, NaN where either is unknown or not a positive finite number."""
    if num is None or den is None or not (math.isfinite(num) and math.isfinite(den)) or den <= 0:
        return float("nan")
    return num / den


def _median_rows(rows: pd.DataFrame, keys: list[str], value: str = "median_us") -> dict:
    """{(variant, *keys): median} over rows (the first where a key repeats)."""
    out = {}
    for rec in rows[["variant", *keys, value]].itertuples(index=False):
        out.setdefault(tuple(rec[:-1]), float(rec[-1]))
    return out


# -- evaluators: one per kind --------------------------------------------------------

def _kernel_rows(tables: dict, mode: str) -> pd.DataFrame:
    m = tables.get("microbench", pd.DataFrame())
    if m.empty:
        return m
    m = m[(m["mode"] == mode)]
    return m[m["dtype"] == "bfloat16"] if "dtype" in m.columns else m


def _why_absent(tables: dict, variant: str, shape: tuple) -> str:
    """": <reason>" where the correctness rows say why ``variant`` did not run at
    that head_dim (refused there, or absent on the device), else ""."""
    c = tables.get("correctness", pd.DataFrame())
    if c.empty or not {"variant", "head_dim", "reason"} <= set(c.columns):
        return ""
    rows = c[(c["variant"] == variant) & (c["head_dim"] == shape[-1])]
    if "dtype" in rows.columns:  # the targets judge bf16 rows: its reason first
        rows = rows.sort_values("dtype", key=lambda d: d != "bfloat16", kind="stable")
    hit = rows["reason"].dropna()
    hit = hit[hit.astype(str).str.strip() != ""]
    return f": {hit.iloc[0]}" if len(hit) else ""


def _fails_float64(tables: dict, variant: str, shape: tuple) -> str:
    """"; <why>" where the bf16 correctness rows of ``variant`` at this head_dim say it ran
    and failed the float64 rule (error above ~2x the native path's), else "": a peer that
    is faster by being less accurate carries that beside its time."""
    c = tables.get("correctness", pd.DataFrame())
    need = {"variant", "head_dim", "passed", "supported", "max_abs_err", "tolerance"}
    if c.empty or not need <= set(c.columns):
        return ""
    rows = c[(c["variant"] == variant) & (c["head_dim"] == shape[-1])]
    if "dtype" in rows.columns:
        rows = rows[rows["dtype"] == "bfloat16"]
    ran = rows[rows["supported"].map(_truthy) == True]  # noqa: E712 - a column of flags
    failed = ran[ran["passed"].map(_truthy) == False]  # noqa: E712
    if failed.empty:
        return ""
    worst = failed.loc[(failed["max_abs_err"] / failed["tolerance"]).idxmax()]
    return (f"; {variant} fails the float64 rule at head_dim {shape[-1]} bf16 in {len(failed)} of "
            f"{len(ran)} correctness rows (max error {float(worst['max_abs_err']):.3g} > "
            f"tolerance {float(worst['tolerance']):.3g})")


def _time_ratio(target: Target, tables: dict) -> list[dict]:
    out = []
    for mode in target.modes:
        rows = _kernel_rows(tables, mode)
        times = _median_rows(rows, ["tokens", "heads", "head_dim"]) if not rows.empty else {}
        p20s, p80s = (_band_rows(rows, ["tokens", "heads", "head_dim"], c) for c in ("p20_us", "p80_us"))
        # the same-bytes copy timed beside each of ours: the best time any kernel moving
        # our bytes could reach, so peer / copy bounds the ratio a target may ask for
        copies = _median_rows(rows, ["tokens", "heads", "head_dim"], "same_bytes_copy_us") \
            if not rows.empty and "same_bytes_copy_us" in rows.columns else {}
        peer_inplace = in_place(rows, target.against) if not rows.empty else None
        for shape in target.shapes:
            text = _shape_text(shape)
            peer_t = times.get((target.against, *shape))
            if peer_t is None:
                out.append(_verdict_row(target, mode, text, "", float("nan"), "not measured",
                                        f"no {target.against} row"
                                        + _why_absent(tables, target.against, shape)))
                continue
            if peer_inplace is None:
                out.append(_verdict_row(target, mode, text, "", float("nan"), "not measured",
                                        f"whether {target.against} works in place is unknown"))
                continue
            mine = [v for v in target.ours if in_place(rows, v) == peer_inplace]
            ours = mine[0] if mine else ""
            our_t = times.get((ours, *shape)) if ours else None
            if our_t is None:
                out.append(_verdict_row(target, mode, text, ours, float("nan"), "not measured",
                                        f"no row of ours {'in' if peer_inplace else 'out of'} place"))
                continue
            ratio = peer_t / our_t
            # higher is better here: the peer at its fast end (p20) over ours at its slow end (p80)
            band = _ratio(p20s.get((target.against, *shape)), p80s.get((ours, *shape)))
            verdict = judge_banded(target, ratio, band)
            inexact = _fails_float64(tables, target.against, shape)
            detail = (f"{target.against} {peer_t:.1f} us, {ours} {our_t:.1f} us" + _band_words(band)
                      + inexact)
            copy_t = copies.get((ours, *shape), float("nan"))
            limit = peer_t / copy_t if math.isfinite(copy_t) and copy_t > 0 else float("nan")
            out_of_reach = verdict == "missed" and op_ok(target, limit) is False
            if out_of_reach:
                detail += (f"; out of reach: a copy of the same bytes ({copy_t:.1f} us) is only "
                           f"{limit:.3f}x {target.against}")
            out.append(_verdict_row(target, mode, text, ours, ratio, verdict, detail,
                                    in_place=peer_inplace, limit=limit, out_of_reach=out_of_reach,
                                    band_value=band, peer_fails_float64=bool(inexact)))
    return out


def op_ok(target: Target, value: float) -> bool | None:
    """Whether ``value`` satisfies the target's rule (None: not a finite number)."""
    if value is None or not math.isfinite(value):
        return None
    return bool(_OPS[target.op](value, target.threshold))


def _copy_fraction(target: Target, tables: dict) -> list[dict]:
    out = []
    for mode in target.modes:
        rows = _kernel_rows(tables, mode)
        ours = target.ours[0]
        mine = rows[rows["variant"] == ours] if not rows.empty else rows
        if not target.shapes and not mine.empty:
            mine = mine[mine["tokens"] >= target.min_tokens]
        wanted = target.shapes or tuple(sorted({(int(r.tokens), int(r.heads), int(r.head_dim))
                                                for r in mine.itertuples()}))
        if not wanted:
            out.append(_verdict_row(target, mode, f">= {target.min_tokens} tokens", ours,
                                    float("nan"), "not measured", f"no {ours} row"))
        for shape in wanted:
            hit = mine[(mine["tokens"] == shape[0]) & (mine["heads"] == shape[1])
                       & (mine["head_dim"] == shape[2])] if not mine.empty else mine
            text = _shape_text(shape)
            if hit.empty:
                out.append(_verdict_row(target, mode, text, ours, float("nan"), "not measured",
                                        f"no {ours} row"))
                continue
            r = hit.iloc[0]
            minimal_us = float(r["bytes"]) / (float(_ceiling(hit).iloc[0]) * 1e3)
            pct = 100 * minimal_us / float(r["median_us"])
            p80 = float(r["p80_us"]) if "p80_us" in hit.columns else float("nan")
            band = 100 * minimal_us / p80 if math.isfinite(p80) and p80 > 0 else float("nan")
            verdict = "within noise" if pct > 100 else judge_banded(target, pct, band)
            out.append(_verdict_row(target, mode, text, ours, pct, verdict,
                                    f"{float(r['median_us']):.1f} us, minimum {minimal_us:.1f} us"
                                    + _band_words(band, "%"), band_value=band))
    return out


def _pr_table(target: Target, tables: dict) -> list[dict]:
    out = []
    pr = tables.get("pr_table", pd.DataFrame())
    if pr.empty:
        return [_verdict_row(target, m, "", "fused", float("nan"), "not measured",
                             "no PR table (data/reference/pr50400_table.csv)") for m in target.modes]
    for mode in target.modes:
        rows = _kernel_rows(tables, mode)
        mine = rows[rows["variant"] == "fused"] if not rows.empty else rows
        for p in pr.itertuples():
            text = _shape_text((p.tokens, p.heads, p.head_dim))
            hit = mine[(mine["tokens"] == p.tokens) & (mine["heads"] == p.heads)
                       & (mine["head_dim"] == p.head_dim)] if not mine.empty else mine
            if hit.empty:
                out.append(_verdict_row(target, mode, text, "fused", float("nan"), "not measured",
                                        "no fused row"))
                continue
            r = hit.iloc[0]
            ratio = float(r["median_us"]) / float(p.fused_us)
            # the PR's figure is one published number: only our band counts (our p80)
            band = _ratio(float(r["p80_us"]) if "p80_us" in hit.columns else None, float(p.fused_us))
            verdict = judge_banded(target, ratio, band)
            detail = (f"fused {float(r['median_us']):.2f} us, PR {float(p.fused_us):.2f} us"
                      + _band_words(band))
            if mode == COLD and "bytes" in hit.columns:
                minimal_us = float(r["bytes"]) / (float(_ceiling(hit).iloc[0]) * 1e3)
                if float(r["median_us"]) < minimal_us:
                    verdict, detail = "within noise", detail + f", below its minimum {minimal_us:.2f} us"
            out.append(_verdict_row(target, mode, text, "fused", ratio, verdict, detail,
                                    band_value=band))
    return out


def _bucket(tables: dict, mode: str) -> pd.DataFrame:
    e = tables.get("encoder", pd.DataFrame())
    if e.empty:
        return e
    res, n = ENCODER_BUCKET
    return e[(e["mode"] == mode) & (e["resolution"] == res) & (e["images"] == n)]


def _bucket_text() -> str:
    return f"{ENCODER_BUCKET[1]} x {ENCODER_BUCKET[0]}"


def round_times(rows: pd.DataFrame, variant: str) -> list[float] | None:
    """Per-round forward times (ms) of ``variant`` in an encoder bucket's rows
    (the ``round_ms`` column, ";"-joined); None when the rows lack them."""
    if "round_ms" not in rows.columns:
        return None
    hit = rows.loc[rows["variant"] == variant, "round_ms"]
    if hit.empty or not isinstance(hit.iloc[0], str) or not hit.iloc[0]:
        return None
    return [float(x) for x in hit.iloc[0].split(";")]


def paired_gain(rows: pd.DataFrame, variant: str, against: str) -> tuple[float, float, float] | None:
    """How much faster ``variant`` ran than ``against`` in the same rounds, in %:
    (median, p20, p80) over rounds; None without per-round times for both."""
    from rope_kernels.percentiles import median_p20_p80

    mine, theirs = round_times(rows, variant), round_times(rows, against)
    if mine is None or theirs is None or len(mine) != len(theirs):
        return None
    return median_p20_p80([100 * (a - v) / a for v, a in zip(mine, theirs)])


def _encoder_ours(target: Target, rows: pd.DataFrame) -> tuple[str, str]:
    """(our variant, why none) for an encoder comparison."""
    present = set(rows["variant"])
    if target.pairing == "fixed":
        ours = target.ours[0]
        return (ours, "") if ours in present else ("", f"no {ours} row")
    if target.pairing == "fastest of ours":  # the one of ours with the lowest median
        med = rows[rows["variant"].isin(target.ours)].groupby("variant")["median_ms"].median()
        med = med[med.notna()]
        return ((med.idxmin(), "") if len(med) else
                ("", f"no {' or '.join(target.ours)} row"))
    peer_inplace = in_place(rows, target.against)
    if peer_inplace is None:
        return "", f"whether {target.against} works in place is unknown"
    mine = [v for v in target.ours if v in present and in_place(rows, v) == peer_inplace]
    return (mine[0], "") if mine else ("", f"no row of ours {'in' if peer_inplace else 'out of'} place")


def _encoder_paired(target: Target, tables: dict) -> list[dict]:
    out = []
    for mode in target.modes:
        rows = _bucket(tables, mode)
        if rows.empty or target.against not in set(rows["variant"]):
            out.append(_verdict_row(target, mode, _bucket_text(), "", float("nan"), "not measured",
                                    f"no {target.against} row in this bucket"))
            continue
        ours, why = _encoder_ours(target, rows)
        gain = paired_gain(rows, ours, target.against) if ours else None
        if gain is None:
            out.append(_verdict_row(target, mode, _bucket_text(), ours, float("nan"), "not measured",
                                    why or "rows lack per-round times (round_ms)"))
            continue
        mid, lo, hi = gain
        if target.kind == "encoder_floor_gap":
            # "near the floor" is two-sided: the per-round slowdown over the floor (-gain)
            # within +-threshold; met when its whole p20..p80 band is, within noise when
            # only its median is (a variant faster than the floor by more is not near it)
            value, slow_lo, slow_hi = -mid, -hi, -lo
            near = abs(value) <= target.threshold
            verdict = ("missed" if not near else "met" if -target.threshold <= slow_lo
                       and slow_hi <= target.threshold else "within noise")
        else:
            value = mid
            # higher is better: the per-round gain's p20 must pass
            verdict = judge_banded(target, mid, lo if target.op in (">=", ">") else hi)
        # the words follow the sign of the median gain (a variant below the floor is faster)
        detail = (f"{'faster' if mid >= 0 else 'slower'} by {abs(mid):.2f}% per round "
                  f"[gain p20 {lo:.2f}, p80 {hi:.2f}]")
        out.append(_verdict_row(target, mode, _bucket_text(), ours, value, verdict, detail, p20=lo, p80=hi))
    return out


def _encoder_saving(target: Target, tables: dict) -> list[dict]:
    """The saving over ``against`` on per-round pairs (``paired_gain``: the same rounds
    as the paired_saving_pct columns): met when its p20 meets the threshold."""
    out = []
    for mode in target.modes:
        rows = _bucket(tables, mode)
        med = rows.set_index("variant")["median_ms"] if not rows.empty else pd.Series(dtype=float)
        ours = target.ours[0]
        if not {ours, target.against} <= set(med.index):
            out.append(_verdict_row(target, mode, _bucket_text(), ours, float("nan"), "not measured",
                                    f"no {ours} or {target.against} row in this bucket"))
            continue
        gain = paired_gain(rows, ours, target.against)
        if gain is None:
            out.append(_verdict_row(target, mode, _bucket_text(), ours, float("nan"), "not measured",
                                    "rows lack per-round times (round_ms)"))
            continue
        mid, lo, hi = gain
        out.append(_verdict_row(target, mode, _bucket_text(), ours, mid, judge_banded(target, mid, lo),
                                f"per round {mid:.2f}% [p20 {lo:.2f}, p80 {hi:.2f}]; medians "
                                f"{target.against} {med[target.against]:.1f} ms, {ours} {med[ours]:.1f} ms",
                                p20=lo, p80=hi))
    return out


def paired_cost(rows: pd.DataFrame, variant: str, floor: str = "none") -> tuple[float, float, float] | None:
    """``variant``'s time over ``floor``'s in the same rounds, in ms: (median, p20, p80)
    over rounds (the paired_rope_cost_ms columns); None without per-round times."""
    from rope_kernels.percentiles import median_p20_p80

    mine, theirs = round_times(rows, variant), round_times(rows, floor)
    if mine is None or theirs is None or len(mine) != len(theirs):
        return None
    return median_p20_p80([v - f for v, f in zip(mine, theirs)])


def encoder_minimal_ms(rows: pd.DataFrame) -> float:
    """RoPE's physical minimum in one forward of the encoder these rows timed:
    its layers x minimal bytes at the row's copy ceiling (NaN when unknown)."""
    from rope_kernels.encoder_config import EncoderConfig
    from rope_kernels.roofline import rope_minimal_ms

    r = rows.iloc[0]
    encoder = r.get("encoder", "kimi_k25")
    make = {"kimi_k25": EncoderConfig.kimi_k25, "small": EncoderConfig.small}.get(encoder)
    ceiling = float(_ceiling(rows).iloc[0])
    if make is None or not math.isfinite(ceiling) or ceiling <= 0:
        return float("nan")
    cfg = make()
    layers = int(r["layers"]) if "layers" in rows.columns and pd.notna(r["layers"]) else cfg.layers
    return rope_minimal_ms(int(r["vit_tokens"]), cfg.heads, cfg.head_dim, layers, ceiling)


def _encoder_cost(target: Target, tables: dict) -> list[dict]:
    out = []
    for mode in target.modes:
        rows = _bucket(tables, mode)
        med = rows.set_index("variant")["median_ms"] if not rows.empty else pd.Series(dtype=float)
        mine = [v for v in target.ours if v in med.index]
        if "none" not in med.index or not mine:
            out.append(_verdict_row(target, mode, _bucket_text(), "", float("nan"), "not measured",
                                    f"no {'/'.join(target.ours)} or none row in this bucket"))
            continue
        minimal = encoder_minimal_ms(rows)
        if not math.isfinite(minimal):
            out.append(_verdict_row(target, mode, _bucket_text(), "", float("nan"), "not measured",
                                    "the physical minimum is unknown (encoder or copy ceiling)"))
            continue
        ours = min(mine, key=lambda v: med[v])
        paired = paired_cost(rows, ours)
        if paired is None:
            out.append(_verdict_row(target, mode, _bucket_text(), ours, float("nan"), "not measured",
                                    "rows lack per-round times (round_ms)"))
            continue
        cost, _lo, hi = paired
        verdict, reason = judge_against_minimum(cost, minimal, target.threshold)
        if verdict == "met" and hi / minimal > target.threshold:
            verdict = "within noise"  # the median cost meets it, the p80 of the rounds does not
        out.append(_verdict_row(target, mode, _bucket_text(), ours, cost / minimal, verdict,
                                f"cost per round {cost:.2f} ms [p80 {hi:.2f}], minimum {minimal:.2f} ms",
                                band_value=hi / minimal))
    return out


def _qkv_ratio(target: Target, tables: dict) -> list[dict]:
    out = []
    for mode in target.modes:
        q = tables.get("qkv_gemm", pd.DataFrame())
        rows = q[q["mode"] == mode] if not q.empty else q
        times = _median_rows(rows, ["tokens"]) if not rows.empty else {}
        p20s, p80s = (_band_rows(rows, ["tokens"], c) for c in ("p20_us", "p80_us"))
        for shape in target.shapes:
            t = shape[0]
            text = _shape_text(shape)
            theirs = times.get((target.against, t))  # NaN: the peer's row says it was absent
            theirs = None if theirs is None or not math.isfinite(theirs) else theirs
            mine = {v: times[(v, t)] for v in target.ours
                    if (v, t) in times and math.isfinite(times[(v, t)])}
            if theirs is None or not mine:
                why = ("no qkv_gemm.csv rows" if q.empty else
                       f"no {target.against} row" if theirs is None else f"no {' or '.join(target.ours)} row")
                out.append(_verdict_row(target, mode, text, "", float("nan"), "not measured", why))
                continue
            ours = min(mine, key=mine.get)
            ratio = mine[ours] / theirs
            # lower is better here: ours at its slow end (p80) over theirs at its fast end (p20)
            band = _ratio(p80s.get((ours, t)), p20s.get((target.against, t)))
            out.append(_verdict_row(target, mode, text, ours, ratio, judge_banded(target, ratio, band),
                                    f"{ours} {mine[ours]:.1f} us, {target.against} {theirs:.1f} us"
                                    + _band_words(band), band_value=band))
    return out


def _host_ratio(target: Target, tables: dict) -> list[dict]:
    """Host time per eager call (``host_us``, with p20/p80) of each of ours over the
    peer's, per shape; rows of any timing mode carry the same loop's figures."""
    out = []
    m = tables.get("microbench", pd.DataFrame())
    if not m.empty and "dtype" in m.columns:
        m = m[m["dtype"] == "bfloat16"]
    has = not m.empty and "host_us" in m.columns
    keys = ["tokens", "heads", "head_dim"]
    med = _band_rows(m, keys, "host_us") if has else {}
    p20s = _band_rows(m, keys, "host_p20_us") if has else {}
    p80s = _band_rows(m, keys, "host_p80_us") if has else {}
    for shape in target.shapes:
        text = _shape_text(shape)
        theirs = med.get((target.against, *shape))
        for ours in target.ours:
            mine = med.get((ours, *shape))
            if theirs is None or mine is None or not (math.isfinite(theirs) and math.isfinite(mine)):
                why = ("rows carry no host_us column" if not has else
                       f"no {target.against} host time" if theirs is None else f"no {ours} host time")
                out.append(_verdict_row(target, "eager", text, ours, float("nan"), "not measured", why))
                continue
            ratio = mine / theirs
            band = _ratio(p80s.get((ours, *shape)), p20s.get((target.against, *shape)))
            out.append(_verdict_row(target, "eager", text, ours, ratio, judge_banded(target, ratio, band),
                                    f"{ours} {mine:.1f} us, {target.against} {theirs:.1f} us per call"
                                    + _band_words(band), band_value=band))
    return out


KINDS = {"time_ratio": _time_ratio, "host_ratio": _host_ratio, "copy_fraction": _copy_fraction, "pr_table": _pr_table,
         "encoder_paired": _encoder_paired, "encoder_floor_gap": _encoder_paired,
         "encoder_saving": _encoder_saving, "encoder_cost": _encoder_cost, "qkv_ratio": _qkv_ratio}
VERDICT_COLUMNS = ["target", "mode", "shape", "ours", "against", "value", "op", "threshold", "unit",
                   "verdict", "detail"]


def evaluate(tables: dict[str, pd.DataFrame], targets=TARGETS) -> pd.DataFrame:
    """Verdict rows (``VERDICT_COLUMNS``), one per target x mode x shape or bucket."""
    if not isinstance(tables, dict):
        raise TypeError(f"tables must be a dict of table name -> DataFrame, got {type(tables).__name__}")
    rows = []
    for target in targets:
        try:
            rows += KINDS[target.kind](target, tables)
        except KeyError as exc:  # rows without a column this target reads
            rows += [_verdict_row(target, mode, "", "", float("nan"), "not measured",
                                  f"rows lack column {exc.args[0]!r}") for mode in target.modes]
    df = pd.DataFrame(rows)
    return df.reindex(columns=VERDICT_COLUMNS + [c for c in df.columns if c not in VERDICT_COLUMNS])


def overall(verdicts) -> str:
    """One verdict for a target's rows: missed if any is missed, else not measured
    if any is, else within noise if any is, else met."""
    got = set(verdicts)
    for v in ("missed", "not measured", "within noise"):
        if v in got:
            return v
    return "met" if got else "not measured"


def _fmt(value: float, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.1f}%" if unit == "%" and abs(value) >= 10 else f"{value:.2f}%" if unit == "%" \
        else f"{value:.3f}x"


def summarize(verdicts: pd.DataFrame, targets=TARGETS) -> pd.DataFrame:
    """One row per target: its rule, regime, overall verdict, counts and the
    measured range."""
    out = []
    for t in targets:
        mine = verdicts[verdicts["target"] == t.id] if len(verdicts) else verdicts
        counts = mine["verdict"].value_counts() if len(mine) else pd.Series(dtype=int)
        measured = mine["value"].dropna() if len(mine) else pd.Series(dtype=float)
        span = ("-" if measured.empty else _fmt(measured.min(), t.unit) if len(measured) == 1
                or measured.min() == measured.max() else
                f"{_fmt(measured.min(), t.unit)} .. {_fmt(measured.max(), t.unit)}")
        out.append({"target": t.id, "what": t.what, "rule": t.rule, "regime": t.regime,
                    "pairing": t.pairing, "source": t.source, "verdict": overall(mine["verdict"]) if len(mine)
                    else "not measured",
                    "counts": ", ".join(f"{v} {int(counts[v])}" for v in VERDICTS if v in counts)
                    + f" of {len(mine)}", "measured": span})
    return pd.DataFrame(out)


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-markdown table of ``df`` (cells as given, "|" escaped)."""
    def cell(x):
        return str(x).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(map(cell, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def report(device_dir: Path, *, detail: bool = True) -> str:
    """The targets table of a device folder as markdown: one line per target, then
    every verdict row (what ``python -m rope_kernels targets`` prints)."""
    verdicts = evaluate(load_tables(device_dir))
    text = [f"Targets judged on {Path(device_dir).name} ({len(TARGETS)} targets, "
            f"{len(verdicts)} verdict rows; rules in rope_kernels/study/targets.py):", "",
            markdown_table(summarize(verdicts)[["target", "what", "rule", "regime", "verdict", "counts",
                                                "measured"]])]
    if detail:
        shown = verdicts.assign(value=[_fmt(v, u) for v, u in zip(verdicts["value"], verdicts["unit"])])
        text += ["", "Per shape / bucket:", "",
                 markdown_table(shown[["target", "mode", "shape", "ours", "against", "value", "verdict",
                                       "detail"]])]
    return "\n".join(text)


__all__ = ["TARGETS", "Target", "ENGINE_PEERS", "KIMI_SHAPES", "VERDICTS", "evaluate", "summarize",
           "overall", "load_tables", "in_place", "judge_against_minimum", "judge_banded", "paired_gain",
           "paired_cost", "round_times",
           "encoder_minimal_ms", "markdown_table", "report", "result_folders", "table_file"]
