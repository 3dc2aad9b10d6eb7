"""Where does an encoder forward's time go, per RoPE mode? (H200 exploration, ~60 s.)

Profiles one eager forward of the Kimi-shaped encoder (16 x 1024x1024 by default) per
mode with torch.profiler and prints the device time per kernel family (GEMM, our QKV
GEMM, RoPE, attention, other) and the top kernels; then times the batched attention
alone with q/k/v as the modes hand them over (strided views of the packed QKV
output, or contiguous q/k), to tell whether the layout of q/k costs the attention.
Usage: python tools/encoder_profile.py [--images 16] [--modes fused,gemm_epilogue,none]"""

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from rope_kernels.bench.encoder_bench import _forward, make_bucket
from rope_kernels.model.vit import EncoderConfig, MoonViTEncoder, encoder_inputs, pick_attention


def _option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


FAMILIES = (("qkv_gemm(ours)", ("_qkv_rope_kernel",)), ("rope", ("rope", "_fused", "_rotary")),
            ("attention", ("fmha", "flash", "cudnn", "attention", "sm90_xmma_fprop", "fprop")),
            ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")))


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k.lower() in low for k in keys):
            return fam
    return "other"


DEV = _option("--device", "cuda")  # cpu: a smoke test of this script (--small)
cfg = EncoderConfig.small() if "--small" in sys.argv else EncoderConfig.kimi_k25()
bucket = make_bucket("1024x1024", int(_option("--images", "16")))
model = MoonViTEncoder(cfg, device=DEV, dtype=torch.bfloat16, seed=0)
inp = encoder_inputs(bucket.grids, cfg, device=DEV)
att = pick_attention(bucket.grids, DEV)
print("tokens", bucket.vit_tokens, "attention", att, flush=True)

def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(f):
    if DEV != "cuda":
        import time
        t0 = time.perf_counter(); f(); return (time.perf_counter() - t0) * 1e6
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); f(); e.record(); e.synchronize()
    return s.elapsed_time(e) * 1e3


for mode in _option("--modes", "fused,gemm_epilogue,none").split(","):
    for _ in range(2):
        _forward(model, inp, mode, att)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _forward(model, inp, mode, att)
        sync()
    per = defaultdict(float)
    fam = defaultdict(float)
    for e in prof.events():
        if not str(e.device_type).endswith("CPU") and not getattr(e, "is_user_annotation", False):
            per[e.name] += e.time_range.elapsed_us() / 1e3
            fam[family(e.name)] += e.time_range.elapsed_us() / 1e3
    print(f"\n== {mode}: device {sum(per.values()):.2f} ms; "
          + "  ".join(f"{k} {v:.2f}" for k, v in sorted(fam.items())), flush=True)
    for name, ms in sorted(per.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {ms:8.2f} ms  {family(name):15s} {name[:110]}")

# attention alone: q/k/v strided (packed (T, 3, H, D) views) vs q/k contiguous
T, H, D = bucket.vit_tokens, cfg.heads, cfg.head_dim
qkv = torch.randn(T, 3, H, D, device=DEV, dtype=torch.bfloat16)
q, k, v = qkv.unbind(1)
qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
three = torch.randn(3, T, H, D, device=DEV, dtype=torch.bfloat16)
LAYOUTS = (("strided q,k,v", (q, k, v)), ("contiguous q,k; strided v", (qc, kc, v)),
           ("contiguous q,k,v", (qc, kc, vc)), ("(3,T,H,D) parts", tuple(three.unbind(0))))
for label, args in LAYOUTS:
    def f(args=args):
        return model._attention(att, *args, bucket.grids, inp.cu_seqlens, inp.max_seqlen)
    for _ in range(3):
        f()
    times = sorted(timed(f) for _ in range(15))
    print(f"attention {label:28s} median {times[7]:9.1f} us  p20 {times[3]:9.1f}  "
          f"p80 {times[11]:9.1f}", flush=True)
