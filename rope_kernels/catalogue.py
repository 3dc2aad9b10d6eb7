"""One catalogue of every name the study shows: RoPE variants, encoder RoPE modes, QKV-GEMM
variants and copy references, each with its label, group, colour and display order.

Plots, findings, targets, the index and the reports read names, labels, colours and order from
here (nothing else keeps its own list); ``vocabulary``'s variant tuples (known, own, peer, in
place, encoder-only) are derived from it. A new RoPE peer is one ``Entry`` here naming its peer
module (``module``) plus that module's ``rope_variant(name)`` (see ``variants``): the registry,
the parameter checks, the plots' colours, the findings' tables and, for a ``contender``, the
targets' like-for-like pairing pick it up with no other edit
(``tests/test_catalogue.py`` registers a dummy peer to show it). Importable without torch (the
vocabulary layer).

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
    peer: bool = False  # someone else's code, run from their package (rows carry its version)
    # a kernel a Kimi-K2.5 deployment would run instead of ours: the targets judge ours
    # against it like for like (``targets.ENGINE_PEERS``)
    contender: bool = False
    # the module whose ``rope_variant(name)`` builds the registry's Variant ("": variants.py
    # builds it itself)
    module: str = ""

    def __post_init__(self):
        if self.group not in GROUPS:
            raise ValueError(f"catalogue entry {self.name!r}: group must be one of {GROUPS}, got {self.group!r}")
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise ValueError(f"catalogue entry {self.name!r}: unknown kinds {bad} (known: {KINDS})")
        if self.contender and not (self.peer and "rope" in self.kinds):
            raise ValueError(f"catalogue entry {self.name!r}: a contender is a peer RoPE kernel "
                             "(peer=True, kinds with 'rope')")
        if self.module and "rope" not in self.kinds:
            raise ValueError(f"catalogue entry {self.name!r}: module builds a registry variant, "
                             "which needs kinds with 'rope'")
        c = self.colour
        if not (isinstance(c, str) and len(c) == 7 and c[0] == "#"
                and all(ch in "0123456789abcdefABCDEF" for ch in c[1:])):
            raise ValueError(f"catalogue entry {self.name!r}: colour must be '#rrggbb', got {c!r}")


_ENTRIES: list[Entry] = [
    # -- ours ------------------------------------------------------------------------------
    Entry("fused", "fused (ours)", "ours", "#d62728", ("rope", "encoder")),
    Entry("fused_inplace", "fused in place (ours)", "ours", "#ff9da7", ("rope", "encoder"), inplace=True),
    Entry("gemm_epilogue", "RoPE in our Triton QKV GEMM", "ours", "#bcbd22", ("encoder",)),
    Entry("gemm_epilogue_cute", "RoPE in our CuTe DSL QKV GEMM", "ours", "#6b8e23", ("encoder",)),
    Entry("qkv_rope_linear", "our Triton QKV GEMM + RoPE (table)", "ours", "#8b0000", ("qkv",)),
    Entry("qkv_rope_linear_angles", "our Triton QKV GEMM + RoPE (angles)", "ours", "#c49c94", ("qkv",)),
    Entry("qkv_rope_linear_cute", "our CuTe DSL QKV GEMM + RoPE", "ours", "#2f4f4f", ("qkv",)),
    # -- the engines' and kernel libraries' code, from their pinned files ------------------
    Entry("vllm_packed_qk", "vLLM `packed_qk_rope_`", "engine", "#1f77b4", ("rope", "encoder"), inplace=True,
          description="vLLM's `packed_qk_rope_`, in place on the packed qkv, as `kimi_k25_vit.py` calls it",
          peer=True, contender=True, module="rope_kernels.peers.vllm"),
    Entry("sglang_kimi_k25", "SGLang Kimi-K2.5 path (JIT CUDA)", "engine", "#4b0082", ("rope", "encoder"),
          description="SGLang's Kimi-K2.5 tower path: q/k/v made contiguous, then its JIT-compiled CUDA rope "
                      "in place", peer=True, contender=True, module="rope_kernels.peers.sglang_kimi_k25"),
    Entry("sglang_vision", "SGLang `vision_rope` (Triton)", "engine", "#9467bd", ("rope", "encoder"),
          description="SGLang's Triton `apply_fused_qk_complex_rope` (out of place)", peer=True, contender=True,
          module="rope_kernels.peers.sglang"),
    Entry("flashinfer", "FlashInfer", "engine", "#8c564b", ("rope", "encoder"), inplace=True,
          description="FlashInfer `apply_rope_with_cos_sin_cache_inplace`", peer=True, contender=True,
          module="rope_kernels.peers.flashinfer"),
    Entry("quack_qkv", "QuACK `apply_rotary_emb_qkv_`", "engine", "#e377c2", ("rope", "encoder"), inplace=True,
          description="QuACK `apply_rotary_emb_qkv_` in place on the packed qkv", peer=True, contender=True,
          module="rope_kernels.peers.quack"),
    Entry("quack_rotary", "QuACK `apply_rotary`", "engine", "#7b4173",
          description="QuACK `apply_rotary`, out of place", peer=True, contender=True,
          module="rope_kernels.peers.quack"),
    Entry("vllm_merged", "merged PR path (vLLM's kernel)", "engine", "#17becf", ("rope", "encoder"),
          description="the path PR #50400 merged, with vLLM's bundled flash-attention `apply_rotary`",
          peer=True, module="rope_kernels.peers.vllm"),
    Entry("liger", "Liger", "engine", "#ff7f0e", description="Liger-Kernel `llama4_rope`", peer=True,
          module="rope_kernels.peers.baselines"),
    Entry("gemm_epilogue_quack", "RoPE in QuACK's GEMM", "engine", "#4d004b", ("encoder",), peer=True),
    Entry("quack_gemm_rope", "QuACK GEMM + RoPE epilogue", "engine", "#c51b7d", ("qkv",), peer=True),
    Entry("quack_gemm", "QuACK GEMM (no RoPE)", "engine", "#de77ae", ("qkv",), peer=True),
    Entry("vllm_rotary_qkv", "vLLM flash-attn `apply_rotary_emb_qkv_`", "engine", "#393b79",
          ("rope", "encoder"), inplace=True,
          description="vLLM's bundled flash-attention `apply_rotary_emb_qkv_`, in place on the packed qkv, "
                      "cos/sin in the data's dtype", peer=True, contender=True,
          module="rope_kernels.peers.vllm"),
    Entry("tokenspeed_qkv", "tokenspeed `packed_qkv_complex_rotary`", "engine", "#66c2a5",
          ("rope", "encoder"),
          description="tokenspeed-kernel's `packed_qkv_complex_rotary` (Triton, stock Triton here): packed qkv "
                      "in, contiguous q/k out", peer=True, contender=True,
          module="rope_kernels.peers.tokenspeed"),
    Entry("transformer_engine", "TransformerEngine fused RoPE", "engine", "#b5cf6b",
          description="TransformerEngine `apply_rotary_pos_emb(interleaved=True)`: recorded as not run "
                      "(no route onto the device)", peer=True,
          module="rope_kernels.peers.transformer_engine"),
    # -- baselines --------------------------------------------------------------------------
    Entry("native", "native (PyTorch complex)", "baseline", "#222222", ("rope", "encoder")),
    Entry("compiled", "torch.compile", "baseline", "#2ca02c",
          description="torch.compile (Inductor) of the cos/sin form", peer=True,
          module="rope_kernels.peers.baselines"),
    Entry("vllm_merged_recreated", "merged path, our re-creation", "baseline", "#9edae5", ("rope", "encoder")),
    Entry("cublas_linear", "cuBLAS (no RoPE)", "baseline", "#000080", ("qkv",)),
    Entry("cublas_linear+fused_rope", "cuBLAS + fused RoPE", "baseline", "#ffbb78", ("qkv",)),
    Entry("compile_max_autotune", "torch.compile max-autotune", "baseline", "#98df8a", ("qkv",), peer=True),
    # -- references: limits and floors ---------------------------------------------------------
    Entry("none", "RoPE skipped (the floor)", "reference", "#a0a0a0", ("encoder",)),
    Entry("copy", "copy ceiling", "reference", "#5f5f5f", ("copy",)),
    Entry("copy_sm", "same-bytes SM copy", "reference", "#c7c7c7", ("copy",)),
    Entry("qkv_gemm_rotation_compiled_out", "our Triton QKV GEMM, rotation compiled out", "reference",
          "#b8860b", ("qkv",)),
    Entry("gemm_epilogue_cute_norot", "our CuTe DSL QKV GEMM, rotation compiled out (our GEMM's floor)",
          "reference", "#17d4a0", ("encoder",),
          description="the encoder with our CuTe DSL QKV kernel and its rotation compiled out: RoPE skipped "
                      "on our own GEMM, so gemm_epilogue_cute minus it is RoPE's own cost"),
    Entry("qkv_cute_rotation_compiled_out", "our CuTe QKV GEMM, rotation compiled out", "reference",
          "#6a3d9a", ("qkv",)),
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


def names(kind: str | None = None, group: str | None = None, **fields: bool) -> tuple[str, ...]:
    """Names in display order, optionally of one kind and/or group, and with the given
    flags (e.g. ``peer=True``, ``inplace=False``)."""
    bad = sorted(set(fields) - {"inplace", "peer", "contender"})
    if bad:
        raise TypeError(f"catalogue.names: unknown flags {bad} (known: inplace, peer, contender)")
    return tuple(n for n, e in CATALOGUE.items()
                 if (kind is None or kind in e.kinds) and (group is None or e.group == group)
                 and all(getattr(e, f) == want for f, want in fields.items()))


def ordered(variants) -> list[str]:
    """``variants`` (each once) in display order: catalogue order, unknown names last by name."""
    return sorted(dict.fromkeys(variants), key=order_key)


def label(name: str) -> str:
    """The name's label (a name the catalogue does not hold: itself, in backticks)."""
    e = CATALOGUE.get(name)
    return e.label if e is not None else f"`{name}`"
