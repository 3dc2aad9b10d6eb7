"""What RoPE must move at the least, and the time that takes at a measured copy
bandwidth: the floor every kernel and encoder measurement is read against.
Pure arithmetic (dtypes by name or as torch dtypes), importable without torch."""

from __future__ import annotations

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def element_size(dtype) -> int:
    """Bytes per element of ``dtype``: a name ('bfloat16') or a torch dtype."""
    name = str(dtype).removeprefix("torch.")
    if name in ELEMENT_BYTES:
        return ELEMENT_BYTES[name]
    itemsize = getattr(dtype, "itemsize", None)  # any other torch dtype
    if isinstance(itemsize, int):
        return itemsize
    raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(ELEMENT_BYTES)}")


def minimal_bytes(tokens: int, heads: int, head_dim: int, dtype) -> int:
    """Read and write q and k once, read fp32 cos and sin once."""
    return 4 * element_size(dtype) * tokens * heads * head_dim + 4 * tokens * head_dim


def rope_minimal_ms(tokens: int, heads: int, head_dim: int, layers: int, copy_gbps: float,
                    dtype="bfloat16") -> float:
    """The physical minimum of RoPE in one forward: its minimal bytes, every
    layer, at the measured copy bandwidth."""
    return layers * minimal_bytes(tokens, heads, head_dim, dtype) / (copy_gbps * 1e9) * 1e3
