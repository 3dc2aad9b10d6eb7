"""The study's own kernels: Kimi's native path and float64 reference, the fused
q/k Triton kernel, Kimi's 2D RoPE table, input checks, and a re-creation of the
path vLLM PR #50400 merged (a CPU-test fallback, never a peer's headline row)."""
