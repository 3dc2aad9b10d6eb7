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
from rope_kernels.kernels.qkv_gemm import (NVIDIA_ANGLES_CONFIG, NVIDIA_TABLE_CONFIG,
                                           QKVGemmConfig, qkv_gemm_config, qkv_linear_unrotated,
                                           qkv_rope_linear, qkv_rope_linear_angles)
from rope_kernels.qkv import qkv_rope
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


# Both kernels (one program per tile, persistent with one or two programs per SM), the
# epilogue whole and in 2/4/8 parts, through TMA descriptors and pointers, with the table
# (as freqs_cis's interleaved views and as separate tensors) and in-kernel angles: every
# path the GPU can take runs here too. 3 x 2 x 72 = 432 columns: tiles of 64 cross head
# and q/k/v boundaries, and the last tile is three quarters padding.
KERNEL_PATHS = {
    "per_tile": dict(persistent=False),
    "per_tile+pointers": dict(persistent=False, use_tma=False),
    "per_tile+parts2+tma": dict(persistent=False, epilogue_parts=2, use_tma=True),
    "persistent+parts8+pointers": dict(persistent=True, epilogue_parts=8, use_tma=False),
    "persistent+x2+parts4+tma": dict(persistent=True, programs_per_sm=2, epilogue_parts=4,
                                     use_tma=True),
}


def _config(device, **changes):
    base = qkv_gemm_config(HEADS, HEAD_DIM, torch.device(device))
    return QKVGemmConfig(**{**base.__dict__, "group_m": 2, **changes})


def _run(call, config, x, w, b, freqs_cis, device):
    out = torch.full((x.shape[0], 3, HEADS, HEAD_DIM), float("nan"), dtype=x.dtype, device=device)
    if call == "angles":
        qkv_rope_linear_angles(x, w, b, vision_patch_coords(GRIDS, device=device),
                               vision_rope_frequencies(HEAD_DIM, device=device),
                               config=config, out=out)
    elif call == "separate":
        cos, sin = (t.contiguous() for t in cos_sin_views(freqs_cis))
        qkv_rope_linear(x, w, b, cos, sin, config=config, out=out)
    else:
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config, out=out)
    assert torch.isfinite(out).all(), "an output element was never written"
    return out


@pytest.mark.parametrize("path", list(KERNEL_PATHS))
@pytest.mark.parametrize("call", ["table", "separate", "angles"])
def test_every_kernel_path_matches_float64(path, call, device):
    config = _config(device, **KERNEL_PATHS[path])
    if config.use_tma and device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    x, w, b, freqs_cis = make_problem(device)
    err, tol = judge(_run(call, config, x, w, b, freqs_cis, device), x, w, b, freqs_cis)
    assert err <= tol, (path, call, err, tol)


def test_no_bias_fp16_and_whole_tiles(device):
    """fp16 without bias, and a tile width that divides the row (432 = 27 x 16)."""
    x, w, _, freqs_cis = make_problem(device, bias=False, dtype=torch.float16)
    for block_n in (16, 64):
        config = QKVGemmConfig(block_m=16, block_n=block_n, block_k=16, group_m=2, num_stages=1)
        out = qkv_rope_linear(x, w, None, *cos_sin_views(freqs_cis), config=config)
        err, tol = judge(out, x, w, None, freqs_cis)
        assert err <= tol, (block_n, err, tol)


@pytest.mark.parametrize("persistent", [False, True], ids=["per_tile", "persistent"])
def test_unrotated_epilogue_is_the_plain_projection(persistent, device):
    """The ``_no_rotation`` epilogue (benchmarks): the same kernel = x @ W^T + b."""
    x, w, b, freqs_cis = make_problem(device)
    config = _config(device, persistent=persistent)
    out = qkv_linear_unrotated(x, w, b, heads=HEADS, head_dim=HEAD_DIM, config=config)
    ref = (x.double() @ w.double().T + b.double()).view(TOKENS, 3, HEADS, HEAD_DIM)
    lin_err = (F.linear(x, w, b).double().view_as(ref) - ref).abs().max().item()
    assert (out.double() - ref).abs().max().item() <= 2 * lin_err + FLOOR * ref.abs().max().item()
    rotated = qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config=config)
    assert torch.equal(rotated[:, 2], out[:, 2]), "v is never rotated"
    assert not torch.equal(rotated[:, :2], out[:, :2])


def test_config_labels_defaults_and_checks():
    # the labels of the committed rows (data/exploration/nvidia-h200/qkv_gemm_sweep.csv)
    assert NVIDIA_TABLE_CONFIG.label == "128x128x64x1/3/4/8/flat"
    assert NVIDIA_ANGLES_CONFIG.label == "128x128x64x1/3/4/16/persistent/x2/subtile/flat"
    assert QKVGemmConfig(persistent=True, programs_per_sm=2, epilogue_parts=4).label == \
        "128x128x64x1/3/4/8/persistent/x2/subtile4/flat"
    assert QKVGemmConfig(use_tma=False).label.endswith("/flat/pointers")
    assert NVIDIA_TABLE_CONFIG.kernel_name == "_qkv_rope_kernel"
    assert NVIDIA_ANGLES_CONFIG.kernel_name == "_qkv_rope_kernel_persistent"
    cuda = torch.device("cuda")
    for heads in (16, 2):  # one default per path, whatever the heads
        assert qkv_gemm_config(heads, 72, cuda) == NVIDIA_TABLE_CONFIG
        assert qkv_gemm_config(heads, 72, cuda, angles=True) == NVIDIA_ANGLES_CONFIG
    # AMD: 2 stages, so the operand buffers fit 64 KB of LDS; one program per tile
    amd = qkv_gemm_config(16, 72, cuda, amd=True)
    assert amd.num_stages == 2 and not amd.persistent
    assert 2 * amd.num_stages * (amd.block_m + amd.block_n) * amd.block_k <= 64 * 1024
    for bad, error, match in ((dict(programs_per_sm=0), ValueError, "programs_per_sm"),
                              (dict(programs_per_sm=2), ValueError, "persistent grid"),
                              (dict(epilogue_parts=3), ValueError, "power of two"),
                              (dict(epilogue_parts=16), ValueError, "epilogue_parts"),
                              (dict(block_m=96), ValueError, "power of two"),
                              (dict(block_k=8), ValueError, "at least 16"),
                              (dict(persistent=1), TypeError, "persistent must be a bool"),
                              (dict(use_tma=1), TypeError, "use_tma")):
        with pytest.raises(error, match=match):
            QKVGemmConfig(**bad)
    with pytest.raises(TypeError, match="heads must be an int"):
        qkv_gemm_config(2.0, 72, cuda)


def test_wrong_rotation_is_caught(device):
    """A deliberately wrong epilogue (sin's sign flipped) must fail the check."""
    x, w, b, freqs_cis = make_problem(device)
    cos, sin = cos_sin_views(freqs_cis)
    out = qkv_rope_linear(x, w, b, cos, -sin)
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
    assert (same_up_to_cos_sin_ulps(angles, table, x, w, b)).all()
    assert (angles == table).float().mean() > 0.99


def same_up_to_cos_sin_ulps(a, t, x, w, b):
    """Where a and t agree as two roundings of one rotation whose cos/sin differ by a few fp32 ulps.

    cos/sin of the same fp32 angle may differ by an ulp or two between libraries. Before the
    bf16 rounding that moves x1*cos - x2*sin by a few 2^-24 of |x1| + |x2| (the pair's size,
    not the result's: in a cancelling pair the result is far smaller), and the rounding adds
    at most one bf16 step (2^-7 of the larger value). A wrong angle moves it by ~|x1| + |x2|.
    """
    lin = x.double() @ w.double().T + (0 if b is None else b.double())
    pairs = lin.view(a.shape[0], 3, a.shape[2], -1, 2).abs().sum(-1, keepdim=True)
    size = pairs.expand(*pairs.shape[:-1], 2).reshape(a.shape)
    diff = (a.double() - t.double()).abs()
    return diff <= 2.0**-7 * torch.maximum(a.double().abs(), t.double().abs()) + 2.0**-20 * size


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
    """An inference model's Linear (parameters that do not require grad) holding w, b."""
    linear = torch.nn.Linear(w.shape[1], w.shape[0]).to(device=device, dtype=w.dtype)
    with torch.no_grad():
        linear.weight.copy_(w)
        linear.bias.copy_(b)
    return linear.requires_grad_(w.requires_grad)


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


def _encoder_call(linear, x, heads=HEADS):
    """What the encoder's gemm_epilogue mode calls (model/vit.py): ``qkv_rope`` on the
    layer's ``weight`` / ``bias`` with the tokens' patch coordinates, CPU: Triton backend."""
    return qkv_rope(x, linear.weight, linear.bias, vision_patch_coords(GRIDS, device=x.device),
                    heads=heads, head_dim=HEAD_DIM, backend="triton")


@pytest.mark.parametrize("update", list(LINEAR_UPDATES))
def test_encoder_call_follows_the_module(update, device):
    """``qkv_rope`` on a Linear's parameters (the encoder's call) reads them as they are at
    each call, and is ``qkv_rope_linear_angles`` on them bit for bit."""
    x, w, b, freqs_cis = make_problem(device)
    linear = _linear_of(w, b, device)
    err, tol = judge(_encoder_call(linear, x), x, w, b, freqs_cis)
    assert err <= tol, (err, tol)
    LINEAR_UPDATES[update](linear)
    w2, b2 = linear.weight.detach().clone(), linear.bias.detach().clone()
    with torch.no_grad():  # a new Parameter requires grad
        out = _encoder_call(linear, x)
    err, tol = judge(out, x, w2, b2, freqs_cis)
    assert err <= tol, (update, err, tol)
    direct = qkv_rope_linear_angles(x, w2, b2, vision_patch_coords(GRIDS, device=device),
                                    vision_rope_frequencies(HEAD_DIM, device=device),
                                    config=qkv_gemm_config(HEADS, HEAD_DIM, x.device, angles=True))
    assert torch.equal(out, direct)


def test_heads_the_weight_does_not_have_are_refused(device):
    """heads=7 on a 2-head weight was computed as 2 heads and returned (issue 36): refused,
    naming heads, by both launchers and by the encoder's call; a non-int heads is a
    TypeError."""
    x, w, b, freqs_cis = make_problem(device, seed=0)
    cos, sin = cos_sin_views(freqs_cis)
    linear = _linear_of(w, b, device)
    with pytest.raises(ValueError, match="heads=7 does not match the weight"):
        qkv_rope_linear(x, w, b, cos, sin, heads=7)
    with pytest.raises(ValueError, match="heads=7 does not match the weight"):
        qkv_rope_linear_angles(x, w, b, vision_patch_coords(GRIDS, device=device),
                               vision_rope_frequencies(HEAD_DIM, device=device), heads=7)
    with pytest.raises(ValueError, match="heads=7 does not match the weight"):
        _encoder_call(linear, x, heads=7)
    with pytest.raises(ValueError, match="heads=1 does not match"):
        qkv_rope_linear(x, w, b, cos, sin, heads=1)
    for bad in (2.0, "2", True):
        with pytest.raises(TypeError, match="heads must be an int"):
            _encoder_call(linear, x, heads=bad)


AUTOGRAD_CALLS = {
    "qkv_rope_linear": lambda x, w, b, c, s, co, f: qkv_rope_linear(x, w, b, c, s),
    "qkv_rope_linear_angles": lambda x, w, b, c, s, co, f: qkv_rope_linear_angles(x, w, b, co, f),
    "qkv_rope on a Linear": lambda x, w, b, c, s, co, f: _encoder_call(
        _linear_of(w, b, x.device), x),
}


@pytest.mark.parametrize("call", list(AUTOGRAD_CALLS))
@pytest.mark.parametrize("needs_grad", ["x", "w"])
def test_inputs_that_require_grad_are_refused(call, needs_grad):
    """The kernels record no autograd graph: an input that requires grad gave an output
    without grad_fn, silently (issue 36). Refused while grad mode is on, naming it; under
    torch.no_grad() the same call runs."""
    x, w, b, freqs_cis = make_problem("cpu", seed=0)
    if needs_grad == "x":
        x = x.clone().requires_grad_()
    cos, sin = cos_sin_views(freqs_cis)
    coords, freqs = vision_patch_coords(GRIDS), vision_rope_frequencies(HEAD_DIM)
    if needs_grad == "w":  # qkv_rope on a Linear: parameters that require grad
        w = w.clone().requires_grad_()
    with pytest.raises(ValueError, match="does not support autograd.*require"):
        AUTOGRAD_CALLS[call](x, w, b, cos, sin, coords, freqs)
    with torch.no_grad():
        out = AUTOGRAD_CALLS[call](x, w, b, cos, sin, coords, freqs)
    err, tol = judge(out, x.detach(), w.detach(), b, freqs_cis)
    assert err <= tol


BAD_OUTS = {
    "not a tensor": (lambda o: o.tolist()[:1], TypeError, "out must be a torch.Tensor"),
    "shape": (lambda o: o[:, :, :, :-4], ValueError, r"out must have shape \(37, 3, 2, 72\)"),
    "dtype": (lambda o: o.half(), TypeError, "out must have x's dtype"),
    "strides": (lambda o: o.transpose(2, 3).contiguous().transpose(2, 3), ValueError,
                "out must be contiguous"),
}


@pytest.mark.parametrize("case", list(BAD_OUTS))
def test_a_bad_out_is_named_with_what_is_wrong(case):
    """A bad out= is reported as out (not x or a table) with what is wrong with it."""
    x, w, b, freqs_cis = make_problem("cpu", seed=0)
    change, error, match = BAD_OUTS[case]
    out = change(torch.empty(TOKENS, 3, HEADS, HEAD_DIM, dtype=x.dtype))
    with pytest.raises(error, match=match):
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), out=out)
    with pytest.raises(error, match=match):
        qkv_linear_unrotated(x, w, b, heads=HEADS, head_dim=HEAD_DIM, out=out)


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
    "sin shape": (lambda x, w, b, c, s: (x, w, b, c, s[:, :-1]), ValueError, "sin must have shape"),
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
    with pytest.raises(TypeError, match="config must be a QKVGemmConfig"):
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis), config={"block_m": 16})
    with pytest.raises(ValueError, match="TMA store box"):
        qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis),
                        config=QKVGemmConfig(block_n=16, epilogue_parts=8, use_tma=True))


def test_qkv_bench_rows_rounds_correctness_and_roofline():
    """The benchmark's table on a tiny CPU problem (wall clock): every variant a row
    (CuTe and QuACK absent with the reason), each at its backend's default config, timed in
    shuffled rounds over input sets, every timed row checked against float64; and its
    roofline table."""
    from rope_kernels.bench.qkv_bench import (COLUMNS, QKV_VARIANTS, image_grids, roofline,
                                              run_qkv_bench)

    assert sum(t * h * w for t, h, w in image_grids(87616)) == 87616
    # any count within the 512-patch table (2048 once made a (1, 1, 2048) grid the table refused)
    from rope_kernels.kernels.freqs import grid_tokens
    for tokens in (37, 2048, 5476 + 75, 87616 + 5475):
        assert grid_tokens(image_grids(tokens)) == tokens
    variants = [v for v in QKV_VARIANTS if v != "compile_max_autotune"]
    df = run_qkv_bench((37,), device="cpu", hidden=32, heads=2, head_dim=8, mode="eager",
                       samples=5, rounds=5, variants=variants, progress=False).rows
    assert list(df.variant) == variants
    assert list(df.columns[:len(COLUMNS)]) == list(COLUMNS)
    timed = df.dropna(subset=["median_us"])
    assert set(timed.variant) == {"cublas_linear", "cublas_linear+fused_rope", "qkv_rope_linear",
                                  "qkv_rope_linear_angles", "qkv_gemm_rotation_compiled_out"}
    assert (timed.median_us > 0).all() and (timed.p20_us <= timed.p80_us).all()
    assert (timed.matches_float64 == "True").all(), timed[["variant", "max_abs_err",
                                                          "error_tolerance"]]
    assert (timed.max_abs_err <= timed.error_tolerance).all()
    # five rounds, one sample each, every variant once per round in a shuffled order
    assert (timed.rounds == 5).all() and (timed.samples == 5).all()
    assert (timed.input_sets >= 2).all()
    positions = [list(map(int, p.split(";"))) for p in timed.round_positions]
    for r in range(5):
        assert sorted(p[r] for p in positions) == list(range(len(timed)))
    assert len({tuple(p) for p in positions}) > 1, "every round in the same order"
    assert (timed.order_seed == "0/37").all()
    # each kernel at its fixed config: the backend's default on this device
    cpu = qkv_gemm_config(2, 8, torch.device("cpu"))
    main = df.set_index("variant")
    for name in ("qkv_rope_linear", "qkv_rope_linear_angles", "qkv_gemm_rotation_compiled_out"):
        assert main.loc[name, "config"] == cpu.label
    assert main.loc["qkv_gemm_rotation_compiled_out", "reference"] == "x W^T + b"
    assert df.ratio_to_cublas.iloc[0] == 1.0 and df.ratio_to_cublas_fused_rope.iloc[1] == 1.0
    # each row's time over cuBLAS's at the same token count (not x/x: the other rows too)
    base = df.median_us.iloc[0]
    assert timed.ratio_to_cublas.tolist() == pytest.approx((timed.median_us / base).tolist(),
                                                           rel=1e-12)
    assert {"device_name", "git_commit", "torch_version", "tflops", "note"} <= set(df.columns)
    absent = df[df.variant.str.contains("quack|cute")]
    assert absent.median_us.isna().all() and absent.note.str.startswith("absent").all()
    roof = roofline(df, peak_tflops=100.0, hbm_gbps=1000.0)
    assert (roof.ceiling_tflops <= 100.0).all() and (roof.fraction_of_ceiling > 0).all()
    with pytest.raises(ValueError, match="unknown variants"):
        run_qkv_bench((37,), device="cpu", variants=("cublas",))
    with pytest.raises(ValueError, match="rounds must be a positive int"):
        run_qkv_bench((37,), device="cpu", rounds=0)


def test_qkv_bench_input_sets_cover_twice_the_l2():
    """The input sets cover twice the L2 with what one call reads (x, W, b), at every
    token count (the committed rows had 2 sets: 1.86x the L2 at 21,904 tokens)."""
    from rope_kernels.bench import qkv_bench
    from rope_kernels.bench.timing import rotation_count

    h200 = torch.device("cuda")
    l2 = 60 * 2**20
    for tokens in (1024, 5476, 21904, 43808, 87616):
        per_call = qkv_bench.read_bytes(tokens, 1152, 16, 72)
        assert per_call == 2 * (tokens * 1152 + 3456 * 1152 + 3456)
        count = max(2, -(-2 * l2 // per_call))
        assert count * per_call >= 2 * l2
    import unittest.mock as mock
    with mock.patch("rope_kernels.bench.timing.l2_cache_bytes", lambda device: l2):
        assert rotation_count(qkv_bench.read_bytes(21904, 1152, 16, 72), h200) == 3


def test_qkv_bench_survives_a_failing_variant(monkeypatch):
    """A variant that raises is a row saying so; the others are timed."""
    from rope_kernels.bench import qkv_bench

    def broken(name, heads, head_dim, config=None):
        def fail(a):
            raise RuntimeError("out of resources")
        return fail

    monkeypatch.setattr(qkv_bench, "variant_call", broken)
    df = qkv_bench.run_qkv_bench((37,), device="cpu", hidden=32, heads=2, head_dim=8,
                                 mode="eager", samples=2, rounds=2, progress=False,
                                 variants=("cublas_linear", "qkv_rope_linear")).rows
    assert df.median_us.iloc[0] > 0
    assert df.note.iloc[1] == "failed: RuntimeError: out of resources"
    assert pd_isna(df.median_us.iloc[1])


def pd_isna(v) -> bool:
    return v != v


def test_qkv_bench_catches_a_wrong_variant(monkeypatch):
    """A variant computing the wrong thing gets matches_float64 False, not a pass."""
    from rope_kernels.bench import qkv_bench

    monkeypatch.setattr(qkv_bench, "linear_then_fused_rope",
                        lambda x, w, b, cos, sin, h, d: qkv_bench.F.linear(x, w, b).view(
                            x.shape[0], 3, h, d))  # forgets the rotation
    df = qkv_bench.run_qkv_bench((37,), device="cpu", hidden=32, heads=2, head_dim=8,
                                 mode="eager", samples=1, rounds=1, progress=False,
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
    real_call = qkv_bench.variant_call

    def call(name, heads, head_dim, config=None):
        fn = real_call(name, heads, head_dim, config=config)
        if config == raising:
            def fail(a):
                raise RuntimeError("out of resources")
            return fail
        if config == wrong:
            return lambda a: fn(a) * 2
        return fn

    monkeypatch.setattr(qkv_bench, "variant_call", call)
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
    from rope_kernels.bench.qkv_configs import QKV_SWEEP_CONFIGS

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
def test_sweep_configs_match_float64_at_kimi_size(angles):
    """Every config tools/qkv_sweep.py times (the defaults among them), compiled, at Kimi's
    projection (1152 -> 3 x 16 x 72) and a token count no tile divides: the GPU paths
    (TMA, persistent, epilogue parts) against float64 (GPU only)."""
    from rope_kernels.bench.qkv_configs import QKV_SWEEP_CONFIGS

    assert {NVIDIA_TABLE_CONFIG, NVIDIA_ANGLES_CONFIG} <= set(QKV_SWEEP_CONFIGS)
    grids = [(1, 74, 74), (1, 1, 77)]
    x, w, b, freqs_cis = make_problem("cuda", heads=16, head_dim=72, hidden=1152, grids=grids,
                                      seed=0)
    tokens = x.shape[0]
    for config in QKV_SWEEP_CONFIGS:
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
    """Every config tools/qkv_sweep.py times (the defaults among them) compiles for sm_90
    through TMA as qkv_rope_linear launches it, without spills and within an H200's shared
    memory: the GPU exploration spends no time on a config that cannot run."""
    if not _ptxas_available():
        pytest.skip("Triton's ptxas is not available")
    from rope_kernels.bench.compile_matrix import write_compile_matrix
    from rope_kernels.bench.qkv_configs import QKV_CANDIDATE_CONFIGS, QKV_SWEEP_CONFIGS
    from rope_kernels.kernels.interpreter import qkv_sm90_spilling_configs

    assert set(QKV_CANDIDATE_CONFIGS) <= set(QKV_SWEEP_CONFIGS)
    table = write_compile_matrix(tmp_path / "qkv_sweep_sm90.csv", targets=["sm_90"],
                                 timeout_s=600,
                                 entries="rope_kernels.bench.compile_matrix:qkv_sweep_entries")
    assert sorted(table["kernel"]) == sorted(f"qkv_gemm {c.label}" for c in QKV_SWEEP_CONFIGS)
    assert (table["target"] == "sm_90").all() and table["compiled"].all()
    # spills: none under the H200's Triton; later ones spill in a known config or two
    assert qkv_sm90_spilling_configs() <= {c.label for c in QKV_SWEEP_CONFIGS}
    known = table["kernel"].isin([f"qkv_gemm {label}" for label in qkv_sm90_spilling_configs()])
    too_big = table[(table["shared_bytes"] > SM90_MAX_SHARED_BYTES) | (table["spills"] & ~known)]
    assert too_big.empty, too_big[["kernel", "registers", "spill_bytes", "shared_bytes"]]


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
