"""TransformerEngine 2.20.2's interleaved fused RoPE (``apply_rotary_pos_emb(...,
interleaved=True, fused=True)``): a peer with no route onto the study's devices, recorded
in ``peer_status`` with why, never run."""

from __future__ import annotations

PACKAGE = "transformer-engine"
PINNED_VERSION = "2.20.2"
ABSENT = (
    "not run: transformer-engine 2.20.2's PyTorch binding (transformer-engine-torch) is "
    "source-only on the index (a CUDA build against the node's torch), and the prebuilt "
    "transformer-engine-cu12 wheel that exports its C API (nvte_fused_rope_forward) is about "
    "729 MB, more than eleven times one device call's 64 MiB carry; no GPU node here has it "
    "installed")


def rope_variant(name: str) -> dict:
    """The registry's spec of ``transformer_engine`` (the catalogue's ``module`` contract:
    ``variants``): never available; its row names the pinned version it would run."""
    if name != "transformer_engine":
        raise ValueError(f"rope_kernels.peers.transformer_engine builds transformer_engine, not {name!r}")
    return {"package": PACKAGE, "available": lambda: (False, ABSENT), "absent_version": PINNED_VERSION}
