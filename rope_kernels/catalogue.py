"""One catalogue of every name the study shows: RoPE variants, encoder RoPE modes, QKV-GEMM
variants and copy references, each with its label, group, colour and display order.

Plots, findings, targets, the index and the reports read names, labels, colours and order from
here (nothing else keeps its own list); a new peer is one ``Entry`` added here beside its peer
module. Importable without torch (the vocabulary layer).

Groups, in the order readers see them: ``ours`` (this project's kernels), ``engine`` (what a
serving engine or kernel library ships, run from its own pinned files), ``baseline`` (PyTorch
paths and references a user compares against), ``reference`` (copies and floors: limits, not
competitors).
"""

from __future__ import annotations

from dataclasses import dataclass

GROUPS = ("ours", "engine", "baseline", "reference")
KINDS = ("rope", "encoder", "qkv", "copy")


@dataclass(frozen=True)
class Entry:
    """How the study names and draws one variant."""

    name: str
    label: str  # short, for legends and table headers
    group: str  # one of GROUPS
    colour: str  # '#rrggbb', distinct within what one plot shows together
    kinds: tuple[str, ...] = ("rope",)  # where the name occurs: KINDS
    inplace: bool = False  # rotates the caller's q/k (in-place peers pair with fused_inplace)
    description: str = ""  # one sentence for peers: what it is and how it is called

    def __post_init__(self):
        if self.group not in GROUPS:
            raise ValueError(f"catalogue entry {self.name!r}: group must be one of {GROUPS}, got {self.group!r}")
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise ValueError(f"catalogue entry {self.name!r}: unknown kinds {bad} (known: {KINDS})")
        c = self.colour
        if not (isinstance(c, str) and len(c) == 7 and c[0] == "#"
                and all(ch in "0123456789abcdefABCDEF" for ch in c[1:])):
            raise ValueError(f"catalogue entry {self.name!r}: colour must be '#rrggbb', got {c!r}")


_ENTRIES: list[Entry] = [
    # -- ours ------------------------------------------------------------------------------
    Entry("fused", "fused (ours)", "ours", "#d62728"),
    Entry("fused_inplace", "fused in place (ours)", "ours", "#ff9da7", ("rope", "encoder"), inplace=True),
    Entry("gemm_epilogue", "RoPE in our Triton QKV GEMM", "ours", "#bcbd22", ("encoder",)),
    Entry("gemm_epilogue_cute", "RoPE in our CuTe DSL QKV GEMM", "ours", "#6b8e23", ("encoder",)),
    Entry("qkv_rope_linear", "our Triton QKV GEMM + RoPE (table)", "ours", "#8b0000", ("qkv",)),
    Entry("qkv_rope_linear_angles", "our Triton QKV GEMM + RoPE (angles)", "ours", "#c49c94", ("qkv",)),
    Entry("qkv_rope_linear_cute", "our CuTe DSL QKV GEMM + RoPE", "ours", "#2f4f4f", ("qkv",)),
    # -- the engines' and kernel libraries' code, from their pinned files ------------------
    Entry("vllm_packed_qk", "vLLM `packed_qk_rope_`", "engine", "#1f77b4", ("rope", "encoder"), inplace=True,
          description="vLLM's `packed_qk_rope_`, in place on the packed qkv, as `kimi_k25_vit.py` calls it"),
    Entry("vllm_merged", "merged PR path (vLLM's kernel)", "engine", "#17becf", ("rope", "encoder"),
          description="the path PR #50400 merged, with vLLM's bundled flash-attention `apply_rotary`"),
    Entry("sglang_kimi_k25", "SGLang Kimi-K2.5 path (JIT CUDA)", "engine", "#4b0082", ("rope", "encoder"),
          description="SGLang's Kimi-K2.5 tower path: q/k/v made contiguous, then its JIT-compiled CUDA rope "
                      "in place"),
    Entry("sglang_vision", "SGLang `vision_rope` (Triton)", "engine", "#9467bd", ("rope", "encoder"),
          description="SGLang's Triton `apply_fused_qk_complex_rope` (out of place)"),
    Entry("flashinfer", "FlashInfer", "engine", "#8c564b", ("rope", "encoder"), inplace=True,
          description="FlashInfer `apply_rope_with_cos_sin_cache_inplace`"),
    Entry("quack_qkv", "QuACK `apply_rotary_emb_qkv_`", "engine", "#e377c2", ("rope", "encoder"), inplace=True,
          description="QuACK `apply_rotary_emb_qkv_` in place on the packed qkv"),
    Entry("quack_rotary", "QuACK `apply_rotary`", "engine", "#7b4173",
          description="QuACK `apply_rotary`, out of place"),
    Entry("vllm_rotary_qkv", "vLLM flash-attn `apply_rotary_emb_qkv_`", "engine", "#393b79",
          ("rope", "encoder"), inplace=True,
          description="vLLM's bundled flash-attention `apply_rotary_emb_qkv_`, in place on the packed qkv, "
                      "cos/sin in the data's dtype"),
    Entry("tokenspeed_qkv", "tokenspeed `packed_qkv_complex_rotary`", "engine", "#66c2a5",
          ("rope", "encoder"),
          description="tokenspeed-kernel's `packed_qkv_complex_rotary` (Triton, stock Triton here): packed qkv "
                      "in, contiguous q/k out"),
    Entry("transformer_engine", "TransformerEngine fused RoPE", "engine", "#b5cf6b",
          description="TransformerEngine `apply_rotary_pos_emb(interleaved=True)`: recorded as not run "
                      "(no route onto the device)"),
    Entry("liger", "Liger", "engine", "#ff7f0e", description="Liger-Kernel `llama4_rope`"),
    Entry("gemm_epilogue_quack", "RoPE in QuACK's GEMM", "engine", "#4d004b", ("encoder",)),
    Entry("quack_gemm_rope", "QuACK GEMM + RoPE epilogue", "engine", "#c51b7d", ("qkv",)),
    Entry("quack_gemm", "QuACK GEMM (no RoPE)", "engine", "#de77ae", ("qkv",)),
    # -- baselines --------------------------------------------------------------------------
    Entry("native", "native (PyTorch complex)", "baseline", "#222222", ("rope", "encoder")),
    Entry("compiled", "torch.compile", "baseline", "#2ca02c",
          description="torch.compile (Inductor) of the cos/sin form"),
    Entry("vllm_merged_recreated", "merged path, our re-creation", "baseline", "#9edae5", ("rope", "encoder")),
    Entry("cublas_linear", "cuBLAS (no RoPE)", "baseline", "#000080", ("qkv",)),
    Entry("cublas_linear+fused_rope", "cuBLAS + fused RoPE", "baseline", "#ffbb78", ("qkv",)),
    Entry("compile_max_autotune", "torch.compile max-autotune", "baseline", "#98df8a", ("qkv",)),
    # -- references: limits and floors ---------------------------------------------------------
    Entry("none", "RoPE skipped (the floor)", "reference", "#a0a0a0", ("encoder",)),
    Entry("copy", "copy ceiling", "reference", "#5f5f5f", ("copy",)),
    Entry("copy_sm", "same-bytes SM copy", "reference", "#c7c7c7", ("copy",)),
    Entry("qkv_gemm_rotation_compiled_out", "our Triton QKV GEMM, rotation compiled out", "reference",
          "#e7969c", ("qkv",)),
    Entry("qkv_cute_rotation_compiled_out", "our CuTe QKV GEMM, rotation compiled out", "reference",
          "#8fbc8f", ("qkv",)),
]

CATALOGUE: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Add ``entry`` (a new name only); its order is its position."""
    if not isinstance(entry, Entry):
        raise TypeError(f"register takes a catalogue Entry, got {type(entry).__name__}")
    if entry.name in CATALOGUE:
        raise ValueError(f"catalogue: {entry.name!r} is registered already")
    CATALOGUE[entry.name] = entry
    return entry


for _e in _ENTRIES:
    register(_e)
del _e


def entry(name: str) -> Entry | None:
    """The catalogue's entry for ``name``, or None for a name it does not hold."""
    return CATALOGUE.get(name)


def order_key(name: str) -> tuple[int, int, str]:
    """Sort key: group, then catalogue position; unknown names last, by name."""
    e = CATALOGUE.get(name)
    if e is None:
        return (len(GROUPS), 0, name)
    return (GROUPS.index(e.group), list(CATALOGUE).index(name), name)


def names(kind: str | None = None, group: str | None = None) -> tuple[str, ...]:
    """Names in display order, optionally of one kind and/or group."""
    return tuple(n for n, e in CATALOGUE.items()
                 if (kind is None or kind in e.kinds) and (group is None or e.group == group))
