"""FlashInfer 0.7.4's head_dim overrun, shown directly (a GPU probe for the lead).

Calls ``flashinfer.rope.apply_rope_with_cos_sin_cache_inplace`` itself, bypassing this
project's refusal (``peers.flashinfer.supported_head_dim``), interleaved as our wrapper
calls it, on bf16 and fp16 q/k of head_dim 64, 72, 80 and 128, laid out two ways:
- ``contiguous``: (T, H, D) q and k, each the front of a buffer with 16 canary elements
  after its end;
- ``padded``: (T, H, D + 8) buffers of which the [..., :D] view is passed; elements
  D..D+7 of every head are canaries.
One line per case: which kernel pos_enc.cuh picks, whether our rule accepts the head_dim,
how many canaries changed, and the max error against float64 of every q and k head
(``ok`` when within the kernel checker's tolerance: twice native's own error plus a floor).
Expected from the source: at 72 the canaries change and, contiguous, the heads after the
first go wrong; at 64, 80 and 128 nothing changes.

    CUDA_HOME=/usr/local/cuda ROPE_PEERS_DIR=.peers PYTHONPATH=$PWD \\
        python tools/probe_flashinfer_overrun.py
"""

import sys

import torch

from rope_kernels.correctness import lowp_tolerance
from rope_kernels.kernels.reference import native_rope, rope_reference
from rope_kernels.peers import flashinfer

CANARY = 4096.0  # exact in bf16 and fp16, far from any rotated N(0, 1) value
TOKENS, HEADS, PAD = 64, 4, 8

if not torch.cuda.is_available():
    sys.exit("probe_flashinfer_overrun needs a CUDA device")
version, sha256, origin, rope = flashinfer.source()  # JIT-builds the module on first call
print(f"flashinfer {version} ({origin}, {sha256[:12]}); {TOKENS} tokens x {HEADS} heads", flush=True)
gen = torch.Generator(device="cuda").manual_seed(0)


def operand(dtype, head_dim, layout):
    """(q or k, its canaries): random normal values, canaries where the kernel must not write."""
    values = torch.randn(TOKENS, HEADS, head_dim, generator=gen, device="cuda").to(dtype)
    if layout == "contiguous":
        flat = torch.full((values.numel() + 16,), CANARY, dtype=dtype, device="cuda")
        x = flat[:values.numel()].view(TOKENS, HEADS, head_dim)
        canaries = flat[values.numel():]
    else:
        buf = torch.full((TOKENS, HEADS, head_dim + PAD), CANARY, dtype=dtype, device="cuda")
        x, canaries = buf[..., :head_dim], buf[..., head_dim:]
    x.copy_(values)
    return x, canaries


for dtype in (torch.bfloat16, torch.float16):
    for head_dim in (64, 72, 80, 128):
        angles = (torch.rand(TOKENS, head_dim // 2, generator=gen, device="cuda") * 2 - 1) * 64 * torch.pi
        freqs_cis = torch.polar(torch.ones_like(angles), angles)
        cache = torch.cat((freqs_cis.real, freqs_cis.imag), dim=-1).contiguous()  # as our wrapper
        positions = torch.arange(TOKENS, device="cuda", dtype=torch.int64)
        path = "fast" if head_dim in flashinfer.FAST_PATH_HEAD_DIMS else "RopeQuantize"
        accepted = flashinfer.supported_head_dim(head_dim, dtype)[0]
        for layout in ("contiguous", "padded"):
            (q, q_can), (k, k_can) = operand(dtype, head_dim, layout), operand(dtype, head_dim, layout)
            refs = rope_reference(q, k, freqs_cis)
            native = native_rope(q, k, freqs_cis)
            tol = lowp_tolerance(max((n.double() - r).abs().max().item() for n, r in zip(native, refs)),
                                 max(r.abs().max().item() for r in refs), dtype)
            rope.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_dim, cache, is_neox=False)
            torch.cuda.synchronize()
            changed = sum(int((c != CANARY).sum()) for c in (q_can, k_can))
            total = q_can.numel() + k_can.numel()
            per_head = [(x.double() - r).abs().amax(dim=(0, 2)).tolist() for x, r in zip((q, k), refs)]
            worst = max(max(h) for h in per_head)
            fmt = lambda errs: " ".join(f"{e:.3g}" for e in errs)  # noqa: E731
            print(f"{str(dtype).removeprefix('torch.'):8s} head_dim {head_dim:3d} {layout:10s} "
                  f"{path:12s} our rule {'accepts' if accepted else 'refuses'}: canaries changed "
                  f"{changed}/{total}; max err q heads [{fmt(per_head[0])}] k heads "
                  f"[{fmt(per_head[1])}] (tolerance {tol:.3g}: {'ok' if worst <= tol else 'WRONG'})",
                  flush=True)
