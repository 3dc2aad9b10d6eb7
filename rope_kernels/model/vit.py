"""A MoonViT-shaped vision encoder (Kimi-K2.5's vision tower) for latency studies.

Real dimensions, seeded random bf16 weights, inference only. Per layer:
LayerNorm -> packed qkv (T, 3, H, D) -> the chosen RoPE -> block-diagonal
attention per image -> output projection, then LayerNorm -> MLP (tanh GELU).
After the last layer: LayerNorm, 2x2 patch merge, projector to the LLM width.
The RoPE table is built once per forward and shared by all layers. Only the
RoPE step changes between variants, so encoder-time differences are RoPE's.

Window attention (Qwen2.5-VL: ``EncoderConfig.window`` > 0), as vLLM's
``model_executor/models/qwen2_5_vl.py`` (``Qwen2_5_VisionTransformer.get_window_index``) runs
it: the tokens (and the RoPE table) are gathered window by window once before the layers
(``window_partition``: windows of ``window`` patches a side, the edge windows smaller, none
padded), ``full_attention_layers`` attend to the whole image, the other layers within each
window (``cu_seqlens`` of the windows: varlen attention on a GPU that has it, else one batched
SDPA call per window size), and the tokens are gathered back after the last layer. Modelled:
both gathers (counted in the encoder's time, as vLLM pays them), the per-window attention, the
SiLU-gated MLP (``gated_mlp``). Not modelled: RMSNorm (LayerNorm here), the exact token order
inside a window (raster here, 2x2 merge units in vLLM: the same work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from rope_kernels.kernels.freqs import (grid_tokens, qwen_vision_freqs_cis, vision_freqs_cis,
                                        vision_patch_coords)
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.encoder_config import EncoderConfig  # noqa: F401  (the model's geometry)
from rope_kernels.encoder_parallel import WORLD, check_mode, layer_gemms
from rope_kernels.qkv import qkv_rope, qkv_rope_operands
from rope_kernels.variants import VARIANTS, encoder_only_absent, peer_status
# "none" (RoPE skipped: the floor), "gemm_epilogue" (q and k rotated inside the QKV
# projection's epilogue, kernels/qkv_gemm.py; "gemm_epilogue_cute": our CuTe DSL kernel,
# kernels/qkv_cute.py; "gemm_epilogue_cute_norot": the same kernel with its rotation compiled
# out, the floor on our own GEMM), "gemm_epilogue_quack" (the same in
# QuACK's GEMM, peers/quack_gemm.py, where QuACK runs); how attention runs ("auto": per device)
from rope_kernels.vocabulary import ATTENTION_KERNELS, ENCODER_ONLY_ROPE

# The encoder modes that rotate q and k inside the QKV projection: (qkv_rope backend, epilogue).
GEMM_EPILOGUE_MODES = {"gemm_epilogue": ("triton", "rope"), "gemm_epilogue_cute": ("cute", "rope"),
                       "gemm_epilogue_quack": ("quack", "rope"),
                       # our GEMM's floor: the CuTe kernel with its rotation compiled out
                       "gemm_epilogue_cute_norot": ("cute", "none")}


def rope_variants() -> tuple[str, ...]:
    """Every registered variant and peer that runs here (as the registry calls it on
    a packed qkv), plus the ``ENCODER_ONLY_ROPE`` variants that run here. Builds the
    registry on first call."""
    absent = encoder_only_absent()
    return (*VARIANTS, *(v for v in ENCODER_ONLY_ROPE if v not in absent))


class _Layer(nn.Module):
    def __init__(self, cfg: EncoderConfig, mode: str = "1gpu", world: int = WORLD):
        super().__init__()
        # one GPU's shard under the encoder parallel mode (encoder_parallel.py): tp8 splits
        # the QKV and fc0 outputs and the proj and fc1 inputs 8 ways (the all-reduces are modelled)
        g = layer_gemms(cfg.hidden, cfg.heads, cfg.mlp, mode, world)
        self.norm0 = nn.LayerNorm(cfg.hidden)
        self.wqkv = nn.Linear(*g["qkv"])
        self.wo = nn.Linear(*g["proj"])
        self.norm1 = nn.LayerNorm(cfg.hidden)
        # a gated MLP's fc0 makes gate and up at once (SiLU(gate) * up), twice the columns
        self.fc0 = nn.Linear(g["fc1"][0], g["fc1"][1] * (2 if cfg.gated_mlp else 1))
        self.fc1 = nn.Linear(*g["fc2"])


class MoonViTEncoder(nn.Module):
    """``forward(patches, grids, rope=..., attention=...)`` -> (tokens/4, text_hidden).
    ``encoder_parallel``: "tp8" builds one GPU's shard of every layer (``cfg.heads / 8``
    heads; ``encoder_parallel.layer_gemms``; ``world``: the GPUs it splits over), "1gpu" and "dp8"
    the whole layers. ``all_reduce`` (None: none, as on one GPU): called on the output of each
    row-parallel GEMM (proj, fc2) by the distributed runner (bench/distributed_encoder.py)."""

    def __init__(self, cfg: EncoderConfig, *, device=None, dtype=torch.bfloat16, seed: int = 0,
                 encoder_parallel: str = "1gpu", world: int = WORLD):
        super().__init__()
        self.cfg = cfg
        self.encoder_parallel = check_mode(encoder_parallel)
        self.heads = layer_gemms(cfg.hidden, cfg.heads, cfg.mlp, encoder_parallel, world)["heads"][0]
        self.all_reduce = None
        self.patch_embed = nn.Conv2d(3, cfg.hidden, cfg.patch, cfg.patch)
        self.pos_emb = nn.Parameter(torch.empty(cfg.pos_grid, cfg.pos_grid, cfg.hidden))
        self.blocks = nn.ModuleList(_Layer(cfg, encoder_parallel, world) for _ in range(cfg.layers))
        self.final_norm = nn.LayerNorm(cfg.hidden)
        self.proj_norm = nn.LayerNorm(cfg.hidden)
        merged = cfg.hidden * cfg.merge**2
        self.proj0 = nn.Linear(merged, merged)
        self.proj1 = nn.Linear(merged, cfg.text_hidden)
        self._init_weights(seed)
        self.to(device=device, dtype=dtype)
        self.eval()
        self.requires_grad_(False)

    def _init_weights(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if "norm" in name:
                p.data.copy_(1.0 + 0.02 * torch.randn(p.shape, generator=gen)
                             if name.endswith("weight") else 0.02 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[1] if p.dim() == 2 else (p[0].numel() if p.dim() == 4 else 1)
                std = 1.0 / math.sqrt(fan_in) if p.dim() in (2, 4) else 0.02
                p.data.copy_(std * torch.randn(p.shape, generator=gen))

    # -- pieces -------------------------------------------------------------
    def _position_embedding(self, grids):
        if not self.cfg.pos_grid:  # no learnable position table (Qwen2.5-VL): RoPE only
            return 0
        table = self.pos_emb.permute(2, 0, 1).unsqueeze(0).float()
        cache: dict[tuple[int, int], torch.Tensor] = {}
        parts = []
        for t, h, w in grids:
            if (h, w) not in cache:
                if (h, w) == tuple(self.pos_emb.shape[:2]):
                    emb = self.pos_emb.reshape(h * w, -1)
                else:
                    emb = F.interpolate(table, size=(h, w), mode="bicubic", align_corners=False)
                    emb = emb.squeeze(0).permute(1, 2, 0).reshape(h * w, -1).to(self.pos_emb.dtype)
                cache[(h, w)] = emb
            parts.append(cache[(h, w)].repeat(t, 1))
        return torch.cat(parts)

    @staticmethod
    def _rope(rope: str, qkv: torch.Tensor, freqs_cis, cos, sin, rotation: str = "pairs"):
        if rope == "none":
            return qkv.unbind(1)
        variant = VARIANTS[rope]
        with record_function("rope"):
            return variant.packed(qkv, freqs_cis, cos, sin, rotation)

    def _attention(self, kind: str, q, k, v, grids, cu_seqlens, max_seqlen) -> torch.Tensor:
        tokens, heads, head_dim = q.shape
        if kind in ("sdpa_cudnn_batched", "sdpa_batched"):
            seq = grids[0][0] * grids[0][1] * grids[0][2]
            batch = tokens // seq

            def bhsd(x):
                return x.reshape(batch, seq, heads, head_dim).transpose(1, 2)

            if kind == "sdpa_cudnn_batched":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    o = F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v))
            else:
                o = F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v))
            return o.transpose(1, 2).reshape(tokens, heads * head_dim)
        if kind == "varlen_attn":
            from torch.nn.attention.varlen import varlen_attn

            o = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)
            return o.reshape(tokens, heads * head_dim)
        # one SDPA call per image: works everywhere (CPU included)
        outs, start = [], 0
        for t, h, w in grids:
            n = t * h * w
            sl = slice(start, start + n)
            o = F.scaled_dot_product_attention(q[sl].transpose(0, 1), k[sl].transpose(0, 1),
                                               v[sl].transpose(0, 1))
            outs.append(o.transpose(0, 1).reshape(n, heads * head_dim))
            start += n
        return torch.cat(outs)

    @staticmethod
    def _window_attention(q, k, v, windows: "Windows") -> torch.Tensor:
        """Attention within each window (``windows``: ``window_partition``'s, tokens in window
        order): varlen attention over the windows' ``cu_seqlens`` on a GPU that has it, else
        one batched SDPA call per window size (CPU, float32 included)."""
        tokens, heads, head_dim = q.shape
        # flash attention's varlen kernel takes bf16/fp16 only (the float32 reference: SDPA)
        if q.dtype in (torch.bfloat16, torch.float16) and windows_kernel(q.device, head_dim) == "varlen_attn":
            from torch.nn.attention.varlen import varlen_attn

            o = varlen_attn(q, k, v, windows.cu_seqlens, windows.cu_seqlens, windows.max_seqlen,
                            windows.max_seqlen)
            return o.reshape(tokens, heads * head_dim)
        out = q.new_empty(tokens, heads, head_dim)
        for idx, count, size in windows.groups:
            def bhsd(x):
                return x.index_select(0, idx).view(count, size, heads, head_dim).transpose(1, 2)

            o = F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v))
            out.index_copy_(0, idx, o.transpose(1, 2).reshape(count * size, heads, head_dim))
        return out.reshape(tokens, heads * head_dim)

    def _merge(self, x: torch.Tensor, grids) -> torch.Tensor:
        m = self.cfg.merge
        parts, start = [], 0
        for t, h, w in grids:
            n = t * h * w
            img = x[start:start + n].reshape(t, h // m, m, w // m, m, -1)
            parts.append(img.permute(0, 1, 3, 2, 4, 5).reshape(-1, m * m, x.shape[-1]))
            start += n
        return torch.cat(parts)

    # -- forward ------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, patches: torch.Tensor, grids, *, rope: str = "native",
                attention: str = "sdpa_per_image", cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        if rope not in rope_variants():
            absent = {s["name"]: s["reason"] for s in peer_status() if not s["available"]}
            absent.update(encoder_only_absent())
            why = (f" ({rope} is not available here: {absent[rope]})"
                   if isinstance(rope, str) and rope in absent else "")
            raise ValueError(f"rope must be one of {rope_variants()}, got {rope!r}{why}")
        if attention not in ATTENTION_KERNELS[1:]:
            raise ValueError(f"attention must be one of {ATTENTION_KERNELS[1:]}, got {attention!r}"
                             " (resolve 'auto' with pick_attention first)")
        cfg = self.cfg
        grids = [tuple(g) for g in grids]
        tokens = grid_tokens(grids)
        want = (tokens, 3, cfg.patch, cfg.patch)
        if tuple(patches.shape) != want:
            raise ValueError(f"patches must have shape {want} for these grids, got {tuple(patches.shape)}")
        for g in grids:
            if g[1] % cfg.merge or g[2] % cfg.merge:
                raise ValueError(f"grid {g} sides must be multiples of the {cfg.merge}x{cfg.merge} merge")
        if attention == "varlen_attn" and (cu_seqlens is None or max_seqlen is None):
            raise ValueError("varlen_attn needs cu_seqlens and max_seqlen (see encoder_inputs)")
        if rope in GEMM_EPILOGUE_MODES and cfg.rotation != "pairs":
            raise ValueError(f"{rope} rotates Kimi's interleaved pairs only; this encoder rotates "
                             f"{cfg.rotation!r} (Qwen's rotate-half)")
        if cfg.rotation != "pairs" and rope in VARIANTS and (why := VARIANTS[rope].unsupported(
                patches.dtype, head_dim=cfg.head_dim, rotation=cfg.rotation)):
            raise ValueError(f"rope {rope!r} cannot run in this encoder: {why}")

        x = self.patch_embed(patches).reshape(tokens, cfg.hidden)
        x = x + self._position_embedding(grids)
        if cfg.rotation == "half":  # Qwen's rotate-half angle layout (the tokens as Qwen orders them)
            freqs_cis = qwen_vision_freqs_cis(grids, cfg.head_dim, merge_size=cfg.merge,
                                              theta=cfg.theta, device=x.device)
        else:
            freqs_cis = vision_freqs_cis(grids, cfg.head_dim, theta=cfg.theta, device=x.device)
        windows = None
        if cfg.window:  # gather the tokens (and their angles) window by window, as vLLM does
            key = (tuple(grids), cfg.window, str(x.device))  # built once (never inside a graph capture)
            if key not in _WINDOWS:
                _WINDOWS[key] = window_partition(grids, cfg.window, device=x.device)
            windows = _WINDOWS[key]
            x = x.index_select(0, windows.order)
            freqs_cis = freqs_cis.index_select(0, windows.order)
        cos, sin = cos_sin_views(freqs_cis)
        operands = None
        for i, blk in enumerate(self.blocks):
            h = blk.norm0(x)
            if rope in GEMM_EPILOGUE_MODES:
                backend, epilogue = GEMM_EPILOGUE_MODES[rope]
                if operands is None:  # positions and frequencies, once per forward
                    operands = qkv_rope_operands(vision_patch_coords(grids, device=x.device),
                                                 heads=self.heads, head_dim=cfg.head_dim,
                                                 theta=cfg.theta, backend=backend)
                q, k, v = qkv_rope(h, blk.wqkv.weight, blk.wqkv.bias, operands, heads=self.heads,
                                   head_dim=cfg.head_dim, backend=backend,
                                   epilogue=epilogue).unbind(1)
            else:
                qkv = blk.wqkv(h).view(tokens, 3, self.heads, cfg.head_dim)
                q, k, v = self._rope(rope, qkv, freqs_cis, cos, sin, cfg.rotation)
            if windows is not None and cfg.windowed(i):
                o = self._window_attention(q, k, v, windows)
            else:  # a window order keeps each image's tokens together: whole-image attention holds
                o = self._attention(attention, q, k, v, grids, cu_seqlens, max_seqlen)
            reduce = self.all_reduce or (lambda t: t)
            x = x + reduce(blk.wo(o))
            h = blk.norm1(x)
            if cfg.gated_mlp:
                gate, up = blk.fc0(h).chunk(2, dim=-1)
                x = x + reduce(blk.fc1(F.silu(gate) * up))
            else:
                x = x + reduce(blk.fc1(F.gelu(blk.fc0(h), approximate="tanh")))
        if windows is not None:  # back to the image order for the merge
            x = x.index_select(0, windows.restore)
        x = self.final_norm(x)
        merged = self.proj_norm(self._merge(x, grids)).reshape(-1, cfg.hidden * cfg.merge**2)
        return self.proj1(F.gelu(self.proj0(merged)))


@dataclass(frozen=True)
class Windows:
    """Window attention's token layout (``window_partition``): ``order`` gathers the tokens
    window by window (``x[order]``), ``restore`` gathers them back; ``cu_seqlens`` (int32) and
    ``max_seqlen`` bound the windows in window order; ``groups``: per window size, the
    window-order indexes of its windows' tokens, the number of windows and their size."""
    order: torch.Tensor
    restore: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    groups: tuple[tuple[torch.Tensor, int, int], ...]


_WINDOWS: dict = {}  # (grids, window, device) -> Windows


def window_partition(grids, window: int, *, device=None) -> Windows:
    """Windows of ``window`` x ``window`` patches over each image of ``grids`` ((t, h, w)
    patches, images in order), row-major; the last row and column of windows are smaller
    where a side is not a multiple of ``window`` (vLLM pads its index and drops the padding:
    the same windows). Tokens are taken to be in raster order within each image."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (patches a side), got {window!r}")
    order, lengths, start = [], [], 0
    for t, h, w in grids:
        idx = torch.arange(t * h * w).view(t, h, w)
        for f in range(t):
            for r in range(0, h, window):
                for c in range(0, w, window):
                    win = idx[f, r:r + window, c:c + window].reshape(-1)
                    order.append(win + start)
                    lengths.append(win.numel())
        start += t * h * w
    order = torch.cat(order)
    restore = torch.empty_like(order)
    restore[order] = torch.arange(order.numel())
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    groups = []
    for size in sorted(set(lengths)):
        starts = [int(cu[i]) for i, n in enumerate(lengths) if n == size]
        idx = (torch.tensor(starts).unsqueeze(1) + torch.arange(size)).reshape(-1)
        groups.append((idx.to(device), len(starts), size))
    return Windows(order.to(device), restore.to(device), cu.to(device), max(lengths), tuple(groups))


_VARLEN_OK: dict = {}


def windows_kernel(device, head_dim: int = 80) -> str:
    """How windowed layers attend on ``device``: ``varlen_attn`` on a GPU whose torch has it
    and where it agrees with SDPA at ``head_dim`` on two uneven windows (probed once, eager:
    call it before a graph capture), else ``sdpa_per_window_size`` (one batched SDPA call per
    window size)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "sdpa_per_window_size"
    key = (str(device), head_dim)
    if key not in _VARLEN_OK:
        try:
            from torch.nn.attention.varlen import varlen_attn

            q, k, v = torch.randn(3, 80, 2, head_dim, device=device, dtype=torch.bfloat16).unbind(0)
            cu = torch.tensor([0, 64, 80], dtype=torch.int32, device=device)
            out = varlen_attn(q, k, v, cu, cu, 64, 64)
            ref = torch.cat([F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1).float() for t in (q, k, v)))
                             .transpose(0, 1) for a, b in ((0, 64), (64, 80))])
            _VARLEN_OK[key] = bool((out.float() - ref).abs().max() < 5e-2)
        except (ImportError, RuntimeError):
            _VARLEN_OK[key] = False
    return "varlen_attn" if _VARLEN_OK[key] else "sdpa_per_window_size"


@dataclass(frozen=True)
class EncoderInputs:
    patches: torch.Tensor
    grids: tuple[tuple[int, int, int], ...]
    cu_seqlens: torch.Tensor
    max_seqlen: int

    @property
    def tokens(self) -> int:
        return self.patches.shape[0]


def encoder_inputs(grids, cfg: EncoderConfig, *, device=None, dtype=torch.bfloat16,
                   seed: int = 0) -> EncoderInputs:
    """Random patches (never zeros) for the given grids, plus varlen metadata."""
    grids = tuple(tuple(int(v) for v in g) for g in grids)
    tokens = grid_tokens(grids)
    gen = torch.Generator().manual_seed(seed)
    patches = torch.randn(tokens, 3, cfg.patch, cfg.patch, generator=gen).to(device=device, dtype=dtype)
    lengths = [t * h * w for t, h, w in grids]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32,
                      device=device)
    return EncoderInputs(patches, grids, cu, max(lengths))


def pick_attention(grids, device) -> str:
    """The best attention kernel available here for these images.

    Equal-size images batch into one SDPA call (cuDNN's kernel was fastest on
    an H200 for this shape); mixed sizes use varlen attention; the CPU, or a
    GPU build without these, falls back to one SDPA call per image.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return "sdpa_per_image"
    if len({tuple(g) for g in grids}) == 1:
        return "sdpa_cudnn_batched" if _cudnn_attention_works(device) else "sdpa_batched"
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return "sdpa_per_image"
    return "varlen_attn"


_CUDNN_OK: dict[str, bool] = {}


def _cudnn_attention_works(device: torch.device) -> bool:
    """Probe once: cuDNN attention with head_dim 72 on strided (packed-qkv) inputs."""
    key = str(device)
    if key not in _CUDNN_OK:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            qkv = torch.randn(2, 64, 3, 2, 72, device=device, dtype=torch.bfloat16)
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
            _CUDNN_OK[key] = bool((out.float() - ref).abs().max() < 5e-2)
        except (RuntimeError, ImportError):
            _CUDNN_OK[key] = False
    return _CUDNN_OK[key]
