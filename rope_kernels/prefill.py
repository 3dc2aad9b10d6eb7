"""Time to first token: the measured encoder latency plus a model of the language model's prefill.

Importable without torch (pandas only): the notebook specs check 04_ttft's prefill
parameters with ``PrefillModel`` itself.

What is measured and what is modelled. Notebook 04 measures the vision encoder's
latency (``encoder_latency.csv``). The first token of a multimodal request also waits
for the language model to prefill every token it sees: the vision tokens after the
2x2 patch merge (a quarter of the encoder's tokens) plus the text tokens. That
prefill is not measured here (no Kimi-K2.5 language model runs in this study); it is
modelled, with its assumptions stated, as a band:

    prefill FLOPs(n) = 2 * active_params * n                      (the weights' matmuls)
                     + layers * heads * (qk_head_dim + v_head_dim) * n^2   (causal attention)
    prefill time(n)  = FLOPs(n) / (gpus * peak_tflops * mfu)

for an MFU band (low, central, high): low MFU gives the slow end. A user with a
measured prefill throughput (tokens/s on their deployment) passes ``tokens_per_s``
instead, and the time is n / tokens_per_s (no band).

Defaults: Kimi-K2.5's language model is Kimi K2's (a 1.04T-total MoE with 32B
parameters activated per token, per Moonshot AI's Kimi-K2 and Kimi-K2.5 model cards):
61 layers, 64 attention heads of multi-head latent attention with query/key head dim
192 (128 without RoPE + 64 with) and value head dim 128 (its config.json, DeepSeek-V3
style). 2 x 32e9 FLOPs per token slightly overcounts (the embedding lookup is free
and the output head runs on the last token only: about 2 x 1.2e9 of them). Serving:
8 GPUs of 989 dense bf16 TFLOP/s (an H200's, as an H100 SXM's), MFU 15% / 30% / 45%:
an assumption for MoE prefill at these lengths (expert routing, all-to-all and
attention keep it well below the peak), not a measurement.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import pandas as pd

# The merge the language model applies to the encoder's patch tokens (2x2 -> 1).
MERGED_TOKENS_PER_VIT_TOKEN = 1 / 4


@dataclass(frozen=True)
class PrefillModel:
    """A parameterized model of the language model's prefill time (see the module doc)."""

    active_params: float = 32e9  # parameters one token passes through (MoE: activated only)
    layers: int = 61
    heads: int = 64
    qk_head_dim: int = 192  # MLA: 128 (no RoPE) + 64 (RoPE)
    v_head_dim: int = 128
    gpus: int = 8
    peak_tflops: float = 989.0  # per GPU, dense bf16
    mfu: tuple[float, float, float] = (0.15, 0.30, 0.45)  # low, central, high
    tokens_per_s: float = 0.0  # > 0: a measured prefill throughput replaces the FLOP model
    source: str = field(default="Kimi-K2.5 language model (Kimi K2): model cards and config.json",
                        compare=False)

    def __post_init__(self):
        for name in ("active_params", "peak_tflops"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                    or not math.isfinite(v):
                raise ValueError(f"PrefillModel.{name} must be a positive number, got {v!r}")
        for name in ("layers", "heads", "qk_head_dim", "v_head_dim", "gpus"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"PrefillModel.{name} must be a positive int, got {v!r}")
        mfu = self.mfu
        if not isinstance(mfu, (tuple, list)) or len(mfu) != 3 or any(
                isinstance(m, bool) or not isinstance(m, (int, float)) for m in mfu):
            raise ValueError(f"PrefillModel.mfu must be three numbers (low, central, high), got {mfu!r}")
        if not (0 < mfu[0] <= mfu[1] <= mfu[2] <= 1):
            raise ValueError(f"PrefillModel.mfu must satisfy 0 < low <= central <= high <= 1, got {mfu!r}")
        object.__setattr__(self, "mfu", tuple(float(m) for m in mfu))
        tps = self.tokens_per_s
        if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not tps >= 0 \
                or not math.isfinite(tps):
            raise ValueError(f"PrefillModel.tokens_per_s must be >= 0 (a measured tokens/s; 0: use "
                             f"the FLOP model), got {tps!r}")

    @property
    def measured(self) -> bool:
        """True when a measured throughput (``tokens_per_s``) replaces the FLOP model."""
        return self.tokens_per_s > 0

    def flops(self, tokens: int) -> float:
        """Prefill FLOPs of ``tokens`` tokens: weight matmuls plus causal attention."""
        n = _tokens(tokens)
        weights = 2.0 * self.active_params * n
        attention = self.layers * self.heads * (self.qk_head_dim + self.v_head_dim) * float(n) ** 2
        return weights + attention

    def prefill_ms(self, tokens: int) -> tuple[float, float, float]:
        """(fast, central, slow) prefill time of ``tokens`` tokens in ms: the MFU band's
        high, central and low ends; with ``tokens_per_s`` all three are n / tokens_per_s."""
        n = _tokens(tokens)
        if self.measured:
            t = n / self.tokens_per_s * 1e3
            return t, t, t
        rate = self.gpus * self.peak_tflops * 1e12
        low, central, high = self.mfu
        f = self.flops(n)
        return f / (rate * high) * 1e3, f / (rate * central) * 1e3, f / (rate * low) * 1e3

    def describe(self) -> str:
        """One line naming the model and its parameters (the ``prefill_model`` column)."""
        if self.measured:
            return f"measured: {self.tokens_per_s:g} tokens/s"
        return (f"FLOPs: {self.active_params / 1e9:g}B active, {self.layers} layers x "
                f"{self.heads} heads x (qk {self.qk_head_dim} + v {self.v_head_dim}), "
                f"{self.gpus} x {self.peak_tflops:g} TFLOP/s, MFU "
                + "/".join(f"{m:.0%}" for m in self.mfu))

    def assumptions(self) -> pd.DataFrame:
        """The model's parameters, what each is and where it comes from: printed in notebook 04."""
        if self.measured:
            rows = [("prefill throughput", f"{self.tokens_per_s:g} tokens/s",
                     "measured by the user (notebook parameter prefill_tokens_per_s); no band")]
        else:
            rows = [
                ("active parameters", f"{self.active_params / 1e9:g} B",
                 "per token (MoE: activated experts only); " + self.source),
                ("layers x heads", f"{self.layers} x {self.heads}", self.source),
                ("attention head dims (qk, v)", f"{self.qk_head_dim}, {self.v_head_dim}",
                 "MLA, causal: layers x heads x (qk + v) x n^2 FLOPs"),
                ("GPUs x peak", f"{self.gpus} x {self.peak_tflops:g} TFLOP/s",
                 "assumed serving (dense bf16 peak per GPU)"),
                ("MFU band (low, central, high)", ", ".join(f"{m:.0%}" for m in self.mfu),
                 "assumed: not measured here; the band's ends give the slow and fast TTFT"),
            ]
        return pd.DataFrame(rows, columns=["assumption", "value", "source"])


def _tokens(tokens) -> int:
    if isinstance(tokens, bool) or not hasattr(tokens, "__index__"):
        raise TypeError(f"token counts must be ints, got {tokens!r}")
    n = operator.index(tokens)
    if n < 0:
        raise ValueError(f"token counts must be >= 0, got {n}")
    return n


def llm_prompt_tokens(vit_tokens: int, text_tokens: int) -> int:
    """Tokens the language model prefills: the encoder's tokens after the 2x2 merge
    (a quarter) plus the text."""
    vit, text = _tokens(vit_tokens), _tokens(text_tokens)
    if vit % 4:
        raise ValueError(f"vit_tokens must be a multiple of 4 (the 2x2 merge), got {vit}")
    return int(vit * MERGED_TOKENS_PER_VIT_TOKEN) + text


def add_ttft(rows: pd.DataFrame, model: PrefillModel, text_tokens: int) -> pd.DataFrame:
    """Encoder-latency rows (``median_ms``, ``vit_tokens``) with the time to first
    token added, modelled columns prefixed ``modelled_``: ``llm_prefill_tokens``,
    ``text_tokens``, ``modelled_prefill_ms`` (central) with ``modelled_prefill_fast_ms``
    / ``modelled_prefill_slow_ms``, ``modelled_ttft_ms`` = encoder median + central
    prefill with ``modelled_ttft_fast_ms`` / ``modelled_ttft_slow_ms``, and
    ``prefill_model`` (``PrefillModel.describe()``)."""
    for col in ("median_ms", "vit_tokens"):
        if col not in rows:
            raise ValueError(f"rows lack column {col!r}")
    out = rows.copy()
    tokens = [llm_prompt_tokens(int(v), text_tokens) for v in out["vit_tokens"]]
    band = [model.prefill_ms(n) for n in tokens]
    out["text_tokens"] = _tokens(text_tokens)
    out["llm_prefill_tokens"] = tokens
    for i, end in enumerate(("_fast", "", "_slow")):
        out[f"modelled_prefill{end}_ms"] = [b[i] for b in band]
        out[f"modelled_ttft{end}_ms"] = out["median_ms"] + out[f"modelled_prefill{end}_ms"]
    out["prefill_model"] = model.describe()
    return out


def rope_saving_pct_of_ttft(ttft: pd.DataFrame, variant: str, baseline: str = "native") -> pd.DataFrame:
    """Per bucket and mode: what ``variant`` saves over ``baseline`` in encoder time
    (medians), as % of the baseline's TTFT (central, and at the band's fast and slow
    ends: the saving weighs most where prefill is fastest)."""
    keys = ["resolution", "images", "vit_tokens", "mode"]
    for name in (variant, baseline):
        if name not in set(ttft["variant"]):
            raise ValueError(f"{name!r} has no rows; rows hold {sorted(set(ttft['variant']))}")
    cols = ["median_ms", "modelled_ttft_ms", "modelled_ttft_fast_ms", "modelled_ttft_slow_ms"]
    a = ttft[ttft["variant"] == variant].set_index(keys)
    b = ttft[ttft["variant"] == baseline].set_index(keys)[cols]
    saving = b["median_ms"] - a["median_ms"]
    out = pd.DataFrame({"saving_ms": saving,
                        "saving_pct_of_ttft": 100 * saving / b["modelled_ttft_ms"],
                        "saving_pct_of_ttft_fast": 100 * saving / b["modelled_ttft_fast_ms"],
                        "saving_pct_of_ttft_slow": 100 * saving / b["modelled_ttft_slow_ms"]}).dropna()
    for col in ("timer", "device_kind"):  # provenance (plots caveat CPU rows)
        if col in a:
            out[col] = a[col].reindex(out.index)
    return out.reset_index().assign(variant=variant, against=baseline)


# -- the prefill from aiconfigurator-core (optional: the `ttft` extra) ---------------------
#
# NVIDIA's aiconfigurator-core predicts an LLM's context (prefill) phase from per-operation
# tables measured on real GPUs; Kimi-K2.5's language model is built in (routed experts int4 as
# W4A16 Marlin, MLA attention and shared experts bf16). It runs on a CPU in about a second, so
# the prefill of an H200 deployment is computed from h200_sxm's tables wherever this runs.
# Pitfalls it has, handled here: its SGLang and TRT-LLM paths size Kimi's MLA attention with 128
# heads, not 64 (only its vLLM tables are used); it ignores the vision encoder (the vision tokens
# are put into the input length here); its MoE tables end at a finite token count (beyond is
# extrapolation: the row says so); it models one unchunked prefill (no queueing): vLLM's chunks are
# priced here one by one, each with the prefix before it (``chunked_prefill_ms``).

AIC_PACKAGE = "aiconfigurator-core"
AIC_MODEL = "moonshotai/Kimi-K2.5"
AIC_BACKENDS = ("vllm",)  # its SGLang/TRT-LLM paths mis-size Kimi's attention (128 heads)
# Kimi-K2.5's routed experts as its MoE tables key them (hidden, experts, dtype)
_KIMI_MOE = {"hidden_size": 7168, "num_experts": 384, "moe_dtype": "int4_wo"}
# torch's device names -> aiconfigurator's system names (first match of a lower-case part)
_SYSTEMS = (("gb300", "gb300"), ("gb200", "gb200"), ("b300", "b300_sxm"), ("b200", "b200_sxm"),
            ("h200", "h200_sxm"), ("h100 pcie", "h100_pcie"), ("h100", "h100_sxm"),
            ("a100", "a100_sxm"), ("l40s", "l40s"), ("rtx pro 6000", "rtx_pro_6000_server"))


def aiconfigurator_version() -> str:
    """The installed aiconfigurator-core's version, or "" where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(AIC_PACKAGE)
    except metadata.PackageNotFoundError:
        return ""


def aic_system(device_name: str) -> str:
    """aiconfigurator's system name for a torch device name or a data folder name
    ("NVIDIA H200", "nvidia-h200" -> "h200_sxm"); "" for a device it does not name
    (a CPU, an AMD GPU)."""
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a string, got {device_name!r}")
    name = device_name.lower().replace("-", " ").replace("_", " ")
    return next((system for part, system in _SYSTEMS if part in name), "")


def _aic_root():
    from pathlib import Path

    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems"


def aic_covered_systems(backend: str = "vllm", model: str = AIC_MODEL) -> tuple[str, ...]:
    """The systems whose tables the installed aiconfigurator ran ``model`` on with ``backend``
    (its support matrix: status PASS); () where it is not installed."""
    if not aiconfigurator_version():
        return ()
    import csv

    covered = set()
    for path in sorted((_aic_root() / "support_matrix").glob("*.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("HuggingFaceID") == model and row.get("Backend") == backend \
                        and row.get("Status") == "PASS":
                    covered.add(row["System"])
    return tuple(sorted(covered))


@dataclass(frozen=True)
class AIConfiguratorPrefill:
    """Kimi-K2.5's prefill predicted by aiconfigurator-core: ``system``'s tables for
    ``backend`` (``backend_version`` "": the package's current tables), tensor parallel
    ``tp`` for attention and dense layers, ``moe_tp`` x ``moe_ep`` for the experts, batch
    ``batch``. ``prefill_ms(n)`` is one unchunked prefill of ``n`` input tokens."""

    system: str
    backend: str = "vllm"
    backend_version: str = ""
    tp: int = 8
    moe_tp: int = 1
    moe_ep: int = 8
    batch: int = 1
    model: str = AIC_MODEL

    def __post_init__(self):
        if not isinstance(self.system, str) or not self.system:
            raise ValueError(f"AIConfiguratorPrefill.system must name an aiconfigurator system "
                             f"(e.g. 'h200_sxm'), got {self.system!r}")
        if self.backend not in AIC_BACKENDS:
            raise ValueError(f"AIConfiguratorPrefill.backend must be one of {AIC_BACKENDS}, got "
                             f"{self.backend!r} (aiconfigurator's SGLang and TRT-LLM paths size "
                             f"Kimi-K2.5's MLA attention with 128 heads, not 64)")
        for name in ("tp", "moe_tp", "moe_ep", "batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"AIConfiguratorPrefill.{name} must be a positive int, got {v!r}")
        if self.moe_tp * self.moe_ep != self.tp:
            raise ValueError(f"AIConfiguratorPrefill: moe_tp x moe_ep must equal tp (the experts "
                             f"span the same GPUs), got {self.moe_tp} x {self.moe_ep} != {self.tp}")
        if not isinstance(self.backend_version, str):
            raise ValueError(f"AIConfiguratorPrefill.backend_version must be a string, got "
                             f"{self.backend_version!r}")

    @property
    def parallelism(self) -> str:
        if self.model != AIC_MODEL:  # a dense model: no experts
            return f"TP{self.tp}, batch {self.batch}"
        return f"TP{self.tp} + EP{self.moe_ep} (MoE TP{self.moe_tp}), batch {self.batch}"

    def _handle(self):
        cache = _AIC_HANDLES
        if self not in cache:
            if not aiconfigurator_version():
                raise RuntimeError(f"{AIC_PACKAGE} is not installed (pip install '.[ttft]')")
            from aiconfigurator_core.sdk.engine import EngineHandle

            cache[self] = EngineHandle.compile(
                self.model, self.system, self.backend, backend_version=self.backend_version or None,
                tp_size=self.tp, moe_tp_size=self.moe_tp, moe_ep_size=self.moe_ep)
        return cache[self]

    def prefill_ms(self, tokens: int) -> float:
        """One unchunked prefill of ``tokens`` input tokens (batch ``batch``), in ms."""
        n = _tokens(tokens)
        if n == 0:
            return 0.0
        return float(self._handle().predict_prefill_latency(self.batch, n))

    def chunked_prefill_ms(self, tokens: int, chunk: int) -> float:
        """vLLM's chunked prefill of ``tokens`` input tokens: the sum of its chunks
        (``encoder_parallel.prefill_chunks``), each priced from the tables as ``size`` new tokens
        attending to the ``prefix`` before them (aiconfigurator's ``prefix``)."""
        from rope_kernels.encoder_parallel import prefill_chunks

        handle = self._handle() if _tokens(tokens) else None
        return sum(float(handle.predict_prefill_latency(self.batch, p + m, p))
                   for p, m in prefill_chunks(_tokens(tokens), chunk))

    def tables_version(self) -> str:
        """The backend version whose tables are read (the package's current one for "")."""
        if self.backend_version:
            return self.backend_version
        import yaml

        slots = yaml.safe_load((_aic_root() / "query_versions.yaml").read_text())
        override = (slots.get("overrides") or {}).get(self.system) or {}
        return str((override.get(self.backend) or slots["defaults"][self.backend])["current"])

    def moe_tables_end(self) -> int:
        """The most tokens its MoE tables hold for Kimi's experts at this parallelism (0:
        unknown, or a dense model: no MoE tables)."""
        if self.model != AIC_MODEL:
            return 0
        path = (_aic_root() / "data" / self.system / "moe" / self.backend / self.tables_version()
                / "moe_perf.parquet")
        if not path.exists():
            return 0
        moe = pd.read_parquet(path, columns=["num_tokens", "hidden_size", "num_experts", "moe_dtype",
                                             "moe_tp_size", "moe_ep_size"])
        hit = moe[(moe.hidden_size == _KIMI_MOE["hidden_size"]) & (moe.num_experts == _KIMI_MOE["num_experts"])
                  & (moe.moe_dtype == _KIMI_MOE["moe_dtype"]) & (moe.moe_tp_size == self.moe_tp)
                  & (moe.moe_ep_size == self.moe_ep)]
        return int(hit.num_tokens.max()) if len(hit) else 0

    def coverage(self, tokens: int) -> str:
        """"measured tables" where the prefill's tokens lie within its MoE tables, else
        "extrapolated" and why."""
        end = _moe_end(self)
        if self.model != AIC_MODEL:  # a dense model (Qwen3-VL-8B): no MoE tables to run past
            return "measured tables (dense model: GEMM and attention tables, no MoE)"
        if end == 0:
            return f"extrapolated: no MoE table for Kimi's experts at {self.parallelism}"
        if _tokens(tokens) * self.batch > end:
            return f"extrapolated: its MoE tables end at {end:,} tokens"
        return "measured tables"

    def describe(self) -> str:
        return (f"aiconfigurator-core {aiconfigurator_version()}: {self.model}, {self.system} "
                f"{self.backend} {self.tables_version()} tables, {self.parallelism}, chunked as vLLM "
                f"runs it and one unchunked prefill")


_AIC_HANDLES: dict = {}
_MOE_ENDS: dict = {}


def _moe_end(p: AIConfiguratorPrefill) -> int:
    if p not in _MOE_ENDS:
        _MOE_ENDS[p] = p.moe_tables_end()
    return _MOE_ENDS[p]


PREFILL_SOURCES = ("auto", "aiconfigurator", "hand")


def choose_prefill(device_name: str, source: str = "auto", **settings) -> tuple[AIConfiguratorPrefill | None, str]:
    """(aiconfigurator's prefill for ``device_name``, "") where it can run, else (None,
    why the hand model is used). ``source``: "auto" (aiconfigurator where installed and
    it has tables for the device), "aiconfigurator" (the same, but a missing package or
    table is an error), "hand" (the hand model). ``settings``: ``AIConfiguratorPrefill``'s
    (backend, backend_version, tp, moe_tp, moe_ep, batch)."""
    if source not in PREFILL_SOURCES:
        raise ValueError(f"prefill source must be one of {PREFILL_SOURCES}, got {source!r}")
    if source == "hand":
        return None, "the hand model was asked for (prefill='hand')"
    why = ""
    system = aic_system(device_name)
    backend = settings.get("backend", "vllm")
    model = settings.get("model", AIC_MODEL)
    if not aiconfigurator_version():
        why = f"{AIC_PACKAGE} is not installed here (pip install '.[ttft]')"
    elif not system:
        why = f"aiconfigurator has no tables for {device_name!r} (CPU or non-NVIDIA device)"
    elif system not in (covered := aic_covered_systems(backend, model)):
        why = (f"aiconfigurator has no {backend} tables for {model} on {system} "
               f"(it covers {', '.join(covered)})")
    if why:
        if source == "aiconfigurator":
            raise ValueError(f"prefill='aiconfigurator' cannot run: {why}")
        return None, why
    return AIConfiguratorPrefill(system, **settings), ""


# -- time to first token per RoPE choice and encoder launch policy -------------------------

# vLLM 0.34 runs the vision encoder eager unless encoder CUDA graphs are turned on
# (``cudagraph_mm_encoder``); with them on, its largest encoder graph covers 5,120 merged
# tokens (about 3.7 images of 1024x1024), and a larger batch of images runs eager.
VLLM_ENCODER_GRAPH_TOKENS = 5120
ENCODER_POLICIES = {
    "eager": "encoder eager (vLLM's default: encoder CUDA graphs off)",
    "vllm_encoder_graphs": "encoder CUDA graphs on as vLLM captures them: graphs up to "
                           "the largest graph's merged tokens, eager beyond",
    "cudagraph": "encoder CUDA graphs at every size (all graphs)",
}
TTFT_KEY = ("variant", "resolution", "images", "encoder_policy", "encoder", "encoder_parallel", "device_name")
# columns of an encoder row that a TTFT row carries as they are (provenance)
_CARRIED = ("vit_tokens", "device_name", "device_kind", "torch_version", "triton_version",
            "git_commit", "encoder", "layers", "attention_kernel", "timer")


def chunk_note(tokens: int, chunk: int, tables_end: int = 0) -> str:
    """What a row says of its prefill's chunks: ``chunked (N chunks of M)`` (and the last one's
    size where it is short) or ``one chunk``, plus ``unchunked: extrapolated past E`` where the
    whole prompt is past the tables' end ``E`` (0: unknown)."""
    from rope_kernels.encoder_parallel import prefill_chunks

    steps = prefill_chunks(tokens, chunk)
    last = steps[-1][1] if steps else 0
    note = (f"chunked ({len(steps)} chunks of {chunk}" + (f", the last {last}" if last != chunk else "") + ")"
            if len(steps) > 1 else f"one chunk (at most {chunk} tokens)")
    if tables_end and tokens > tables_end:
        note += f"; unchunked: extrapolated past {tables_end:,}"
    return note


def _policy_mode(policy: str, merged_tokens: int, budget: int) -> str:
    if policy == "vllm_encoder_graphs":
        return "cudagraph" if merged_tokens <= budget else "eager"
    return policy


def ttft_rows(latency: pd.DataFrame, *, text_tokens: int, hand: PrefillModel,
              aic: AIConfiguratorPrefill | None = None, why_hand: str = "",
              graph_tokens: int = VLLM_ENCODER_GRAPH_TOKENS, chunk_tokens: int | None = None,
              llm: str = AIC_MODEL) -> pd.DataFrame:
    """Time to first token per (variant, bucket, encoder policy) from encoder-latency rows:
    the encoder's median in the mode the policy runs (``ENCODER_POLICIES``; a policy whose
    modes were not all timed is left out) plus the language model's prefill of the merged vision
    tokens and ``text_tokens``. The prefill is aiconfigurator's (``aic``) with its backend,
    system, parallelism, package version and "measured tables" / "extrapolated" in every
    row, or the hand model's central value with ``why_hand`` saying why; the hand model's
    band (``hand_prefill_*_ms``) is in every row as the cross-check.

    Per encoder parallel mode (``encoder_parallel``: rows without it are ``1gpu``) the TTFT is
    the timed GPU's encoder time + the modelled collectives (``comm_ms``, 0 for 1gpu) + the
    prefill as vLLM runs it: chunked, ``chunk_tokens`` (default: vLLM's
    ``max_num_batched_tokens`` on an H100/H200) a step, each chunk attending to the prefix
    (``prefill_ms``, ``ttft_ms``); the unchunked prefill is beside it (``prefill_unchunked_ms``,
    ``ttft_unchunked_ms``) and ``prefill_note`` says which chunks ran and where the unchunked
    prompt is past the tables. The hand model's FLOPs do not change with chunking.
    ``prefill_llm`` names the language model prefilled (aiconfigurator's ``aic.model``, else ``llm``:
    the model the hand model stands for)."""
    from rope_kernels.encoder_parallel import VLLM_MAX_NUM_BATCHED_TOKENS, prefill_chunks

    chunk = VLLM_MAX_NUM_BATCHED_TOKENS if chunk_tokens is None else chunk_tokens
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk!r}")
    latency = latency.copy()
    if "encoder_parallel" not in latency:
        latency["encoder_parallel"] = "1gpu"
    if "comm_ms" not in latency:
        latency["comm_ms"] = 0.0
    for col in ("variant", "resolution", "images", "mode", "median_ms", "vit_tokens"):
        if col not in latency:
            raise ValueError(f"encoder rows lack column {col!r}")
    if aic is None and not why_hand:
        raise ValueError("without aiconfigurator's prefill, why_hand must say why the hand model is used")
    if isinstance(graph_tokens, bool) or not isinstance(graph_tokens, int) or graph_tokens < 0:
        raise ValueError(f"graph_tokens must be an int >= 0, got {graph_tokens!r}")
    text = _tokens(text_tokens)
    by_key = latency.drop_duplicates(["variant", "resolution", "images", "encoder_parallel", "mode"]).set_index(
        ["variant", "resolution", "images", "encoder_parallel", "mode"])
    first = latency.drop_duplicates(["variant", "resolution", "images", "encoder_parallel"])
    timed_modes = set(latency["mode"])
    # a policy is given only where every mode it can run was timed (vLLM's graphs: both)
    policies = [p for p in ENCODER_POLICIES
                if ({"eager", "cudagraph"} if p == "vllm_encoder_graphs" else {p}) <= timed_modes]
    prefill_cache: dict[int, tuple[float, float]] = {}
    rows = []
    for _, r in first.iterrows():
        n = llm_prompt_tokens(int(r.vit_tokens), text)
        merged = n - text
        fast, central, slow = hand.prefill_ms(n)
        steps = prefill_chunks(n, chunk)
        chunking = {"prefill_chunk_tokens": chunk, "prefill_chunks": len(steps)}
        if aic is not None:
            if n not in prefill_cache:
                prefill_cache[n] = (aic.chunked_prefill_ms(n, chunk), aic.prefill_ms(n))
            prefill = {"prefill_ms": prefill_cache[n][0], "prefill_unchunked_ms": prefill_cache[n][1],
                       **chunking, "prefill_source": "aiconfigurator",
                       "prefill_backend": aic.backend, "prefill_system": aic.system,
                       "prefill_tables_version": aic.tables_version(),
                       "prefill_parallelism": aic.parallelism,
                       "prefill_package": f"{AIC_PACKAGE} {aiconfigurator_version()}",
                       "prefill_tables": aic.coverage(n), "prefill_note": chunk_note(n, chunk, _moe_end(aic))}
        else:
            prefill = {"prefill_ms": central, "prefill_unchunked_ms": central, **chunking,
                       "prefill_source": "hand model", "prefill_backend": "",
                       "prefill_system": "", "prefill_tables_version": "",
                       "prefill_parallelism": f"{hand.gpus} GPUs", "prefill_package": "",
                       "prefill_tables": "",
                       "prefill_note": f"{why_hand}; {chunk_note(n, chunk)} (the hand model's FLOPs do "
                                       f"not change with chunking)"}
        for policy in policies:
            mode = _policy_mode(policy, merged, graph_tokens)
            key = (r.variant, r.resolution, r.images, r.encoder_parallel, mode)
            if key not in by_key.index:
                continue
            timed = by_key.loc[key]  # the encoder row this policy runs (its timer, provenance)
            encoder_ms = float(timed["median_ms"])
            comm = float(timed["comm_ms"]) if pd.notna(timed["comm_ms"]) else 0.0
            ttft = encoder_ms + comm + prefill["prefill_ms"]
            rows.append({"variant": r.variant, "resolution": r.resolution, "images": int(r.images),
                         "encoder_policy": policy, "encoder_mode": mode,
                         "prefill_llm": getattr(aic, "model", AIC_MODEL) if aic is not None else llm,
                         "encoder_parallel": r.encoder_parallel, "text_tokens": text,
                         "llm_prefill_tokens": n, "encoder_ms": encoder_ms, "comm_ms": comm,
                         "comm_model": "none (one GPU)" if r.encoder_parallel == "1gpu"
                         else str(timed.get("comm_model", "")), **prefill,
                         "ttft_ms": ttft, "ttft_unchunked_ms": encoder_ms + comm + prefill["prefill_unchunked_ms"],
                         "encoder_share_pct": 100 * encoder_ms / ttft if ttft else math.nan,
                         # the hand model's FLOPs over the prefill's time: the MFU it implies
                         "prefill_effective_mfu": (hand.flops(n) / (hand.gpus * hand.peak_tflops * 1e9
                                                                    * prefill["prefill_ms"])
                                                   if prefill["prefill_ms"] > 0 else math.nan),
                         "hand_prefill_fast_ms": fast, "hand_prefill_ms": central,
                         "hand_prefill_slow_ms": slow, "hand_model": hand.describe(),
                         "encoder_graph_tokens": graph_tokens,
                         **{c: timed[c] for c in _CARRIED if c in latency and c != "vit_tokens"},
                         "vit_tokens": int(r.vit_tokens)})
    return pd.DataFrame(rows)


def ttft_savings(ttft: pd.DataFrame, baseline: str = "native") -> pd.DataFrame:
    """Per bucket and encoder policy, what each RoPE choice buys over ``baseline``: the
    TTFT saving in ms (the encoder's, the prefill being the same) and in % of the
    baseline's TTFT, beside each choice's TTFT and the encoder's share of it."""
    if baseline not in set(ttft["variant"]):
        raise ValueError(f"{baseline!r} has no rows; rows hold {sorted(set(ttft['variant']))}")
    ttft = ttft if "encoder_parallel" in ttft else ttft.assign(encoder_parallel="1gpu")
    keys = ["resolution", "images", "encoder_policy", "encoder_parallel"]
    base = ttft[ttft["variant"] == baseline].set_index(keys)["ttft_ms"].rename("baseline_ttft_ms")
    out = ttft.join(base, on=keys)
    out = out.assign(against=baseline, saving_ms=out["baseline_ttft_ms"] - out["ttft_ms"])
    out["saving_pct_of_ttft"] = 100 * out["saving_ms"] / out["baseline_ttft_ms"]
    cols = [*keys, "variant", "against", "ttft_ms", "encoder_share_pct", "saving_ms",
            "saving_pct_of_ttft", "prefill_source"]
    return out[out["variant"] != baseline][cols].reset_index(drop=True)


def device_ttft(latency: pd.DataFrame, *, text_tokens: int, hand: PrefillModel, source: str = "auto",
                graph_tokens: int = VLLM_ENCODER_GRAPH_TOKENS, chunk_tokens: int | None = None,
                llm: str = AIC_MODEL, **settings) -> pd.DataFrame:
    """``ttft_rows`` with the prefill chosen for the device that timed the rows (their
    ``device_name``, not this machine: an H200's rows get h200_sxm's tables on a CPU too),
    by ``choose_prefill(device, source, **settings)``."""
    devices = sorted(set(latency["device_name"])) if "device_name" in latency else []
    if len(devices) != 1:
        raise ValueError(f"encoder rows must come from one device, got {devices or 'no device_name column'}")
    aic, why = choose_prefill(devices[0], source, **settings)
    return ttft_rows(latency, text_tokens=text_tokens, hand=hand, aic=aic, why_hand=why,
                     graph_tokens=graph_tokens, chunk_tokens=chunk_tokens, llm=llm)


# -- the language model behind each vision tower (towers.py: llm_model, llm_tp) ------------
#
# Kimi-K2.5's rows (and the CPU-sized ``small`` encoder's, which stands in for it) keep the
# caller's settings (notebook 04's llm_tp / llm_moe_ep, the hand model's Kimi parameters).
# Another tower's rows get its own model at its own tensor parallel (dense: no experts), and a
# hand model of that model where aiconfigurator cannot run; a tower with no ``llm_model``
# gets no TTFT rows (``towers_without_ttft`` says why).
KIMI_ENCODERS = ("small", "kimi_k25")
# the hand model's shape of each tower LLM (its config.json text_config, as aiconfigurator
# ships it under model_configs/): layers, attention heads, head_dim
_HAND_LLM_SHAPES = {"Qwen/Qwen3-VL-8B-Instruct": (36, 32, 128)}


def tower_prefill_settings(encoder: str, hand: PrefillModel, **settings) -> tuple[PrefillModel, dict, str]:
    """(hand model, ``choose_prefill`` settings, LLM name) for the rows of ``encoder``;
    ValueError for a tower without a language model here."""
    if encoder in KIMI_ENCODERS:
        return hand, dict(settings), settings.get("model", AIC_MODEL)
    from dataclasses import replace

    from rope_kernels.towers import get_tower

    tower = get_tower(encoder)
    if not tower.llm_model:
        raise ValueError(f"tower {encoder!r} has no language model for time to first token: {tower.llm_note}")
    layers, heads, head_dim = _HAND_LLM_SHAPES[tower.llm_model]
    tower_hand = replace(hand, active_params=tower.llm_active_params_b * 1e9, layers=layers, heads=heads,
                         qk_head_dim=head_dim, v_head_dim=head_dim, gpus=tower.llm_tp,
                         source=f"{tower.llm_model} (towers.py: {tower.llm_note})")
    tower_settings = dict(settings, model=tower.llm_model, tp=tower.llm_tp, moe_tp=1, moe_ep=1)
    return tower_hand, tower_settings, tower.llm_model


def towers_without_ttft(encoders) -> dict[str, str]:
    """The encoders among ``encoders`` that get no TTFT rows -> why (no language model here)."""
    from rope_kernels.towers import TOWERS

    return {e: TOWERS[e].llm_note for e in dict.fromkeys(encoders)
            if e not in KIMI_ENCODERS and e in TOWERS and not TOWERS[e].llm_model}


def tower_ttft(latency: pd.DataFrame, *, text_tokens: int, hand: PrefillModel, source: str = "auto",
               graph_tokens: int = VLLM_ENCODER_GRAPH_TOKENS, chunk_tokens: int | None = None,
               **settings) -> pd.DataFrame:
    """``device_ttft`` per encoder (the rows' ``encoder`` column; rows without it are
    Kimi-K2.5's), each with its tower's language model (``tower_prefill_settings``); encoders
    without one are left out (``towers_without_ttft``)."""
    latency = latency if "encoder" in latency else latency.assign(encoder="kimi_k25")
    skipped = towers_without_ttft(latency["encoder"])
    parts = []
    for encoder, rows in latency.groupby("encoder", sort=False):
        if encoder in skipped:
            continue
        enc_hand, enc_settings, llm = tower_prefill_settings(encoder, hand, **settings)
        parts.append(device_ttft(rows, text_tokens=text_tokens, hand=enc_hand, source=source,
                                 graph_tokens=graph_tokens, chunk_tokens=chunk_tokens, llm=llm,
                                 **enc_settings))
    if not parts:
        raise ValueError(f"no encoder rows with a language model for time to first token "
                         f"(left out: {skipped})")
    return pd.concat(parts, ignore_index=True)
