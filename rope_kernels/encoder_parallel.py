"""How a serving engine spreads the vision encoder over its GPUs, and what one GPU runs.

Importable without torch (the study's specs and the TTFT model use it on any machine).

vLLM runs a multimodal encoder on the tensor-parallel group of the language model
(``mm_encoder_tp_mode``), in one of two ways:

- ``"weights"`` (its default): every layer's weights split over the TP ranks. Each of 8
  GPUs runs 2 of Kimi-K2.5's 16 heads: the QKV projection and the MLP's first GEMM with
  N/8 output columns (column parallel), the output projection and the MLP's second GEMM
  with K/8 input columns (row parallel), followed by an all-reduce of the hidden state
  (tokens x 1152, bf16) after each of the two: two per layer. The study calls it ``tp8``.
- ``"data"``: the images split over the TP ranks, full weights on each, one all-gather of
  the encoder outputs at the end. The study calls it ``dp8``: the slowest GPU runs
  ceil(images / 8) images.

``1gpu`` is the whole encoder on one GPU (the study's first rows). On one GPU the study
times exactly the shard one GPU runs (``layer_gemms`` gives its GEMM shapes; the encoder's
``tp`` argument builds it); the collectives are **modelled** (``comm_ms``) from a stated
NCCL bus bandwidth (``CommModel``), not measured: issue 45 measures them on 8 GPUs.

The vLLM facts below were read from the vLLM 0.34.0 wheel (the study's pinned version);
each names its file and line there.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

ENCODER_PARALLEL_MODES = ("1gpu", "tp8", "dp8")
WORLD = 8  # GPUs of the node the modes spread over (Kimi-K2.5 serves on TP8)

VLLM_VERSION = "0.34.0"


@dataclass(frozen=True)
class SourceFact:
    """A value read from the pinned vLLM source: what it is, the value, file and line."""

    what: str
    value: str
    file: str
    line: int
    quote: str

    @property
    def where(self) -> str:
        return f"vllm {VLLM_VERSION} {self.file}:{self.line}"


VLLM_FACTS = {
    "default_mode": SourceFact(
        "the default mm_encoder_tp_mode", "weights", "vllm/config/multimodal.py", 384,
        'mm_encoder_tp_mode: MMEncoderTPMode = "weights"'),
    "modes": SourceFact(
        "the encoder TP modes vLLM knows", "weights, data", "vllm/config/multimodal.py", 288,
        'MMEncoderTPMode = Literal["weights", "data"]'),
    "kimi_supports_data": SourceFact(
        "Kimi-K2.5 supports the data mode", "True", "vllm/model_executor/models/kimi_k25.py", 307,
        "supports_encoder_tp_data = True"),
    "data_falls_back": SourceFact(
        "a model without data support falls back to weights", "weights", "vllm/config/model.py", 856,
        'mm_encoder_tp_mode == "data" and not ...supports_multimodal_encoder_tp_data -> "weights"'),
    "max_num_batched_tokens": SourceFact(
        "the default max_num_batched_tokens of vLLM's OpenAI server on an H100 or H200 "
        "(70 GiB or more, under 160 GiB)", "8192", "vllm/engine/arg_utils.py", 3028,
        "UsageContext.OPENAI_API_SERVER: 8192"),
}
# vLLM's mode names -> the study's
VLLM_MODE_NAMES = {"weights": "tp8", "data": "dp8"}
VLLM_DEFAULT_ENCODER_PARALLEL = VLLM_MODE_NAMES[VLLM_FACTS["default_mode"].value]
KIMI_SUPPORTED_ENCODER_PARALLEL = ("tp8", "dp8")  # weights always; data per kimi_supports_data
VLLM_MAX_NUM_BATCHED_TOKENS = int(VLLM_FACTS["max_num_batched_tokens"].value)


def check_mode(mode) -> str:
    """``mode`` if it is one of ``ENCODER_PARALLEL_MODES``, else a ValueError naming them."""
    if not isinstance(mode, str) or mode not in ENCODER_PARALLEL_MODES:
        raise ValueError(f"encoder_parallel must be one of {', '.join(ENCODER_PARALLEL_MODES)}, got {mode!r}")
    return mode


def _positive(name, v) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__") or operator.index(v) < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return operator.index(v)


def tp_degree(mode: str, world: int = WORLD) -> int:
    """How many ways one GPU's layer weights are split: ``world`` (8) for tp8, else 1. ``world``:
    the distributed runner's own group size (bench/distributed_encoder.py: 2 on a CPU test)."""
    return _positive("world", world) if check_mode(mode) == "tp8" else 1


def gpu_images(mode: str, images: int, world: int = WORLD) -> int:
    """Images the slowest GPU encodes: ceil(images / 8) for dp8, all of them otherwise."""
    n = _positive("images", images)
    return math.ceil(n / _positive("world", world)) if check_mode(mode) == "dp8" else n


def world_size(mode: str, world: int = WORLD) -> int:
    return 1 if check_mode(mode) == "1gpu" else _positive("world", world)


def layer_gemms(hidden: int, heads: int, mlp: int, mode: str, world: int = WORLD) -> dict[str, tuple[int, int]]:
    """One GPU's GEMMs of one encoder layer under ``mode``, as (K, N) (input, output features):
    QKV and fc1 column parallel (N / tp), proj and fc2 row parallel (K / tp); plus its heads."""
    tp = tp_degree(mode, world)
    for name, v in (("hidden", hidden), ("heads", heads), ("mlp", mlp)):
        _positive(name, v)
    if heads % tp or hidden % tp or mlp % tp:
        raise ValueError(f"{mode} over {tp} GPUs: heads ({heads}), hidden ({hidden}) and mlp ({mlp}) must "
                         f"divide by {tp}")
    return {"qkv": (hidden, 3 * hidden // tp), "proj": (hidden // tp, hidden),
            "fc1": (hidden, mlp // tp), "fc2": (mlp // tp, hidden), "heads": (heads // tp, hidden // heads)}


@dataclass(frozen=True)
class CommModel:
    """The collectives' time from NCCL's bus bandwidth (nccl-tests' definition: an all-reduce
    moves 2 (n-1)/n of its bytes over each GPU's link, an all-gather (n-1)/n of the gathered
    bytes), bandwidth only, no latency term: a lower bound, **modelled, not measured**.

    ``bus_gbps``: 450 GB/s, NVLink 4's per-direction bandwidth per GPU (900 GB/s total, NVIDIA's
    H100 SXM and H200 SXM datasheets); nccl-tests reach less than this, so the real collectives
    are slower."""

    bus_gbps: float = 450.0
    source: str = "NVLink 4, 900 GB/s per GPU (450 GB/s each way): NVIDIA H100/H200 SXM datasheets"
    bytes_per_element: int = 2  # bf16

    def all_reduce_ms(self, elements: int, world: int = WORLD) -> float:
        return 2 * (world - 1) / world * elements * self.bytes_per_element / (self.bus_gbps * 1e9) * 1e3

    def all_gather_ms(self, elements_total: int, world: int = WORLD) -> float:
        return (world - 1) / world * elements_total * self.bytes_per_element / (self.bus_gbps * 1e9) * 1e3

    def describe(self) -> str:
        return (f"modelled: NCCL bus bandwidth {self.bus_gbps:g} GB/s ({self.source}); "
                f"all-reduce 2(n-1)/n x bytes, all-gather (n-1)/n x bytes, no latency term")

    def comm_ms(self, mode: str, *, vit_tokens: int, images: int, hidden: int, layers: int,
                merged_hidden: int, merge: int = 2) -> float:
        """The modelled collectives of one encoder forward under ``mode``: 0 for 1gpu; tp8: two
        all-reduces per layer of (tokens x hidden); dp8: one all-gather of every GPU's share of
        the output (merged tokens of the slowest GPU, padded to it as vLLM pads, x ``merged_hidden``)."""
        mode = check_mode(mode)
        if mode == "1gpu":
            return 0.0
        if mode == "tp8":
            return 2 * layers * self.all_reduce_ms(vit_tokens * hidden)
        per_gpu = gpu_images(mode, images) * (vit_tokens // _positive("images", images)) // merge**2
        return self.all_gather_ms(WORLD * per_gpu * merged_hidden)


COMM_MODEL = CommModel()


def parallel_columns(mode: str, *, images: int, vit_tokens: int, gpu_vit_tokens: int, hidden: int, layers: int,
                     merged_hidden: int, merge: int = 2, comm: CommModel = COMM_MODEL) -> dict:
    """The columns an encoder row of ``mode`` carries: the request's ``images`` and ``vit_tokens``
    (what the language model prefills), the timed GPU's share (``gpu_images``, ``gpu_vit_tokens``),
    ``world_size`` and the modelled collectives (``comm_ms``, named in ``comm_model``)."""
    mode = check_mode(mode)
    return {"images": _positive("images", images), "vit_tokens": vit_tokens, "llm_tokens": vit_tokens // merge**2,
            "encoder_parallel": mode, "world_size": world_size(mode), "gpu_images": gpu_images(mode, images),
            "gpu_vit_tokens": gpu_vit_tokens,
            "comm_ms": comm.comm_ms(mode, vit_tokens=vit_tokens, images=images, hidden=hidden, layers=layers,
                                    merged_hidden=merged_hidden, merge=merge),
            "comm_model": comm.describe() if mode != "1gpu" else "none (one GPU)"}


def one_gpu_rows(rows):
    """The rows of the whole encoder on one GPU (``encoder_parallel`` 1gpu; rows from before the
    column are all such): what the study's per-bucket comparisons and targets read."""
    if "encoder_parallel" not in getattr(rows, "columns", ()):
        return rows
    return rows[rows["encoder_parallel"].fillna("1gpu") == "1gpu"]


# the encoders whose rows the study's Kimi verdicts read: Kimi-K2.5's tower and its CPU-sized twin
KIMI_ENCODERS = ("kimi_k25", "small")


def kimi_encoder_rows(rows):
    """The rows of Kimi-K2.5's encoder (``encoder`` kimi_k25, or small on a CPU; rows from before
    the column are all Kimi's): what the targets, findings and summaries read. The further
    towers' rows (notebook 04's ``towers``: qwen3_vl, qwen25_vl) sit beside them in the same
    files, under their own ``encoder``."""
    if "encoder" not in getattr(rows, "columns", ()):
        return rows
    return rows[rows["encoder"].fillna("kimi_k25").isin(KIMI_ENCODERS)]


def prefill_chunks(tokens: int, chunk: int = VLLM_MAX_NUM_BATCHED_TOKENS) -> list[tuple[int, int]]:
    """vLLM's chunked prefill of one request alone in the batch: (prefix, size) per step, each
    chunk ``chunk`` tokens (the last the rest) attending to the ``prefix`` before it."""
    n, m = operator.index(tokens), _positive("chunk", chunk)
    if n < 0:
        raise ValueError(f"tokens must be >= 0, got {n}")
    return [(p, min(m, n - p)) for p in range(0, n, m)]
