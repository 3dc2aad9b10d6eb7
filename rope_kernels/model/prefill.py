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
