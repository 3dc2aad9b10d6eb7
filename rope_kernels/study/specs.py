"""One spec per notebook: the single statement of what each notebook takes and writes.

For every notebook: its parameters (default, type = the default's type, value
rule), the parameters the runner sets, the checks that span several parameters,
the result files it writes under ``data/<device>/`` (with their keys and column
migrations, ``RESULT_FILES``), the reports it leaves under ``reports/<device>/``,
and the parameter a Slurm submission shards it along.

Who reads it: the runner and ``submit`` check every value against it before
anything runs (``study/parameters.py``), ``results.upsert_csv`` takes a file's
key and migrations from ``RESULT_FILES``, ``submit`` shards and judges delivery
by it, ``--help`` lists it. The notebooks keep their parameters cell as literal
assignments (papermill injects over it, a reader sees the defaults);
``tests/test_specs.py`` keeps each cell equal to its spec.

Nothing here imports torch or the kernels: names come from ``vocabulary.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rope_kernels.vocabulary import (
    ATTENTION_KERNELS,
    DTYPE_NAMES,
    ENCODER_MODES,
    ENCODER_ONLY_ROPE,
    ENCODERS,
    GPU_ONLY_MODES,
    KNOWN_VARIANTS,
    MICROBENCH_MODES,
    parse_resolution,
    resolution_text,
    resolution_tokens,
)

# A value rule: (value, device kind or None) -> what is wrong, or None.
Rule = Callable[[object, "str | None"], "str | None"]
# A check across one notebook's parameters: (all its values, device kind) -> problem or None.
Check = Callable[[Mapping[str, object], "str | None"], "str | None"]


# -- value rules -------------------------------------------------------------------
def at_least(lo: int | float) -> Rule:
    def check(v, kind):
        return None if v >= lo else f"must be >= {lo}, got {v!r}"
    return check


# The most timed samples (or rounds) a notebook takes: far above what a profile asks for,
# low enough that a slip (samples=10**18) is refused instead of running without end.
MAX_SAMPLES = 1000


def samples_rule(v, kind) -> str | None:
    """A sample or round count: 1 to ``MAX_SAMPLES``."""
    if not 1 <= v <= MAX_SAMPLES:
        return f"must be from 1 to {MAX_SAMPLES} (the most samples a run takes), got {v!r}"
    return None


def one_of(choices: Sequence[str]) -> Rule:
    def check(v, kind):
        return None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"
    return check


def _head_dim_problem(d) -> str | None:
    if isinstance(d, bool) or not isinstance(d, int) or d < 2 or d % 2:
        return f"head_dim must be a positive even int (pairs are rotated), got {d!r}"
    return None


def _shape_problem(item) -> str | None:
    if not (isinstance(item, (list, tuple)) and len(item) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
        return f"each shape must be [tokens, heads, head_dim] ints, got {item!r}"
    if item[0] < 1 or item[1] < 1:
        return f"tokens and heads must be >= 1, got {item!r}"
    return _head_dim_problem(item[2])


def _family_problem(item) -> str | None:
    """{tokens, heads, head_dim} (optionally rotation and tower), or {tower} alone (its
    shapes from ``towers.py``)."""
    from rope_kernels.towers import TOWERS
    from rope_kernels.vocabulary import ROTATIONS

    if isinstance(item, dict) and set(item) == {"tower"}:
        if item["tower"] not in TOWERS:
            return f"unknown tower {item['tower']!r}; known: {', '.join(TOWERS)}"
        return None
    if (not isinstance(item, dict) or not {"tokens", "heads", "head_dim"} <= set(item)
            or set(item) - {"tokens", "heads", "head_dim", "rotation", "tower"}):
        return ("each family must be {tokens: ..., heads: ..., head_dim: ...} (optionally "
                f"rotation: pairs|half, tower: name) or {{tower: name}}, got {item!r}")
    if item.get("rotation", "pairs") not in ROTATIONS:
        return f"family rotation must be one of {ROTATIONS}, got {item['rotation']!r}"
    if "tower" in item and item["tower"] not in TOWERS:
        return f"unknown tower {item['tower']!r}; known: {', '.join(TOWERS)}"
    for field_name, values in item.items():
        if field_name in ("rotation", "tower"):
            continue
        values = values if isinstance(values, list) else [values]
        if not values:
            return f"family {field_name} is empty"
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                return f"family {field_name} must hold ints >= 1, got {v!r}"
            if field_name == "head_dim" and _head_dim_problem(v):
                return _head_dim_problem(v)
    return None


def _rotations_rule(v, kind) -> str | None:
    from rope_kernels.vocabulary import ROTATIONS

    if not isinstance(v, list) or not v or any(r not in ROTATIONS for r in v) or len(set(v)) < len(v):
        return f"must be a non-empty list of distinct rotations from {ROTATIONS}, got {v!r}"
    return None


def _resolution_problem(item) -> str | None:
    try:
        parse_resolution(item)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def _resolutions_rule(v, kind) -> str | None:
    """Resolutions, each once in any spelling ('56x56' and '56X56' are one bucket)."""
    problem = list_of(_resolution_problem)(v, kind)
    if problem:
        return problem
    spelled = [resolution_text(r) for r in v]
    repeated = sorted({r for r in spelled if spelled.count(r) > 1})
    return f"names a resolution twice (in two spellings?): {repeated}" if repeated else None


def _seed_rule(v, kind) -> str | None:
    """A seed torch.manual_seed takes and the int64 ``seed`` column holds."""
    if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= 2**63 - 1:
        return f"must be an int from 0 to 2**63 - 1 (a 64-bit seed), got {v!r}"
    return None


def _int_ge1(v) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else \
        f"must hold ints >= 1, got {v!r}"


def _dtype_item(v) -> str | None:
    return None if v in DTYPE_NAMES else f"unknown dtype {v!r}; use {', '.join(DTYPE_NAMES)}"


def list_of(item_problem: Callable[[object], str | None], *, allow_empty: bool = False) -> Rule:
    def check(v, kind):
        if not v and not allow_empty:
            return "must not be empty"
        for item in v:
            problem = item_problem(item)
            if problem:
                return problem
        return None
    return check


def modes(choices: Sequence[str]) -> Rule:
    """Timing modes; the CUDA-graph ones are refused for a CPU run."""
    def item_problem(m):
        return None if m in choices else f"unknown mode {m!r}; use {', '.join(choices)}"
    listed = list_of(item_problem)

    def check(v, kind):
        problem = listed(v, kind)
        if problem is None and kind == "cpu":
            gpu = [m for m in v if m in GPU_ONLY_MODES]
            if gpu:
                problem = f"{', '.join(gpu)} needs a GPU (this run is on the CPU); use [eager]"
        return problem
    return check


def variant_names(*, allow_empty: bool, extra: Sequence[str] = ()) -> Rule:
    """Names from ``KNOWN_VARIANTS`` (plus ``extra``), each once. Whether a known
    peer runs on this machine is checked by the runner (it builds the registry);
    ``submit`` cannot know the compute node's peers and checks the names only."""
    known = (*KNOWN_VARIANTS, *extra)

    def check(v, kind):
        if not v:
            return None if allow_empty else "must not be empty (name the variants to time)"
        for name in v:
            if not isinstance(name, str) or name not in known:
                return f"unknown variant {name!r}; known: {', '.join(known)}"
        repeated = sorted({n for n in v if list(v).count(n) > 1})
        if repeated:
            return f"names {', '.join(repeated)} more than once"
        return None
    return check


def _qkv_tokens_rule(v, kind):
    return list_of(_int_ge1)(v, kind)


def _prefill_rule(field_name: str, scale: float = 1.0) -> Rule:
    """04_ttft's prefill-model parameters, checked by the model itself
    (``prefill.PrefillModel``, torch-free), so the rules live in one place."""
    def check(v, kind):
        from rope_kernels.prefill import PrefillModel, llm_prompt_tokens

        try:
            if field_name == "text_tokens":
                llm_prompt_tokens(0, v)
            elif field_name == "mfu":
                PrefillModel(mfu=tuple(v) if isinstance(v, list) else v)
            else:
                number = isinstance(v, (int, float)) and not isinstance(v, bool)
                PrefillModel(**{field_name: v * scale if number and scale != 1.0 else v})
        except (TypeError, ValueError) as exc:
            return str(exc)
        return None
    return check


def _encoder_parallel_rule(v, kind) -> str | None:
    """04_ttft: encoder parallel modes (``encoder_parallel.check_mode``), 1gpu among them
    (the study's whole-encoder rows, which the notebook's other sections read)."""
    from rope_kernels.encoder_parallel import check_mode

    if not isinstance(v, list) or not v:
        return f"must be a non-empty list of modes, got {v!r}"
    try:
        [check_mode(m) for m in v]
    except ValueError as exc:
        return str(exc)
    if "1gpu" not in v or len(set(v)) != len(v):
        return f"must hold 1gpu, each mode once, got {v!r}"
    return None


def _counts_by_resolution(v, kind) -> str | None:
    """04_ttft: image counts for named resolutions, in place of ``image_counts`` there."""
    for res, counts in v.items():
        problem = _resolution_problem(res) or (None if isinstance(counts, list) and counts else
                                               f"{res}: image counts must be a non-empty list")
        problem = problem or list_of(_int_ge1)(counts, kind)
        if problem:
            return problem
    return None


# -- cross-parameter checks ----------------------------------------------------------
def _tower_item(v) -> str | None:
    """A further vision tower notebook 04 times (``towers.TOWERS``; the catalogue is
    importable without torch)."""
    from rope_kernels.towers import TOWERS

    if not isinstance(v, str) or v not in TOWERS:
        return f"unknown tower {v!r}; known: {', '.join(TOWERS)}"
    return None


def _towers_rule(v, kind) -> str | None:
    problem = list_of(_tower_item, allow_empty=True)(v, kind)
    if problem:
        return problem
    repeated = sorted({n for n in v if list(v).count(n) > 1})
    return f"names {', '.join(repeated)} more than once" if repeated else None


def _towers_fit(values: Mapping[str, object], kind) -> str | None:
    """04_ttft: ``towers`` are timed beside the main ``encoder``, not in its place."""
    if values.get("encoder") in values.get("towers", []):
        return (f"towers names the main encoder {values['encoder']!r}: it is timed already "
                f"(towers are the further encoders)")
    return None


def _some_bucket_fits(values: Mapping[str, object], kind) -> str | None:
    """04_ttft: ``max_tokens`` must leave at least one (resolution, image count)
    bucket (with none left the notebook used to fail with an IndexError)."""
    try:
        smallest = min(resolution_tokens(r) * n for r in values["resolutions"]
                       for n in values["image_counts"])
    except (TypeError, ValueError):
        return None  # the value rules name the bad item
    limit = values["max_tokens"]
    if limit < smallest:
        return (f"max_tokens={limit} leaves no bucket: the smallest (resolution x images) "
                f"has {smallest} vision tokens")
    return None


def _ttft_settings_fit(values: Mapping[str, object], kind) -> str | None:
    """04_ttft: per-resolution image counts name resolutions the run times, and the experts'
    parallel (``llm_moe_ep``) divides ``llm_tp`` (the experts span the same GPUs)."""
    extra = [r for r in values.get("image_counts_by_resolution", {}) if r not in values["resolutions"]]
    if extra:
        return (f"image_counts_by_resolution names {', '.join(extra)}, which resolutions "
                f"({', '.join(values['resolutions'])}) does not hold")
    if "tp8" in values.get("encoder_parallel", []) and values.get("encoder") == "small":
        return ("encoder_parallel tp8 splits 16 heads 8 ways: the small encoder's 4 heads do not "
                "split (use encoder=kimi_k25, or 1gpu and dp8)")
    extra = [r for r in values.get("sharded_buckets", {}) if r not in values["resolutions"]]
    if extra:
        return (f"sharded_buckets names {', '.join(extra)}, which resolutions "
                f"({', '.join(values['resolutions'])}) does not hold")
    tp, ep = values.get("llm_tp", 8), values.get("llm_moe_ep", 8)
    if isinstance(tp, int) and isinstance(ep, int) and ep >= 1 and tp % ep:
        return f"llm_moe_ep={ep} must divide llm_tp={tp} (MoE TP = llm_tp / llm_moe_ep)"
    return None


# -- the spec types ------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """A notebook parameter: its default (the small CPU configuration nbval re-runs;
    its type is the parameter's type) and the rule every given value must pass."""

    default: object
    rule: Rule | None = None
    by_runner: bool = False  # set by the runner (device, folders); not a user parameter
    variants: bool = False  # holds variant names (the runner checks they run here)


@dataclass(frozen=True)
class Table:
    """A result file's key and its declared column migrations.

    The columns and their types are those of the rows the code writes; an older
    file is accepted only where it differs by the migrations declared here:
    ``renamed`` (old header name -> current name), ``added`` (columns that
    rows written before they existed lack: those rows get an empty value, or the
    value ``derived`` computes from their other columns) and ``dropped``."""

    key: tuple[str, ...]
    renamed: dict[str, str] = field(default_factory=dict)
    added: tuple[str, ...] = ()
    # Added columns whose old values follow from a row's other columns: the
    # function gets the old rows (a DataFrame) and returns the column (a Series).
    derived: dict[str, Callable] = field(default_factory=dict)
    # Columns older files hold that current rows no longer carry, because what they
    # measured was superseded (not renamed: the new measurement is another thing).
    # Old rows lose them on the next write.
    dropped: tuple[str, ...] = ()
    # Earlier names of this file in the same folder: its rows are read from there
    # (migrated like the file's own) and the old file is removed once they are
    # written under the current name (``results.upsert_csv``).
    formerly: tuple[str, ...] = ()
    # Values renamed in a column (column -> {old value: current value}): old rows read
    # with the current name, so they keep their key and are replaced by new rows.
    recoded: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Shard:
    """How ``submit`` splits a notebook: one array task per item of ``parameter``;
    ``rows(item)`` says which rows of the delivered file belong to that item
    (column -> values), ``after_first`` are overrides for every task but the first
    (work done once, e.g. the launch-config sweep)."""

    parameter: str
    rows: Callable[[object], dict]
    after_first: dict = field(default_factory=dict)


@dataclass(frozen=True)
class NotebookSpec:
    name: str
    parameters: dict[str, Param]
    writes: tuple[str, ...] = ()  # result files under data/<device>/ (keys in RESULT_FILES)
    delivers: str = ""  # the file whose new rows mean a submit shard delivered
    report_extras: tuple[str, ...] = ()  # beside <name>.ipynb/.html under reports/<device>/
    shard: Shard | None = None
    checks: tuple[Check, ...] = ()

    @property
    def user_parameters(self) -> dict[str, Param]:
        return {n: p for n, p in self.parameters.items() if not p.by_runner}

    @property
    def defaults(self) -> dict[str, object]:
        """Name -> default of every parameter, as the notebook's parameters cell holds them."""
        return {n: p.default for n, p in self.parameters.items()}

    @property
    def reports(self) -> tuple[str, ...]:
        return (f"{self.name}.ipynb", f"{self.name}.html", *self.report_extras)


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _family_rows(item) -> dict:
    if isinstance(item, dict) and set(item) == {"tower"}:
        from rope_kernels.towers import tower_families

        item = tower_families([item["tower"]])[0]
    rows = {col: _as_list(item[col]) for col in ("tokens", "heads", "head_dim") if col in item}
    if "rotation" in item:
        rows["rotation"] = [item["rotation"]]
    return rows


PEER_COLUMNS = ("peer_package", "peer_version", "peer_sha256")
MICROBENCH_KEY = ("variant", "tokens", "heads", "head_dim", "dtype", "mode", "rotation",
                  "device_name")
# encoder: Kimi-K2.5's and Qwen3-VL's rows at one resolution and image count are two rows
ENCODER_LATENCY_KEY = ("variant", "resolution", "images", "mode", "encoder", "encoder_parallel",
                       "device_name")
QKV_KEY = ("variant", "tokens", "hidden", "heads", "head_dim", "dtype", "mode", "device_name")
QKV_SWEEP_KEY = ("variant", "config") + QKV_KEY[1:]

# The encoder's paired per-round statistics (bench/encoder_bench.py).
PAIRED_COLUMNS = ("paired_saving_pct", "paired_saving_pct_p20", "paired_saving_pct_p80",
                  "paired_rope_cost_ms", "paired_rope_cost_ms_p20", "paired_rope_cost_ms_p80")

# Time to first token, modelled (prefill.add_ttft) beside the measured latency.
MODELLED_TTFT_COLUMNS = ("text_tokens", "llm_prefill_tokens", "modelled_prefill_fast_ms",
                         "modelled_ttft_fast_ms", "modelled_prefill_ms", "modelled_ttft_ms",
                         "modelled_prefill_slow_ms", "modelled_ttft_slow_ms", "prefill_model")

# Variants that wrote into q/k (the registry's ``Variant.inplace``) when rows did
# not yet carry ``in_place``: what rows written before the column get.
_IN_PLACE_BEFORE_COLUMN = frozenset({"fused_inplace", "vllm_packed_qk", "flashinfer", "quack"})


# How the encoder is spread over GPUs (encoder_parallel.py): rows from before the
# modes timed the whole encoder on one GPU, and a TTFT row's prefill was one unchunked prefill.
ENCODER_PARALLEL_COLUMNS = ("encoder_parallel", "world_size", "gpu_images", "gpu_vit_tokens", "comm_ms",
                            "comm_model")
_ONE_GPU = {"encoder_parallel": lambda old: _constant(old, "1gpu"), "world_size": lambda old: _constant(old, 1),
            "gpu_images": lambda old: old["images"], "gpu_vit_tokens": lambda old: old["vit_tokens"],
            "comm_ms": lambda old: _constant(old, 0.0), "comm_model": lambda old: _constant(old, "none (one GPU)")}
TTFT_PARALLEL_COLUMNS = ("encoder_parallel", "comm_ms", "comm_model", "prefill_unchunked_ms",
                         "ttft_unchunked_ms", "prefill_chunk_tokens", "prefill_chunks")


def _constant(old, value):
    import pandas as pd

    return pd.Series(value, index=old.index)


def _old_rows_in_place(old):
    return old["variant"].isin(_IN_PLACE_BEFORE_COLUMN)


def _only_the_row_tiling(old):
    """Rows timed before the copy family had one copy, the ``row`` tiling."""
    import pandas as pd

    return pd.Series("row", index=old.index).where(old["same_bytes_copy_us"].notna())


def _all_supported(old):
    import pandas as pd

    return pd.Series(True, index=old.index)


def _pairs(old):
    """Rows from before the rotation column (issue 43) all rotated Kimi's interleaved pairs."""
    import pandas as pd

    return pd.Series("pairs", index=old.index)


def _kimi_encoder(old):
    """Encoder rows that name no encoder: Kimi-K2.5's tower, the only one timed before issue 43."""
    import pandas as pd

    return pd.Series("kimi_k25", index=old.index)


def _kimi_llm(old):
    """TTFT rows that name no language model prefilled Kimi-K2.5's (the only one before issue 43)."""
    import pandas as pd

    return pd.Series("moonshotai/Kimi-K2.5", index=old.index)


def _no_tower(old):
    """Rows from before the tower column named no tower (shapes given by hand)."""
    import pandas as pd

    return pd.Series("", index=old.index)


def _never_in_place(old):
    import pandas as pd

    return pd.Series(False, index=old.index)


def _default_strategy(old):
    """Sweep rows from before the launch candidates: the then default, the tiles kernel."""
    import pandas as pd

    return pd.Series("tiles", index=old.index)


def _no_persistent_grid(old):
    import pandas as pd

    return pd.Series(0, index=old.index)


def _no_cache_hint(old):
    """Sweep rows from before the cache-hint columns gave no hint (microbench.NO_CACHE_HINT)."""
    import pandas as pd

    return pd.Series("none", index=old.index)


# Every result file's name under data/<device>/, spelled here only.
MICROBENCH_CSV = "microbench.csv"
FUSED_CONFIGS_CSV = "fused_configs.csv"
CORRECTNESS_CSV = "correctness.csv"
LAUNCHES_CSV = "launches.csv"
ENCODER_LATENCY_CSV = "encoder_latency.csv"
QKV_GEMM_CSV = "qkv_gemm.csv"
QKV_GEMM_SWEEP_CSV = "qkv_gemm_sweep.csv"
QKV_GEMM_CONFIGS_CSV = "qkv_gemm_configs.csv"
TIME_TO_FIRST_TOKEN_CSV = "time_to_first_token.csv"

# Every result file under data/<device>/, in one place. Add a column's migration
# here when a writer adds or renames one, so committed files keep their rows.
RESULT_FILES: dict[str, Table] = {
    MICROBENCH_CSV: Table(MICROBENCH_KEY,
                            added=PEER_COLUMNS + ("rounds", "round_positions", "order_seed",
                                                  "in_place", "same_bytes_copy_us",
                                                  "pct_of_same_bytes_copy",
                                                  "same_bytes_copy_tiling",
                                                  "same_bytes_copy_p20_us",
                                                  "same_bytes_copy_p80_us",
                                                  "host_us", "host_p20_us", "host_p80_us",
                                                  "host_calls", "launch_floor_us",
                                                  "rotation", "tower"),
                            derived={"in_place": _old_rows_in_place,
                                     "same_bytes_copy_tiling": _only_the_row_tiling,
                                     "rotation": _pairs, "tower": _no_tower},
                            # clone() timings (one cudaMemcpyAsync, alignment-bound):
                            # superseded by the SM same-bytes copy above.
                            dropped=("copy_same_bytes_us", "pct_of_copy_same_bytes")),
    FUSED_CONFIGS_CSV: Table(("tokens", "heads", "head_dim", "dtype", "mode", "strategy",
                                "block_t", "block_h", "num_warps", "programs_per_sm",
                                "in_place", "load_eviction_policy", "store_cache_modifier",
                                "device_name"),
                               added=("in_place", "strategy", "programs_per_sm",
                                      "load_eviction_policy", "store_cache_modifier"),
                               derived={"in_place": _never_in_place,
                                        "strategy": _default_strategy,
                                        "programs_per_sm": _no_persistent_grid,
                                        "load_eviction_policy": _no_cache_hint,
                                        "store_cache_modifier": _no_cache_hint},
                               # the tiles kernel was the default strategy, "grid", until
                               # whole-token rows became the default
                               recoded={"strategy": {"grid": "tiles"}}),
    CORRECTNESS_CSV: Table(("variant", "dtype", "tokens", "heads", "head_dim", "rotation",
                            "device_name"),
                             # rows from before supported/reason were all run (supported)
                             added=("supported", "reason") + PEER_COLUMNS + ("seed", "rotation"),
                             derived={"supported": _all_supported, "rotation": _pairs}),
    LAUNCHES_CSV: Table(("variant", "tokens", "heads", "head_dim", "dtype", "device_name"),
                          renamed={"study_facts": "derived_from_code"},
                          added=PEER_COLUMNS),
    # The vision encoder's measured latency (notebook 04), called ttft.csv until
    # time to first token (encoder + modelled prefill) was added beside it.
    ENCODER_LATENCY_CSV: Table(
        ENCODER_LATENCY_KEY, formerly=("ttft.csv",),
        renamed={"rope_share": "profiled_rope_share", "rope_device_ms": "profiled_rope_device_ms",
                 "peak_mem_mb": "profiled_peak_mem_mb"},
        # paired_* came with 88edead's paired statistics, rope_device_ms after 691d48a
        added=PEER_COLUMNS + ("profiled_rope_device_ms", *PAIRED_COLUMNS,
                              "round_positions", "order_seed", "round_ms", "in_place",
                              "max_rel_err_vs_native", "max_rel_err_vs_fp32", "agreement_tol_rel",
                              *MODELLED_TTFT_COLUMNS, *ENCODER_PARALLEL_COLUMNS, "encoder"),
        # encoder joined the key with Qwen3-VL's rows (issue 43): rows without it are Kimi-K2.5's
        derived={"in_place": _old_rows_in_place, **_ONE_GPU, "encoder": _kimi_encoder}),
    # Time to first token per RoPE choice and encoder launch policy (prefill.ttft_rows):
    # notebook 04, or `python -m rope_kernels ttft` from a device's encoder_latency.csv
    # (the parallel columns: rows before issue 42 are one GPU's, their prefill one unchunked prefill)
    # (encoder joined the key with the Qwen towers' rows, issue 43: rows without it are Kimi-K2.5's,
    # their prefill Kimi-K2.5's language model)
    TIME_TO_FIRST_TOKEN_CSV: Table(("variant", "resolution", "images", "encoder_policy", "encoder",
                                    "encoder_parallel", "device_name"),
                                   added=TTFT_PARALLEL_COLUMNS + ("encoder", "prefill_llm"),
                                   derived={"encoder": _kimi_encoder, "prefill_llm": _kimi_llm,
                                            "encoder_parallel": _ONE_GPU["encoder_parallel"],
                                            "comm_ms": _ONE_GPU["comm_ms"], "comm_model": _ONE_GPU["comm_model"],
                                            "prefill_unchunked_ms": lambda old: old["prefill_ms"],
                                            "ttft_unchunked_ms": lambda old: old["ttft_ms"]}),
    # bench/qkv_bench.py: one row per variant at its fixed config, timed in shuffled rounds
    # (the round columns: rows before issue 35 have none); QuACK's rows name its package,
    # version and source hash (rows before 2026-12-03: empty)
    QKV_GEMM_CSV: Table(QKV_KEY, added=PEER_COLUMNS + ("input_sets", "rounds",
                                                         "round_positions", "order_seed")),
    # notebook 05's config sweep up to commit 86b6b7f (one row per swept variant x config),
    # kept as the data the kernels' default configs cite; tools/qkv_sweep.py explores now
    QKV_GEMM_SWEEP_CSV: Table(QKV_SWEEP_KEY, added=PEER_COLUMNS),
    # the QKV GEMM config probe's rows (tools/qkv_probe.py, one GPU run), not a notebook's
    QKV_GEMM_CONFIGS_CSV: Table(("variant", "config") + QKV_KEY[1:]),
}

_DEVICE = Param("auto", by_runner=True)  # auto | cpu | cuda | rocm
_DATA_DIR = Param("", by_runner=True)  # empty: save nothing
_SHAPE_LIST = list_of(_shape_problem)

SPECS: dict[str, NotebookSpec] = {spec.name: spec for spec in (
    NotebookSpec("01_kernels", {
        "device": _DEVICE,
        "dtypes": Param(["float32", "bfloat16", "float16"], list_of(_dtype_item)),
        "shapes": Param([[7, 3, 72], [16, 2, 128], [1, 1, 4]], _SHAPE_LIST),
        # empty: everything 02 and 04 can time, the encoder-only modes included
        "variants": Param([], variant_names(allow_empty=True, extra=ENCODER_ONLY_ROPE),
                          variants=True),
        # every shape is checked in each rotation (vocabulary.ROTATIONS; a variant that does
        # not implement one gets a row saying so)
        "rotations": Param(["pairs", "half"], _rotations_rule),
        "seed": Param(0, _seed_rule),
        "data_dir": _DATA_DIR,
    }, writes=(CORRECTNESS_CSV,), delivers=CORRECTNESS_CSV),
    NotebookSpec("02_microbench", {
        "device": _DEVICE,
        "variants": Param([], variant_names(allow_empty=True), variants=True),
        "families": Param([{"tokens": [16, 33], "heads": [2], "head_dim": [8, 72]}],
                          list_of(_family_problem)),
        "dtypes": Param(["bfloat16"], list_of(_dtype_item)),
        "modes": Param(["eager"], modes(MICROBENCH_MODES)),
        "samples": Param(3, samples_rule),
        "config_sweep": Param(False),
        "sweep_shapes": Param([[8192, 16, 72]], _SHAPE_LIST),
        "progress": Param(True),
        "data_dir": _DATA_DIR,
    }, writes=(MICROBENCH_CSV, FUSED_CONFIGS_CSV), delivers=MICROBENCH_CSV,
        shard=Shard("families", _family_rows, after_first={"config_sweep": False})),
    NotebookSpec("03_profile", {
        "device": _DEVICE,
        "tokens": Param(64, at_least(1)),
        "heads": Param(4, at_least(1)),
        "head_dim": Param(72, lambda v, kind: _head_dim_problem(v)),
        "dtype": Param("bfloat16", one_of(DTYPE_NAMES)),
        "layers": Param(27, at_least(1)),
        "variants": Param([], variant_names(allow_empty=True), variants=True),
        "data_dir": _DATA_DIR,
        "report_dir": Param("", by_runner=True),
    }, writes=(LAUNCHES_CSV,), delivers=LAUNCHES_CSV, report_extras=("traces/",)),
    NotebookSpec("04_ttft", {
        "device": _DEVICE,
        "encoder": Param("small", one_of(ENCODERS)),
        "layers": Param(0, lambda v, kind: None if v >= 0 else
                        f"must be >= 0 (0: the encoder's own depth), got {v!r}"),
        "dtype": Param("bfloat16", one_of(DTYPE_NAMES)),
        "resolutions": Param(["56x56", "112x84"], _resolutions_rule),
        "image_counts": Param([1, 2], list_of(_int_ge1)),
        "variants": Param(["native", "fused", "fused_inplace", "vllm_packed_qk", "sglang_vision",
                           "vllm_merged", "gemm_epilogue", "none"],
                          variant_names(allow_empty=False, extra=ENCODER_ONLY_ROPE), variants=True),
        "modes": Param(["eager"], modes(ENCODER_MODES)),
        "samples": Param(2, samples_rule),
        "attention": Param("auto", one_of(ATTENTION_KERNELS)),
        "max_tokens": Param(400000, at_least(1)),
        # time to first token = encoder latency (measured) + LLM prefill (modelled)
        "text_tokens": Param(64, _prefill_rule("text_tokens")),
        "prefill_tokens_per_s": Param(0.0, _prefill_rule("tokens_per_s")),
        "llm_active_params_b": Param(32.0, _prefill_rule("active_params", 1e9)),
        "llm_gpus": Param(8, _prefill_rule("gpus")),
        "llm_peak_tflops": Param(989.0, _prefill_rule("peak_tflops")),
        "llm_mfu": Param([0.15, 0.30, 0.45], _prefill_rule("mfu")),
        # the prefill from aiconfigurator-core (the `ttft` extra) where it has tables
        "prefill": Param("auto", one_of(("auto", "aiconfigurator", "hand"))),
        "llm_backend": Param("vllm", one_of(("vllm",))),
        "llm_tp": Param(8, at_least(1)),
        "llm_moe_ep": Param(8, at_least(1)),
        "encoder_graph_tokens": Param(5120, at_least(0)),  # vLLM's largest encoder graph (merged)
        # how the encoder is spread over 8 GPUs (encoder_parallel.py): 1gpu first (the
        # whole encoder), tp8/dp8 time one GPU's shard at the buckets below
        "encoder_parallel": Param(["1gpu"], _encoder_parallel_rule),
        "sharded_buckets": Param({}, _counts_by_resolution),
        "sharded_variants": Param([], variant_names(allow_empty=True, extra=ENCODER_ONLY_ROPE), variants=True),
        "image_counts_by_resolution": Param({}, _counts_by_resolution),
        # further vision towers (towers.TOWERS), timed after the main encoder on one GPU at its
        # resolutions, eager and cudagraph as `modes`, rows keyed by their `encoder` name
        "towers": Param([], _towers_rule),
        "tower_variants": Param(["native", "fused", "fused_inplace", "none"],
                                variant_names(allow_empty=False, extra=ENCODER_ONLY_ROPE), variants=True),
        # resolution -> image counts the towers are timed at (of `resolutions`; empty: the main
        # encoder's counts at every resolution)
        "tower_image_counts": Param({}, _counts_by_resolution),
        "tower_samples": Param(0, lambda v, kind: None if isinstance(v, int) and not isinstance(v, bool)
                               and 0 <= v <= MAX_SAMPLES else
                               f"must be from 0 (samples) to {MAX_SAMPLES}, got {v!r}"),
        "seed": Param(0, _seed_rule),
        "progress": Param(True),
        "data_dir": _DATA_DIR,
    }, writes=(ENCODER_LATENCY_CSV, TIME_TO_FIRST_TOKEN_CSV), delivers=ENCODER_LATENCY_CSV,
        shard=Shard("resolutions", lambda item: {"resolution": [resolution_text(item)]}),
        checks=(_some_bucket_fits, _ttft_settings_fit, _towers_fit)),
    NotebookSpec("05_qkv_gemm", {
        "device": _DEVICE,
        "qkv_tokens": Param([37], _qkv_tokens_rule),
        "samples": Param(3, samples_rule),
        "rounds": Param(5, samples_rule),
        "qkv_compile_budget_s": Param(60, at_least(0)),
        "progress": Param(True),
        "data_dir": _DATA_DIR,
    }, writes=(QKV_GEMM_CSV,), delivers=QKV_GEMM_CSV),
    NotebookSpec("06_summary", {
        "data_root": Param("../data"),
        # committed: devices git tracks (nbval's default); all: local runs too (the runner sets it)
        "device_folders": Param("committed", one_of(("committed", "all")), by_runner=True),
    }),
)}

NOTEBOOKS: tuple[str, ...] = tuple(SPECS)
SUMMARY_NOTEBOOK = "06_summary"
# Set by the runner for every notebook that declares them; not user parameters.
RUNNER_PARAMS: tuple[str, ...] = tuple(dict.fromkeys(
    n for s in SPECS.values() for n, p in s.parameters.items() if p.by_runner))
