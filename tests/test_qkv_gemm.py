"""The QKV projection with RoPE in its epilogue, against float64 on fresh random data.

Under the Triton interpreter the shapes are tiny: head_dim 72 with 2 heads, a
token count (37) that is not a multiple of any tile, hidden 48 (not a multiple
of block_k 32). The tolerance is the project's rule: at most 2x the error of
the native path in the same dtype (cuBLAS-style linear rounded to bf16, then
Kimi's native RoPE) plus a small floor.
"""

import pytest
import torch
import torch.nn.functional as F

from rope_kernels import native_rope, rope_reference, vision_freqs_cis
from rope_kernels.kernels.freqs import vision_patch_coords, vision_rope_frequencies
from rope_kernels.kernels.qkv_gemm import (PermutedQKVWeight, QKVGemmConfig, permute_qkv_weight,
                                           qkv_gemm_config, qkv_linear_rotation_compiled_out,
                                           qkv_rope_linear, qkv_rope_linear_angles, qkv_row_order,
                                           rotating_qkv_projection, tile_layout,
                                           unpermute_qkv_weight)
from rope_kernels.correctness import draw_qkv_problem, new_seed
from rope_kernels.kernels.reference import cos_sin_views

HEADS, HEAD_DIM, HIDDEN = 2, 72, 48
GRIDS = [(1, 4, 6), (1, 3, 4), (1, 1, 1)]  # 37 tokens, two images and a lone patch
TOKENS = 37
FLOOR = 1e-6


def make_problem(device, *, heads=HEADS, head_dim=HEAD_DIM, hidden=HIDDEN, grids=GRIDS,
                 bias=True, dtype=torch.bfloat16, seed=None):
    """correctness.draw_qkv_problem on the CPU generator (a seed: the same problem anywhere)."""
    gen = torch.Generator().manual_seed(new_seed() if seed is None else seed)
    return draw_qkv_problem(gen, grids, hidden, heads, head_dim, dtype, device, bias=bias)


def judge(out, x, w, b, freqs_cis):
    """(max error, tolerance) of packed qkv against float64 rope(linear(x))."""
    tokens = x.shape[0]
    heads = w.shape[0] // 3 // (2 * freqs_cis.shape[1])
    head_dim = 2 * freqs_cis.shape[1]
    ref = x.double() @ w.double().T
    if b is not None:
        ref = ref + b.double()
    ref = ref.view(tokens, 3, heads, head_dim)
    ref_q, ref_k = rope_reference(ref[:, 0], ref[:, 1], freqs_cis)
    lin = F.linear(x, w, b).view(tokens, 3, heads, head_dim)
    nat_q, nat_k = native_rope(lin[:, 0], lin[:, 1], freqs_cis)
    pairs = ((out[:, 0], ref_q), (out[:, 1], ref_k), (out[:, 2], ref[:, 2]))
    err = max((o.double() - r).abs().max().item() for o, r in pairs)
    native = max((o.double() - r).abs().max().item()
                 for o, r in ((nat_q, ref_q), (nat_k, ref_k), (lin[:, 2], ref[:, 2])))
    scale = max(r.abs().max().item() for _, r in pairs)
    return err, 2 * native + FLOOR * scale


def skip_warp_specialized_on_gpu(device: str) -> None:
    """The warp-specialized kernel hung on an H200 (QKVGemmConfig.warp_specialize):
    the GPU tier never launches it; the CPU tier runs it under the interpreter."""
    if device == "cuda":
        pytest.skip("the warp-specialized QKV kernel hung on an H200 (Triton 3.6); "
                    "tested under the interpreter and by its sm_90 compile only")


@pytest.mark.parametrize("use_tma", [False, True], ids=["pointers", "tma"])
def test_table_matches_float64(use_tma, device):
    x, w, b, freqs_cis = make_problem(device)
    config = QKVGemmConfig(**{**qkv_gemm_config(HEADS, HEAD_DIM, torch.device(device)).__dict__,
                              "use_tma": use_tma})
    if use_tma and device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    out = torch.full((TOKENS, 3, HEADS, HEAD_DIM), float("nan"), dtype=x.dtype, device=device)
    qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config, out=out)
    assert torch.isfinite(out).all(), "an output element was never written"
    err, tol = judge(out, x, w, b, freqs_cis)
    assert err <= tol, (err, tol)


def test_padded_tiles_no_bias(device):
    """A tile layout that pads heads (6 -> 8) and a wider N tile, no bias, fp16."""
    x, w, _, freqs_cis = make_problem(device, bias=False, dtype=torch.float16)
    config = QKVGemmConfig(block_m=16, block_n=64, block_k=16, heads_per_tile=8, group_m=2,
                           num_stages=1, num_warps=4)
    out = qkv_rope_linear(x, w, None, *cos_sin_views(freqs_cis), config=config)
    err, tol = judge(out, x, w, None, freqs_cis)
    assert err <= tol, (err, tol)


# Both kernels (one program per tile, persistent) and both epilogues (whole tile,
# two halves of its heads), through TMA descriptors and pointers, with the table
# and in-kernel angles: every path the GPU can take runs here too.
KERNEL_PATHS = {
    "per_tile": dict(persistent=False),
    "persistent": dict(persistent=True),
    "subtile": dict(persistent=False, epilogue_subtile=True),
    "persistent+subtile+pointers": dict(persistent=True, epilogue_subtile=True, use_tma=False),
    "persistent+tma": dict(persistent=True, use_tma=True),
    # the warp-specialized kernel: even/odd members in two accumulators, pointer stores
    # (interpreter only: it hung on an H200)
    "persistent+ws": dict(persistent=True, warp_specialize=True, num_warps=4),
}


@pytest.mark.parametrize("path", list(KERNEL_PATHS))
@pytest.mark.parametrize("angles", [False, True], ids=["table", "angles"])
def test_every_kernel_path_matches_float64(path, angles, device):
    x, w, b, freqs_cis = make_problem(device)
    base = qkv_gemm_config(HEADS, HEAD_DIM, torch.device(device))
    config = QKVGemmConfig(**{**base.__dict__, "group_m": 2, **KERNEL_PATHS[path]})
    if config.warp_specialize:
        skip_warp_specialized_on_gpu(device)
    if config.use_tma and device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    out = torch.full((TOKENS, 3, HEADS, HEAD_DIM), float("nan"), dtype=x.dtype, device=device)
    if angles:
        qkv_rope_linear_angles(x, w, b, vision_patch_coords(GRIDS, device=device),
                               vision_rope_frequencies(HEAD_DIM, device=device),
                               config=config, out=out)
    else:
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config, out=out)
    assert torch.isfinite(out).all(), "an output element was never written"
    err, tol = judge(out, x, w, b, freqs_cis)
    assert err <= tol, (path, err, tol)


KERNELS = {"per_tile": dict(persistent=False), "persistent": dict(persistent=True),
           "ws": dict(persistent=True, warp_specialize=True, num_warps=4)}


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_rotation_compiled_out_is_the_plain_projection(kernel, device):
    """The benchmarks' entry: the same kernel without rotation = x @ W^T + b, q/k unrotated."""
    if KERNELS[kernel].get("warp_specialize"):
        skip_warp_specialized_on_gpu(device)
    x, w, b, freqs_cis = make_problem(device)
    cos, sin = cos_sin_views(freqs_cis)
    config = QKVGemmConfig(**{**qkv_gemm_config(HEADS, HEAD_DIM, torch.device(device)).__dict__,
                              **KERNELS[kernel]})
    out = qkv_linear_rotation_compiled_out(x, w, b, cos, sin, config=config)
    ref = (x.double() @ w.double().T + b.double()).view(TOKENS, 3, HEADS, HEAD_DIM)
    lin_err = (F.linear(x, w, b).double().view_as(ref) - ref).abs().max().item()
    assert (out.double() - ref).abs().max().item() <= 2 * lin_err + FLOOR * ref.abs().max().item()
    rotated = qkv_rope_linear(x, w, b, cos, sin, config=config)
    assert torch.equal(rotated[:, 2], out[:, 2]), "v is never rotated"
    assert not torch.equal(rotated[:, :2], out[:, :2])


def test_config_labels_and_subtile_needs_two_heads():
    # the defaults: the H200 sweep's best (qkv_gemm_sweep.csv at 2e381e165ba8),
    # persistent with the subtiled epilogue
    assert QKVGemmConfig().label == "128x256x64x16/3/8/8/persistent/subtile"
    assert QKVGemmConfig(persistent=False, epilogue_subtile=False).label == "128x256x64x16/3/8/8"
    assert QKVGemmConfig(persistent=True, epilogue_subtile=True, use_tma=False).label == \
        "128x256x64x16/3/8/8/persistent/subtile/pointers"
    with pytest.raises(ValueError, match="heads_per_tile >= 2"):
        QKVGemmConfig(block_n=16, heads_per_tile=1, epilogue_subtile=True)
    with pytest.raises(TypeError, match="epilogue_subtile must be a bool"):
        QKVGemmConfig(epilogue_subtile=1)
    ws = QKVGemmConfig(block_n=128, num_warps=4, persistent=True, warp_specialize=True,
                       epilogue_subtile=False)
    assert ws.label == "128x128x64x16/3/4/8/persistent/ws"
    assert ws.kernel_name == "_qkv_rope_kernel_ws"
    assert QKVGemmConfig().kernel_name == "_qkv_rope_kernel_persistent"
    assert QKVGemmConfig(persistent=False).kernel_name == "_qkv_rope_kernel"
    # the warp-specialized kernel is persistent, 4 warps (its warp groups), TMA, one epilogue
    for bad, needs in ((dict(persistent=False), "persistent=True"),
                       (dict(num_warps=8), "num_warps=4"),
                       (dict(use_tma=False), "use_tma None or True"),
                       (dict(epilogue_subtile=True), "epilogue_subtile=False")):
        with pytest.raises(ValueError, match=f"warp_specialize .* needs {needs}"):
            QKVGemmConfig(**{**ws.__dict__, **bad})
    with pytest.raises(TypeError, match="warp_specialize must be a bool"):
        QKVGemmConfig(**{**ws.__dict__, "warp_specialize": 1})
    # the candidates notebook 05_qkv_gemm sweeps take each shape's layout
    from rope_kernels.kernels.qkv_gemm import (NVIDIA_QKV_CONFIG, QKV_CANDIDATE_CONFIGS,
                                               QKV_SWEEP_CONFIGS, QKV_WARP_SPECIALIZED_CONFIGS,
                                               with_layout)

    assert QKV_CANDIDATE_CONFIGS[0] == QKVGemmConfig()
    # the NVIDIA pick and the one before it (128x256 flat) are re-timed in every run;
    # the heads x pairs layout's former defaults stay in the sweep
    assert NVIDIA_QKV_CONFIG in QKV_CANDIDATE_CONFIGS
    assert QKVGemmConfig(heads_per_tile=1, flat_pairs=True) in QKV_CANDIDATE_CONFIGS
    assert QKVGemmConfig(persistent=False, epilogue_subtile=False) in QKV_SWEEP_CONFIGS
    assert QKVGemmConfig(epilogue_subtile=False) in QKV_SWEEP_CONFIGS
    assert set(QKV_CANDIDATE_CONFIGS) <= set(QKV_SWEEP_CONFIGS)
    # every GPU run re-times each candidate at three token counts (compiles included):
    # at most five, no repeats
    assert len(QKV_CANDIDATE_CONFIGS) <= 5
    assert len(set(QKV_CANDIDATE_CONFIGS)) == len(QKV_CANDIDATE_CONFIGS)
    assert len(set(QKV_SWEEP_CONFIGS)) == len(QKV_SWEEP_CONFIGS)
    # no timed list holds a warp-specialized config (it hung on an H200: a hang in
    # notebook 05 loses the GPU run); they are compiled only
    timed = QKV_CANDIDATE_CONFIGS + QKV_SWEEP_CONFIGS
    assert not [c.label for c in timed if c.warp_specialize]
    assert QKV_WARP_SPECIALIZED_CONFIGS and all(c.warp_specialize
                                                for c in QKV_WARP_SPECIALIZED_CONFIGS)
    for config in QKV_CANDIDATE_CONFIGS:
        fitted = with_layout(config, 2, 72)
        assert fitted.block_m == config.block_m and fitted.persistent == config.persistent


def test_padded_pairs(device):
    """A tile layout that pads each head's 36 pairs to 40 (8 pairs a tile, as the
    128x256 candidate does at Kimi's shape), through TMA and pointers."""
    x, w, b, freqs_cis = make_problem(device)
    for use_tma in (True, False):
        config = QKVGemmConfig(block_m=16, block_n=32, block_k=16, heads_per_tile=2, group_m=2,
                               num_stages=1, num_warps=4, use_tma=use_tma)
        assert config.pairs_per_tile == 8
        out = torch.full((TOKENS, 3, HEADS, HEAD_DIM), float("nan"), dtype=x.dtype, device=device)
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config, out=out)
        assert torch.isfinite(out).all(), "an output element was never written"
        err, tol = judge(out, x, w, b, freqs_cis)
        assert err <= tol, (use_tma, err, tol)


def test_wrong_rotation_is_caught(device):
    """A deliberately wrong epilogue (sin's sign flipped) must fail the check."""
    x, w, b, freqs_cis = make_problem(device)
    cos, sin = cos_sin_views(freqs_cis)
    out = qkv_rope_linear(x, w, b, cos, -sin)
    err, tol = judge(out, x, w, b, freqs_cis)
    assert err > 10 * tol


def test_wrong_permutation_is_caught(device):
    """Two rows of the permuted weight swapped (a wrong layout) must fail the check."""
    x, w, b, freqs_cis = make_problem(device)
    config = qkv_gemm_config(HEADS, HEAD_DIM, torch.device(device))
    good = permute_qkv_weight(w, b, HEADS, HEAD_DIM, block_n=config.block_n,
                              heads_per_tile=config.heads_per_tile)
    weight = good.weight.clone()
    weight[[0, config.block_n // 2]] = weight[[config.block_n // 2, 0]]  # an even/odd swap
    bad = PermutedQKVWeight(weight, good.bias, HEADS, HEAD_DIM, good.block_n, good.heads_per_tile)
    out = qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config, permuted=bad)
    err, tol = judge(out, x, w, b, freqs_cis)
    assert err > 10 * tol


def test_angles_match_table(device):
    """In-kernel angles from patch coordinates give the table's result."""
    x, w, b, freqs_cis = make_problem(device)
    table = qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis))
    angles = qkv_rope_linear_angles(x, w, b, vision_patch_coords(GRIDS, device=device),
                                    vision_rope_frequencies(HEAD_DIM, device=device))
    err, tol = judge(angles, x, w, b, freqs_cis)
    assert err <= tol, (err, tol)
    # cos/sin of the same fp32 angle may differ by an ulp between libraries:
    # at most one bf16 rounding step apart, almost always identical
    diff = (angles.float() - table.float()).abs()
    ulp = table.float().abs().clamp(min=1e-30) * 2.0**-7
    assert (diff <= ulp).all()
    assert (diff == 0).float().mean() > 0.99


def test_patch_coords_rebuild_the_table():
    """coords x frequencies, in torch, is exactly Kimi's table: the angles variant's inputs."""
    grids = [(1, 5, 7), (2, 2, 3)]
    coords = vision_patch_coords(grids)
    freqs = vision_rope_frequencies(HEAD_DIM)
    assert coords.dtype == torch.int32 and coords.shape == (35 + 12, 2)
    j = torch.arange(HEAD_DIM // 2)
    pos = torch.where(j % 2 == 0, coords[:, 1:2], coords[:, 0:1]).float()
    angle = pos * freqs[j // 2]
    assert torch.equal(torch.polar(torch.ones_like(angle), angle),
                       vision_freqs_cis(grids, HEAD_DIM))


@pytest.mark.parametrize("layout", [(128, 16), (64, 8), (64, 16), (32, 2), (16, 8)])
@pytest.mark.parametrize("heads,head_dim", [(16, 72), (2, 72), (3, 16), (1, 8)])
def test_permutation_is_invertible(layout, heads, head_dim):
    block_n, hpt = layout
    w = torch.randn(3 * heads * head_dim, 8).bfloat16()
    b = torch.randn(3 * heads * head_dim).bfloat16()
    order = qkv_row_order(heads, head_dim, block_n, hpt)
    kept = order[order >= 0]
    assert torch.equal(kept.sort().values, torch.arange(3 * heads * head_dim)), \
        "every row of W must appear exactly once"
    permuted = permute_qkv_weight(w, b, heads, head_dim, block_n=block_n, heads_per_tile=hpt)
    assert permuted.weight.shape[0] % block_n == 0
    assert (permuted.weight[order < 0] == 0).all() and (permuted.bias[order < 0] == 0).all()
    w_back, b_back = unpermute_qkv_weight(permuted)
    assert torch.equal(w_back, w) and torch.equal(b_back, b.float())


def test_permuted_tile_holds_pair_members():
    """Row r of a Kimi tile is member r // 64 of pair r % 4 of head (r // 4) % 16."""
    order = qkv_row_order(16, 72, 128, 16)
    assert order.numel() == 3 * 16 * 72  # Kimi's layout needs no padding
    tile = 9 + 2  # head block 1 (heads 16..31: k), pair block 2 (pairs 8..11)
    rows = order[tile * 128:(tile + 1) * 128]
    r = torch.arange(128)
    head = 16 + (r // 4) % 16
    pair = 8 + r % 4
    assert torch.equal(rows, head * 72 + 2 * pair + r // 64)


def test_tile_layout_heuristic():
    assert tile_layout(16, 72) == (128, 16)  # Kimi: 27 tiles of 16 heads x 4 pairs
    assert tile_layout(12, 128) == (128, 4)  # 36 heads: 4 | 36, 16 pairs | 64
    assert tile_layout(16, 72, widths=(256,)) == (256, 16)  # 36 pairs padded to 40
    cuda = torch.device("cuda")
    # NVIDIA, any heads: the measured best at Kimi's TP 1, the flat layout (128
    # consecutive columns a tile) on one warp group, persistent, two programs per SM
    for heads in (16, 2):
        config = qkv_gemm_config(heads, 72, cuda)
        assert config == QKVGemmConfig(block_n=128, heads_per_tile=1, flat_pairs=True,
                                       num_warps=4, group_m=16, programs_per_sm=2)
        assert (config.block_m, config.block_n, config.block_k, config.num_stages) \
            == (128, 128, 64, 3)
        assert config.persistent and config.epilogue_subtile and not config.warp_specialize
        assert config.programs_per_sm == 2 and config.epilogue_parts == 8
    for bad, match in ((dict(programs_per_sm=0), "programs_per_sm"),
                       (dict(programs_per_sm=2, persistent=False), "persistent grid"),
                       (dict(epilogue_parts=3, heads_per_tile=1, flat_pairs=True),
                        "epilogue_parts"),
                       (dict(epilogue_parts=4), "flat layout's subtiled")):
        with pytest.raises(ValueError, match=match):
            QKVGemmConfig(**bad)
        assert config.kernel_name == "_qkv_rope_kernel_persistent"
    # AMD: 128-wide tiles and 2 stages, so the operand buffers fit 64 KB of LDS
    config = qkv_gemm_config(16, 72, cuda, amd=True)
    assert (config.block_n, config.heads_per_tile, config.num_stages) == (128, 16, 2)
    assert not config.persistent  # the persistent grid was measured on an H200 only
    assert 2 * config.num_stages * (config.block_m + config.block_n) * config.block_k <= 64 * 1024


def _update_weights(update, w, b):
    """Change W or b the way a caller might; returns the (w, b) to judge against."""
    if update == "w.data.mul_":
        w.data.mul_(2)  # .data has its own version counter: w._version stays
    elif update == "b.data.add_":
        b.data.add_(5)
    elif update == "w.mul_ in place":
        with torch.no_grad():
            w.mul_(-1)
    elif update == "w.data = new":
        w.data = torch.flip(w.data, [0])  # new memory, same tensor object
    return w, b


WEIGHT_UPDATES = ("w.data.mul_", "b.data.add_", "w.mul_ in place", "w.data = new")


@pytest.mark.parametrize("update", WEIGHT_UPDATES)
def test_no_stale_result_after_a_weight_update(update, device):
    """A call after W or b changed computes with the new values (no stale permuted copy)."""
    x, w, b, freqs_cis = make_problem(device)
    cos, sin = cos_sin_views(freqs_cis)
    qkv_rope_linear(x, w, b, cos, sin)
    w, b = _update_weights(update, w, b)
    err, tol = judge(qkv_rope_linear(x, w, b, cos, sin), x, w, b, freqs_cis)
    assert err <= tol, (update, err, tol)


def _linear_of(w, b, device):
    linear = torch.nn.Linear(w.shape[1], w.shape[0]).to(device=device, dtype=w.dtype)
    with torch.no_grad():
        linear.weight.copy_(w)
        linear.bias.copy_(b)
    return linear


def _same_version_parameter(weight):
    """A new Parameter (other values) whose version counter equals weight's."""
    new = torch.nn.Parameter(torch.empty_like(weight))
    with torch.no_grad():
        new.copy_(weight.flip(0))
        while new._version < weight._version:
            new.mul_(1)
    return new


LINEAR_UPDATES = {
    "new Parameter": lambda lin: setattr(lin, "weight", _same_version_parameter(lin.weight)),
    "weight.data = new": lambda lin: setattr(lin.weight, "data", lin.weight.data.flip(0).clone()),
    "weight.data.mul_": lambda lin: lin.weight.data.mul_(-1),
    "bias.data.add_": lambda lin: lin.bias.data.add_(5),
}


@pytest.mark.parametrize("update", list(LINEAR_UPDATES))
def test_rotating_projection_follows_the_module(update, device):
    """rotating_qkv_projection reads the module's parameters as they are at each call."""
    x, w, b, freqs_cis = make_problem(device)
    cos, sin = cos_sin_views(freqs_cis)
    linear = _linear_of(w, b, device)
    err, tol = judge(rotating_qkv_projection(linear, x, cos, sin, HEADS), x, w, b, freqs_cis)
    assert err <= tol, (err, tol)
    LINEAR_UPDATES[update](linear)
    w2, b2 = linear.weight.detach().clone(), linear.bias.detach().clone()
    err, tol = judge(rotating_qkv_projection(linear, x, cos, sin, HEADS), x, w2, b2, freqs_cis)
    assert err <= tol, (update, err, tol)


def test_rotating_projection_takes_a_permuted_weight(device):
    x, w, b, freqs_cis = make_problem(device)
    cos, sin = cos_sin_views(freqs_cis)
    config = qkv_gemm_config(HEADS, HEAD_DIM, torch.device(device))
    permuted = permute_qkv_weight(w, b, HEADS, HEAD_DIM, block_n=config.block_n,
                                  heads_per_tile=config.heads_per_tile)
    out = rotating_qkv_projection(_linear_of(w, b, device), x, cos, sin, HEADS, permuted=permuted)
    err, tol = judge(out, x, w, b, freqs_cis)
    assert err <= tol, (err, tol)


def _input_inside_out(out, t):
    """t copied into the first bytes of out's memory, as a view of the same shape."""
    inside = out.view(-1).view(torch.uint8)[:t.numel() * t.element_size()].view(t.dtype)
    return inside.view(t.shape).copy_(t)


@pytest.mark.parametrize("what", ["x", "cos", "sin", "coords", "freqs"])
def test_out_overlapping_an_input_is_refused(what, device):
    """out= sharing memory with anything the kernel reads is an error, not garbage."""
    x, w, b, freqs_cis = make_problem(device)
    inputs = dict(zip(("cos", "sin"), cos_sin_views(freqs_cis)), x=x,
                  coords=vision_patch_coords(GRIDS, device=device),
                  freqs=vision_rope_frequencies(HEAD_DIM, device=device))
    out = torch.zeros((TOKENS, 3, HEADS, HEAD_DIM), dtype=x.dtype, device=device)
    inputs[what] = _input_inside_out(out, inputs[what])
    with pytest.raises(ValueError, match=f"out shares memory with {what}"):
        if what in ("coords", "freqs"):
            qkv_rope_linear_angles(inputs["x"], w, b, inputs["coords"], inputs["freqs"], out=out)
        else:
            qkv_rope_linear(inputs["x"], w, b, inputs["cos"], inputs["sin"], out=out)


def test_encoder_gemm_epilogue_matches_fused(device):
    """The encoder with RoPE in the QKV epilogue computes what it computes with the
    standalone fused kernel (up to bf16 rounding of q/k, which the epilogue skips)."""
    from rope_kernels.model.vit import EncoderConfig, MoonViTEncoder, encoder_inputs

    cfg = EncoderConfig.small().with_layers(1)
    model = MoonViTEncoder(cfg, device=device)
    inp = encoder_inputs([(1, 2, 4)], cfg, device=device)
    fused = model(inp.patches, inp.grids, rope="fused").float()
    gemm = model(inp.patches, inp.grids, rope="gemm_epilogue").float()
    none = model(inp.patches, inp.grids, rope="none").float()
    diff = (gemm - fused).norm() / fused.norm()
    assert diff < 2e-2, diff
    assert (none - fused).norm() / fused.norm() > 5 * diff, "RoPE must matter in this check"


def test_rotating_projection_angles_is_the_angles_kernel_and_refuses_a_bad_tuple(device):
    """``rotating_qkv_projection(angles=(coords, freqs))`` (what the encoder's
    gemm_epilogue mode calls) is ``qkv_rope_linear_angles`` on the module's weights,
    bit for bit, and within tolerance of float64; anything but a pair is refused."""
    x, w, b, freqs_cis = make_problem(device)
    linear = _linear_of(w, b, device)
    coords = vision_patch_coords(GRIDS, device=device)
    freqs = vision_rope_frequencies(HEAD_DIM, device=device)
    cos, sin = cos_sin_views(freqs_cis)
    out = rotating_qkv_projection(linear, x, cos, sin, HEADS, angles=(coords, freqs))
    direct = qkv_rope_linear_angles(x, w, b, coords, freqs,
                                    config=qkv_gemm_config(HEADS, HEAD_DIM, x.device))
    assert torch.equal(out, direct)
    err, tol = judge(out, x, w, b, freqs_cis)
    assert err <= tol, (err, tol)
    for bad in ([coords, freqs], (coords,), coords):
        with pytest.raises(TypeError, match="angles must be a"):
            rotating_qkv_projection(linear, x, cos, sin, HEADS, angles=bad)


BAD_INPUTS = {
    "x fp32": (lambda x, w, b, c, s: (x.float(), w, b, c, s), TypeError, "x must be bfloat16"),
    "x 3-D": (lambda x, w, b, c, s: (x[None], w, b, c, s), ValueError, "x must be 2-D"),
    "w dtype": (lambda x, w, b, c, s: (x, w.half(), b, c, s), TypeError, "w_qkv dtype"),
    "w not contiguous": (lambda x, w, b, c, s: (x, w.T.contiguous().T, b, c, s), ValueError,
                         "w_qkv must be contiguous"),
    "w hidden": (lambda x, w, b, c, s: (x[:, :32], w, b, c, s), ValueError, "w_qkv must have shape"),
    "bias shape": (lambda x, w, b, c, s: (x, w, b[:-1], c, s), ValueError, "b_qkv must have shape"),
    "cos fp64": (lambda x, w, b, c, s: (x, w, b, c.double(), s), TypeError, "cos must be float32"),
    "cos tokens": (lambda x, w, b, c, s: (x, w, b, c[:-1], s[:-1]), ValueError, "cos must have shape"),
    "sin shape": (lambda x, w, b, c, s: (x, w, b, c, s[:, :-1]), ValueError, "cos and sin differ"),
    "head_dim": (lambda x, w, b, c, s: (x, w, b, c[:, :-1], s[:, :-1]), ValueError, "head_dim"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs(case):
    x, w, b, freqs_cis = make_problem("cpu", seed=0)
    change, error, message = BAD_INPUTS[case]
    args = change(x, w, b, *cos_sin_views(freqs_cis))
    with pytest.raises(error, match=message):
        qkv_rope_linear(*args)


def test_bad_angles_inputs_and_settings():
    x, w, b, freqs_cis = make_problem("cpu", seed=0)
    coords = vision_patch_coords(GRIDS)
    freqs = vision_rope_frequencies(HEAD_DIM)
    with pytest.raises(TypeError, match="coords must be int32"):
        qkv_rope_linear_angles(x, w, b, coords.long(), freqs)
    with pytest.raises(ValueError, match="coords must be contiguous with shape"):
        qkv_rope_linear_angles(x, w, b, coords[:-1], freqs)
    with pytest.raises(ValueError, match="freqs must be a contiguous float32"):
        qkv_rope_linear_angles(x, w, b, coords, freqs.double())
    with pytest.raises(ValueError, match="head_dim 68"):
        qkv_rope_linear_angles(x, w, b, coords, freqs[:-1])
    with pytest.raises(ValueError, match="multiple of 4"):
        permute_qkv_weight(w[:3 * 2 * 70], None, 2, 70)
    with pytest.raises(ValueError, match="block_n .* heads_per_tile"):
        QKVGemmConfig(block_n=16, heads_per_tile=16)
    with pytest.raises(ValueError, match="power of two"):
        QKVGemmConfig(block_m=96)
    with pytest.raises(TypeError, match="config must be a QKVGemmConfig"):
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config={"block_m": 16})
    permuted = permute_qkv_weight(w, b, HEADS, HEAD_DIM, block_n=32, heads_per_tile=4)
    with pytest.raises(ValueError, match="does not match the config"):
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis),
                        config=QKVGemmConfig(block_n=64, heads_per_tile=8), permuted=permuted)
    with pytest.raises(ValueError, match="disagree on whether there is a bias"):
        qkv_rope_linear(x, w, None, *cos_sin_views(freqs_cis),
                        config=QKVGemmConfig(block_n=32, heads_per_tile=4), permuted=permuted)


def test_warp_specialized_kernel_refuses_what_tma_cannot_load(monkeypatch, device):
    """The warp-specialized kernel loads x and W only through TMA: a misaligned x, or a
    device without TMA, is a one-line ValueError, not a silent switch of kernel."""
    from rope_kernels.kernels import qkv_gemm

    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    x, w, b, freqs_cis = make_problem(device, seed=0)
    cos, sin = cos_sin_views(freqs_cis)
    ws = QKVGemmConfig(**{**qkv_gemm_config(HEADS, HEAD_DIM, torch.device(device)).__dict__,
                          "num_warps": 4, "persistent": True, "warp_specialize": True})
    wide = torch.zeros(TOKENS, HIDDEN + 8, dtype=x.dtype, device=device)
    wide[:, 1:HIDDEN + 1] = x
    misaligned = wide[:, 1:HIDDEN + 1]  # 2 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match="warp_specialize needs TMA loads"):
        qkv_rope_linear(misaligned, w, b, cos, sin, config=ws)
    if device != "cuda":  # never launched on a GPU: it hung on an H200
        out = qkv_rope_linear(misaligned.contiguous(), w, b, cos, sin, config=ws)
        err, tol = judge(out, x, w, b, freqs_cis)
        assert err <= tol, (err, tol)
    monkeypatch.setattr(qkv_gemm, "tma_supported", lambda device: False)
    with pytest.raises(ValueError, match="warp_specialize needs TMA loads"):
        qkv_rope_linear(x, w, b, cos, sin, config=ws)


def test_qkv_bench_rows_sweep_correctness_and_roofline():
    """The benchmark's two tables on a tiny CPU problem (wall clock): every variant
    a row (QuACK absent with its reason), swept variants at their best config,
    every timed row checked against float64; and its roofline table."""
    from rope_kernels.bench.qkv_bench import (COLUMNS, QKV_VARIANTS, image_grids, roofline,
                                              run_qkv_bench)

    assert sum(t * h * w for t, h, w in image_grids(87616)) == 87616
    # any count within the 512-patch table (2048 once made a (1, 1, 2048) grid the table refused)
    from rope_kernels.kernels.freqs import grid_tokens
    for tokens in (37, 2048, 5476 + 75, 87616 + 5475):
        assert grid_tokens(image_grids(tokens)) == tokens
    variants = [v for v in QKV_VARIANTS if v != "compile_max_autotune"]
    bench = run_qkv_bench((37,), device="cpu", hidden=32, heads=2, head_dim=8, mode="eager",
                          samples=1, variants=variants, progress=False)
    df, sweep = bench.rows, bench.sweep
    assert list(df.variant) == variants
    assert list(df.columns[:len(COLUMNS)]) == list(COLUMNS)
    timed = df.dropna(subset=["median_us"])
    assert set(timed.variant) == {"cublas_linear", "cublas_linear+fused_rope", "qkv_rope_linear",
                                  "qkv_rope_linear_angles", "qkv_gemm_rotation_compiled_out"}
    assert (timed.median_us > 0).all() and (timed.p20_us <= timed.p80_us).all()
    assert (timed.matches_float64 == "True").all(), timed[["variant", "max_abs_err",
                                                          "error_tolerance"]]
    assert (timed.max_abs_err <= timed.error_tolerance).all()
    assert df.ratio_to_cublas.iloc[0] == 1.0 and df.ratio_to_cublas_fused_rope.iloc[1] == 1.0
    # each row's time over cuBLAS's at the same token count (not x/x: the other rows too)
    base = df.median_us.iloc[0]
    assert timed.ratio_to_cublas.tolist() == pytest.approx((timed.median_us / base).tolist(),
                                                           rel=1e-12)
    assert {"device_name", "git_commit", "torch_version", "tflops", "note"} <= set(df.columns)
    quack_rows = df[df.variant.str.startswith("quack")]
    assert quack_rows.median_us.isna().all() and quack_rows.note.str.startswith("absent").all()
    # the sweep: our two CPU configs; the main row is the faster, and the variants
    # at our best config carry its label
    ours = sweep[sweep.variant == "qkv_rope_linear"]
    assert len(ours) == 2 and ours.config.str.contains("persistent").sum() == 1
    best = ours.loc[ours.median_us.idxmin()]
    main = df.set_index("variant")
    assert main.loc["qkv_rope_linear", "config"] == best.config
    assert main.loc["qkv_rope_linear", "median_us"] == best.median_us
    # the angles kernel at its own fastest; the compiled-out kernel at the faster one's
    angles = sweep[sweep.variant == "qkv_rope_linear_angles"]
    assert len(angles) == 2
    best_angles = angles.loc[angles.median_us.idxmin()]
    assert main.loc["qkv_rope_linear_angles", "config"] == best_angles.config
    assert main.loc["qkv_rope_linear_angles", "median_us"] == best_angles.median_us
    faster = min((best, best_angles), key=lambda r: r.median_us)
    assert main.loc["qkv_gemm_rotation_compiled_out", "config"] == faster.config
    assert main.loc["qkv_gemm_rotation_compiled_out", "reference"] == "x W^T + b"
    roof = roofline(df, peak_tflops=100.0, hbm_gbps=1000.0)
    assert (roof.ceiling_tflops <= 100.0).all() and (roof.fraction_of_ceiling > 0).all()
    with pytest.raises(ValueError, match="unknown variants"):
        run_qkv_bench((37,), device="cpu", variants=("cublas",))
    with pytest.raises(ValueError, match="include one of"):
        run_qkv_bench((37,), device="cpu", variants=("qkv_gemm_rotation_compiled_out",))
    with pytest.raises(ValueError, match="unknown QuACK configs"):
        run_qkv_bench((37,), device="cpu", quack_configs=("fast",))


def test_qkv_bench_catches_a_wrong_variant(monkeypatch):
    """A variant computing the wrong thing gets matches_float64 False, not a pass."""
    from rope_kernels.bench import qkv_bench

    monkeypatch.setattr(qkv_bench, "linear_then_fused_rope",
                        lambda x, w, b, cos, sin, h, d: qkv_bench.F.linear(x, w, b).view(
                            x.shape[0], 3, h, d))  # forgets the rotation
    df = qkv_bench.run_qkv_bench((37,), device="cpu", hidden=32, heads=2, head_dim=8,
                                 mode="eager", samples=1, progress=False,
                                 variants=("cublas_linear", "cublas_linear+fused_rope")).rows
    assert list(df.matches_float64) == ["True", "False"]


def _tool(name: str):
    """tools/<name>.py as a module (the tools are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_qkv_power_tool_parses_samples_and_keeps_each_to_its_window():
    """tools/qkv_power.py: nvidia-smi lines that are not three numbers are dropped; a
    sample counts for the loop it arrived in, after the ramp, and for no other."""
    tool = _tool("qkv_power")
    assert tool.parse_sample("1980, 650.25, 61") == (1980.0, 650.25, 61.0)
    for bad in ("clocks.sm [MHz], power.draw [W], temperature.gpu", "1980, [N/A], 61", "1, 2"):
        assert tool.parse_sample(bad) is None
    samples = [(0.1, (1980.0, 300.0, 50.0)),  # in a's ramp
               (0.5, (1900.0, 600.0, 60.0)), (0.6, (1700.0, 700.0, 62.0)),
               (1.5, (1500.0, 690.0, 70.0))]  # between windows
    rows = tool.summarize(samples, [("a", 0.0, 1.0, 950.0), ("b", 2.0, 3.0, 1000.0)])
    assert rows[0]["samples"] == 2 and rows[0]["sm_mhz"] == 1800.0 and rows[0]["watts"] == 650.0
    assert rows[1] == {"variant": "b", "us_per_call": 1000.0, "samples": 0}
    with pytest.raises(SystemExit):
        tool.parse_args(["--seconds", "0.2"])


@pytest.mark.parametrize("spec", ["999", "1,x"])
def test_qkv_power_tool_refuses_bad_configs_before_any_gpu_work(spec, capsys):
    """--configs means what tools/qkv_sweep.py's does (indices into QKV_SWEEP_CONFIGS);
    a bad one is a one-line error and exit status 2, on a machine with or without a GPU."""
    assert _tool("qkv_power").main(["--configs", spec]) == 2
    assert "--configs" in capsys.readouterr().err


def test_qkv_sweep_tool_checks_times_and_survives_a_failing_config(monkeypatch):
    """tools/qkv_sweep.py's loop on the CPU (tiny shape, eager): baselines, then each
    config rotated (table and angles) and with the rotation compiled out, all checked
    against float64; a
    config that raises and one that computes the wrong thing are one line each, kept
    as rows, and the sweep goes on to the next config."""
    from rope_kernels.bench import qkv_bench

    tool = _tool("qkv_sweep")
    small = qkv_gemm_config(2, 8, torch.device("cpu"))
    raising = QKVGemmConfig(**{**small.__dict__, "group_m": 2})
    wrong = QKVGemmConfig(**{**small.__dict__, "group_m": 4})
    real_ours = qkv_bench.ours

    def ours(name, config, heads, head_dim):
        fn = real_ours(name, config, heads, head_dim)
        if config == raising:
            def fail(a):
                raise RuntimeError("out of resources")
            return fail
        if config == wrong:
            return lambda a: fn(a) * 2
        return fn

    monkeypatch.setattr(qkv_bench, "ours", ours)
    lines = []
    df = tool.run_sweep((37,), [raising, wrong, small], device=torch.device("cpu"), hidden=32,
                        heads=2, head_dim=8, samples=1, mode="eager", log=lines.append)
    assert list(df.variant) == ["cublas_linear", "cublas_linear+fused_rope"] + [
        "qkv_rope_linear", "qkv_rope_linear_angles", "qkv_gemm_rotation_compiled_out"] * 3
    assert list(df.config[2:]) == [c.label for c in (raising, wrong, small) for _ in range(3)]
    assert len(lines) == 6 and all("\n" not in line for line in lines)
    assert sum("RuntimeError: out of resources" in line for line in lines) == 3
    assert sum("WRONG against float64" in line for line in lines) == 3
    good = df[df.config == small.label]
    assert (good.matches_float64 == True).all() and (good.median_us > 0).all()  # noqa: E712
    assert df[df.config == raising.label].median_us.isna().all()
    assert (df[df.config == wrong.label].matches_float64 == False).all()  # noqa: E712
    assert df.ratio_to_cublas.iloc[0] == 1.0 and df.ratio_to_cublas_fused_rope.iloc[1] == 1.0
    table = tool.format_tables(df)
    best = table.split("best qkv_rope_linear")[1]
    assert small.label in best and wrong.label not in best and raising.label not in best


def test_qkv_sweep_tool_arguments():
    tool = _tool("qkv_sweep")
    from rope_kernels.kernels.qkv_gemm import QKV_SWEEP_CONFIGS

    assert tool.pick_configs(None, QKV_SWEEP_CONFIGS) == list(QKV_SWEEP_CONFIGS)
    assert tool.pick_configs("2,0", QKV_SWEEP_CONFIGS) == [QKV_SWEEP_CONFIGS[2],
                                                           QKV_SWEEP_CONFIGS[0]]
    with pytest.raises(ValueError, match="out of range"):
        tool.pick_configs(str(len(QKV_SWEEP_CONFIGS)), QKV_SWEEP_CONFIGS)
    with pytest.raises(ValueError, match="comma-separated ints"):
        tool.pick_configs("a,b", QKV_SWEEP_CONFIGS)
    assert tool.parse_args(["--quick"]).quick
    with pytest.raises(SystemExit):
        tool.parse_args(["--samples", "0"])


@pytest.mark.gpu
@pytest.mark.parametrize("angles", [False, True], ids=["table", "angles"])
def test_candidate_configs_match_float64_at_kimi_size(angles):
    """Every config notebook 05_qkv_gemm and tools/qkv_sweep.py time, compiled, at Kimi's
    projection (1152 -> 3 x 16 x 72) and a token count no tile divides: the GPU paths
    (TMA, persistent, subtiled, padded pairs) against float64 (GPU only)."""
    from rope_kernels.kernels.qkv_gemm import QKV_SWEEP_CONFIGS, with_layout

    grids = [(1, 74, 74), (1, 1, 77)]
    x, w, b, freqs_cis = make_problem("cuda", heads=16, head_dim=72, hidden=1152, grids=grids,
                                      seed=0)
    tokens = x.shape[0]
    for config in QKV_SWEEP_CONFIGS:
        assert not config.warp_specialize, (config.label, "hung on an H200: never launched")
        config = with_layout(config, 16, 72)
        out = torch.full((tokens, 3, 16, 72), float("nan"), dtype=x.dtype, device="cuda")
        if angles:
            qkv_rope_linear_angles(x, w, b, vision_patch_coords(grids, device="cuda"),
                                   vision_rope_frequencies(72, device="cuda"), config=config,
                                   out=out)
        else:
            qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config, out=out)
        assert torch.isfinite(out).all(), (config.label, "an output element was never written")
        err, tol = judge(out, x, w, b, freqs_cis)
        assert err <= tol, (config.label, err, tol)


# sm_90's largest shared memory per block (227 KB): a config above it compiles, but
# its launch fails on an H100/H200 (out of resources).
SM90_MAX_SHARED_BYTES = 227 * 1024


def _ptxas_available() -> bool:
    try:
        from triton import knobs

        return bool(knobs.nvidia.ptxas.path)
    except Exception:  # no NVIDIA backend or no ptxas in this Triton
        return False


@pytest.mark.compile_matrix
def test_sweep_configs_compile_for_sm90(tmp_path):
    """Every config tools/qkv_sweep.py times (QKV_CANDIDATE_CONFIGS among them) compiles
    for sm_90 through TMA as qkv_rope_linear launches it, without spills and within an
    H200's shared memory: the GPU exploration spends no time on a config that cannot run.
    The warp-specialized configs too (compiled only, never launched on a GPU)."""
    if not _ptxas_available():
        pytest.skip("Triton's ptxas is not available")
    from rope_kernels.bench.compile_matrix import write_compile_matrix
    from rope_kernels.kernels.interpreter import (qkv_sm90_spilling_configs,
                                                  warp_specialized_qkv_compiles)
    from rope_kernels.kernels.qkv_gemm import (QKV_CANDIDATE_CONFIGS, QKV_SWEEP_CONFIGS,
                                               QKV_WARP_SPECIALIZED_CONFIGS)

    assert set(QKV_CANDIDATE_CONFIGS) <= set(QKV_SWEEP_CONFIGS)
    # the latter compiled only, and only by Triton 3.6 (kernels/interpreter.py says why)
    ws = QKV_WARP_SPECIALIZED_CONFIGS if warp_specialized_qkv_compiles() else ()
    compiled = QKV_SWEEP_CONFIGS + ws
    table = write_compile_matrix(
        tmp_path / "qkv_sweep_sm90.csv", targets=["sm_90"], timeout_s=600,
        entries="rope_kernels.bench.compile_matrix:qkv_sweep_and_warp_specialized_entries")
    assert sorted(table["kernel"]) == sorted(f"qkv_gemm {c.label}" for c in compiled)
    assert (table["target"] == "sm_90").all() and table["compiled"].all()
    # spills: none under the H200's Triton; later ones spill in a known config or two
    assert qkv_sm90_spilling_configs() <= {c.label for c in QKV_SWEEP_CONFIGS}
    known = table["kernel"].isin([f"qkv_gemm {label}" for label in qkv_sm90_spilling_configs()])
    too_big = table[(table["shared_bytes"] > SM90_MAX_SHARED_BYTES) | (table["spills"] & ~known)]
    assert too_big.empty, too_big[["kernel", "registers", "spill_bytes", "shared_bytes"]]
    # warp specialization really happened (Triton drops it silently where it cannot):
    # a producer warp group beside the two consumer groups of the config's 4 warps
    warps = dict(zip(table["kernel"], table["num_warps"]))
    for c in compiled:
        assert warps[f"qkv_gemm {c.label}"] == c.num_warps * (3 if c.warp_specialize else 1), c


# -- the flat-pairs layout ------------------------------------------------------------


def test_flat_row_order_is_w_in_its_own_order_padded_to_whole_tiles():
    """The flat layout keeps W's rows in order (a pair is two adjacent columns) and
    pads the last tile only (2 heads x 72: 432 rows in 14 tiles of 32, 16 pad rows)."""
    order = qkv_row_order(HEADS, HEAD_DIM, 32, 1, flat=True)
    total = 3 * HEADS * HEAD_DIM
    assert order.numel() == 32 * -(-total // 32)
    assert order[:total].tolist() == list(range(total))
    assert (order[total:] == -1).all()
    x, w, b, _ = make_problem("cpu")
    p = permute_qkv_weight(w, b, HEADS, HEAD_DIM, block_n=32, heads_per_tile=1, flat=True)
    w2, b2 = unpermute_qkv_weight(p)
    assert torch.equal(w2, w) and torch.equal(b2, b.float())
    with pytest.raises(ValueError, match="heads_per_tile=1"):
        permute_qkv_weight(w, b, HEADS, HEAD_DIM, block_n=32, heads_per_tile=2, flat=True)
    with pytest.raises(ValueError, match="flat_pairs takes heads_per_tile=1"):
        QKVGemmConfig(block_n=32, heads_per_tile=2, flat_pairs=True)
    with pytest.raises(TypeError, match="flat_pairs must be a bool"):
        QKVGemmConfig(block_n=32, heads_per_tile=1, flat_pairs=1)


FLAT_CASES = [(tma, sub, persistent) for tma in (False, True) for sub in (False, True)
              for persistent in (False, True)]


@pytest.mark.parametrize("use_tma,subtile,persistent", FLAT_CASES,
                         ids=[f"{'tma' if t else 'pointers'}-{'subtile' if s else 'whole'}-"
                              f"{'persistent' if p else 'tiles'}" for t, s, p in FLAT_CASES])
def test_flat_pairs_match_float64_table_and_angles(use_tma, subtile, persistent, device):
    """The flat layout through TMA and pointers, whole and subtiled epilogue, one
    program per tile and persistent, cos/sin as freqs_cis's interleaved views and as
    separate tensors: a tile's 32 columns cross head boundaries (72 a head) and q/k/v
    boundaries; the last tile is half padding."""
    if use_tma and device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    # subtiled: eighths of the tile, at least 16 bytes (a TMA box) each
    config = QKVGemmConfig(block_m=16, block_n=64 if subtile else 32, block_k=16,
                           heads_per_tile=1, group_m=2, num_stages=1, num_warps=4,
                           persistent=persistent,
                           epilogue_subtile=subtile, use_tma=use_tma, flat_pairs=True)
    assert "/flat" in config.label
    _check_flat(config, device)


@pytest.mark.parametrize("parts,programs_per_sm", [(4, 1), (2, 2), (8, 2)])
def test_flat_epilogue_parts_and_programs_per_sm(parts, programs_per_sm, device):
    """The subtiled flat epilogue in quarters and halves, and the persistent grid with
    two programs per SM (the NVIDIA default's): every column written and rotated."""
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    config = QKVGemmConfig(block_m=16, block_n=64, block_k=16, heads_per_tile=1, group_m=2,
                           num_stages=1, num_warps=4, persistent=True, epilogue_subtile=True,
                           use_tma=True, flat_pairs=True, epilogue_parts=parts,
                           programs_per_sm=programs_per_sm)
    assert config.store_columns == 64 // parts
    assert ("/x2/" in config.label) == (programs_per_sm == 2)
    assert ("subtile/" in config.label) == (parts == 8)
    _check_flat(config, device)


def test_flat_whole_tiles_use_w_itself(device):
    """The flat layout whose tiles need no zero rows (432 rows = 27 tiles of 16, as
    Kimi's 3456 = 27 x 128) is W's own order: the permuted weight is W (no copy),
    padded tiles get a copy, and the kernel's output matches float64 either way."""
    x, w, b, _ = make_problem(device)
    whole = permute_qkv_weight(w, b, HEADS, HEAD_DIM, block_n=16, heads_per_tile=1, flat=True)
    assert whole.weight.data_ptr() == w.data_ptr() and whole.weight.shape == w.shape
    padded = permute_qkv_weight(w, b, HEADS, HEAD_DIM, block_n=32, heads_per_tile=1, flat=True)
    assert padded.weight.data_ptr() != w.data_ptr() and padded.weight.shape[0] == 448
    for b_n in (16, 32):
        _check_flat(QKVGemmConfig(block_m=16, block_n=b_n, block_k=16, heads_per_tile=1,
                                  group_m=2, num_stages=1, num_warps=4, persistent=False,
                                  epilogue_subtile=False, flat_pairs=True), device)


def _check_flat(config, device):
    x, w, b, freqs_cis = make_problem(device)
    for call in ("table", "separate", "angles"):
        out = torch.full((TOKENS, 3, HEADS, HEAD_DIM), float("nan"), dtype=x.dtype, device=device)
        if call == "table":
            qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config, out=out)
        elif call == "separate":
            cos, sin = (t.contiguous() for t in cos_sin_views(freqs_cis))
            qkv_rope_linear(x, w, b, cos, sin, config=config, out=out)
        else:
            qkv_rope_linear_angles(x, w, b, vision_patch_coords(GRIDS, device=device),
                                   vision_rope_frequencies(HEAD_DIM, device=device),
                                   config=config, out=out)
        assert torch.isfinite(out).all(), (call, "an output element was never written")
        err, tol = judge(out, x, w, b, freqs_cis)
        assert err <= tol, (call, err, tol)
    # the rotation compiled out: exactly the linear layer (v, q and k unrotated)
    out = qkv_linear_rotation_compiled_out(x, w, b, *cos_sin_views(freqs_cis), config=config)
    ref = (x.double() @ w.double().T + b.double()).view(TOKENS, 3, HEADS, HEAD_DIM)
    assert (out.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()


def test_cos_sin_vector_divides_strides_base_and_counts():
    """The cos/sin load width both launchers use (fused rows, the flat epilogue): 4
    floats for Kimi's freqs_cis views, narrower when a stride, the base address or a
    count the offsets step by is not a multiple."""
    from rope_kernels.kernels.fused import cos_sin_vector

    freqs_cis = vision_freqs_cis(GRIDS, HEAD_DIM)
    cos, sin = cos_sin_views(freqs_cis)  # token stride 72 floats, 16-byte aligned
    assert cos_sin_vector(cos, sin) == 4
    assert cos_sin_vector(cos, sin, HEAD_DIM, 32) == 4
    assert cos_sin_vector(cos, sin, 70) == 2 and cos_sin_vector(cos, sin, 8, 3) == 1
    shifted = torch.empty(2 + TOKENS * HEAD_DIM)[2:].view(TOKENS, HEAD_DIM)
    assert cos_sin_vector(shifted[:, 0::2], shifted[:, 1::2]) == 2  # base 8 bytes past 16
