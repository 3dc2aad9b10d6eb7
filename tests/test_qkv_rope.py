"""The one QKV-with-RoPE entry point (rope_kernels/qkv.py): every backend behind
``qkv_rope`` computes the same packed qkv; its checks name what is wrong.

CPU tier: the Triton backends under the interpreter against float64 (tiny shapes); the
CuTe and QuACK backends' operands and arguments as ``qkv_rope`` hands them over (their
kernels need an sm_90 GPU: the GPU tier of test_qkv_cute / test_quack_gemm runs them).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rope_kernels.kernels import qkv_cute
from rope_kernels.kernels.freqs import vision_freqs_cis, vision_patch_coords, vision_rope_frequencies
from rope_kernels.kernels.qkv_gemm import qkv_rope_linear, qkv_rope_linear_angles
from rope_kernels.kernels.reference import cos_sin_views
from rope_kernels.qkv import qkv_rope, qkv_rope_operands, resolve_backend
from rope_kernels.bench.qkv_bench import _error, references
from rope_kernels.correctness import draw_qkv_problem, new_seed

HEADS, HEAD_DIM, HIDDEN = 2, 72, 48
GRIDS = [(1, 4, 6), (1, 3, 4), (1, 1, 1)]  # 37 tokens, two images and a lone patch
TOKENS = 37


def make_problem(device, *, seed=None):
    """x, W, b, freqs_cis: correctness.draw_qkv_problem on the CPU generator."""
    gen = torch.Generator().manual_seed(new_seed() if seed is None else seed)
    return draw_qkv_problem(gen, GRIDS, HIDDEN, HEADS, HEAD_DIM, torch.bfloat16, device)


def judge(out, x, w, b, freqs_cis):
    """(max error, tolerance) against float64 rope(x W^T + b): the bench's own rule."""
    (rotated, native), _, scale = references({"x": x, "w": w, "b": b, "freqs_cis": freqs_cis},
                                             HEADS, HEAD_DIM)
    checked = _error(out, rotated, native, scale)
    return checked["max_abs_err"], checked["error_tolerance"]


def _operands(backend, device="cpu"):
    return qkv_rope_operands(vision_patch_coords(GRIDS, device=device), heads=HEADS,
                             head_dim=HEAD_DIM, backend=backend,
                             freqs_cis=vision_freqs_cis(GRIDS, HEAD_DIM, device=device))


@pytest.mark.parametrize("backend", ["triton", "triton_table"])
def test_triton_backends_match_float64_and_their_kernels(backend, device):
    x, w, b, freqs_cis = make_problem(device)
    ops = _operands(backend, device)
    out = qkv_rope(x, w, b, ops, heads=HEADS, head_dim=HEAD_DIM, backend=backend)
    err, tol = judge(out, x, w, b, freqs_cis)
    assert err <= tol, (backend, err, tol)
    if backend == "triton":
        direct = qkv_rope_linear_angles(x, w, b, vision_patch_coords(GRIDS, device=device),
                                        vision_rope_frequencies(HEAD_DIM, device=device))
    else:
        direct = qkv_rope_linear(x, w, b, *cos_sin_views(freqs_cis))
    assert torch.equal(out, direct)
    plain = qkv_rope(x, w, b, ops, heads=HEADS, head_dim=HEAD_DIM, backend=backend,
                     epilogue="none")
    ref = (x.double() @ w.double().T + b.double()).view(TOKENS, 3, HEADS, HEAD_DIM)
    assert (plain.double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert torch.equal(plain[:, 2], out[:, 2]) and not torch.equal(plain[:, :2], out[:, :2])


def test_auto_is_triton_without_an_sm90_gpu_and_coords_build_operands():
    if qkv_cute.availability()[0]:
        pytest.skip("CuTe runs here: auto picks it")
    assert resolve_backend("auto", torch.device("cpu")) == "triton"
    x, w, b, freqs_cis = make_problem("cpu", seed=0)
    coords = vision_patch_coords(GRIDS)
    out = qkv_rope(x, w, b, coords, heads=HEADS, head_dim=HEAD_DIM)  # operands per call
    assert torch.equal(out, qkv_rope(x, w, b, _operands("triton"), heads=HEADS,
                                     head_dim=HEAD_DIM, backend="triton"))


class _OpCounter(TorchDispatchMode):
    """Counts the torch operators run inside it (any tensor built, viewed or cast)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


BIAS_EDITS = {
    "bias.data.add_": lambda lin: lin.bias.data.add_(1.0),
    "bias.data.copy_": lambda lin: lin.bias.data.copy_(torch.arange(lin.bias.numel()) * 0.5),
    "in place under no_grad": lambda lin: lin.bias.add_(1.0),
    "a new bias Parameter": lambda lin: setattr(lin, "bias", torch.nn.Parameter(lin.bias + 1.0)),
    "weight.data.mul_": lambda lin: lin.weight.data.mul_(2.0),
}


@pytest.mark.parametrize("epilogue", ["rope", "none"])
@pytest.mark.parametrize("edit", list(BIAS_EDITS))
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_cute_backend_reads_bias_and_weight_as_operands(monkeypatch, epilogue, edit, mode):
    """``backend="cute"``: the kernel gets the layer's own W and b (their memory, as they
    are at this call: an edit through .data, in place, under inference mode or a new
    Parameter between two calls is seen) and the per-forward turns, with no torch
    operator run per call (the per-call bias join of issue 44 ran one); the rotation is
    compiled out for ``epilogue="none"`` (the encoder's gemm_epilogue_cute_norot)."""
    calls = []
    monkeypatch.setattr(qkv_cute, "qkv_rope_linear_cute",
                        lambda x, w, b, turns, coords, **kw: calls.append((w, b, turns, kw)) or x)
    guard = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with guard():
        lin = torch.nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM).to(torch.bfloat16)
        x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
        ops = _operands("cute")
        seen = []
        for step in range(2):
            if step:
                BIAS_EDITS[edit](lin)
            with _OpCounter() as counter:
                qkv_rope(x, lin.weight, lin.bias, ops, heads=HEADS, head_dim=HEAD_DIM,
                         backend="cute", epilogue=epilogue)
            assert counter.ops == [], counter.ops
            w, b, turns, kw = calls[-1]
            assert w is lin.weight and b is lin.bias and turns is ops.pair_turns
            assert kw["config"].rotate == (epilogue == "rope")
            seen.append((w.clone(), b.clone()))
    assert not (torch.equal(seen[0][0], seen[1][0]) and torch.equal(seen[0][1], seen[1][1]))


def test_cute_backend_without_bias_passes_none(monkeypatch):
    calls = []
    monkeypatch.setattr(qkv_cute, "qkv_rope_linear_cute",
                        lambda x, w, b, turns, coords, **kw: calls.append(b) or x)
    x, w, _, _ = make_problem("cpu", seed=0)
    qkv_rope(x, w, None, _operands("cute"), heads=HEADS, head_dim=HEAD_DIM, backend="cute")
    assert calls == [None]


def test_quack_backend_absent_says_why(monkeypatch):
    from rope_kernels.peers import quack_gemm

    monkeypatch.setattr(quack_gemm, "availability", lambda: (False, "quack-kernels not installed"))
    x, w, b, _ = make_problem("cpu", seed=0)
    ops = qkv_rope_operands(vision_patch_coords(GRIDS), heads=HEADS, head_dim=HEAD_DIM,
                            backend="triton")
    with pytest.raises(ValueError, match="backend 'quack' does not run here: quack-kernels"):
        qkv_rope(x, w, b, ops, heads=HEADS, head_dim=HEAD_DIM, backend="quack")


def test_bad_calls_are_named():
    x, w, b, _ = make_problem("cpu", seed=0)
    ops = _operands("triton")
    kw = dict(heads=HEADS, head_dim=HEAD_DIM, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        qkv_rope(x, w, b, ops, **{**kw, "backend": "cuda"})
    with pytest.raises(ValueError, match="epilogue must be one of"):
        qkv_rope(x, w, b, ops, **kw, epilogue="rotate")
    with pytest.raises(ValueError, match="operands were built for 2 heads x 72, not heads=3"):
        qkv_rope(x, w, b, ops, **{**kw, "heads": 3})
    with pytest.raises(TypeError, match="heads must be an int"):
        qkv_rope(x, w, b, ops, **{**kw, "heads": 2.0})
    with pytest.raises(ValueError, match="operands hold 37 tokens' positions but x has 36"):
        qkv_rope(x[:-1], w, b, ops, **kw)
    with pytest.raises(TypeError, match="config for backend 'triton' must be a QKVGemmConfig"):
        qkv_rope(x, w, b, ops, **kw, config=qkv_cute.CuteQKVConfig())
    with pytest.raises(TypeError, match="operands must be"):
        qkv_rope(x, w, b, {"coords": None}, **kw)
    with pytest.raises(ValueError, match="needs operands built with backend='triton_table'"):
        qkv_rope(x, w, b, ops, **{**kw, "backend": "triton_table"})
    with pytest.raises(ValueError, match="give freqs_cis"):
        qkv_rope_operands(vision_patch_coords(GRIDS), heads=HEADS, head_dim=HEAD_DIM,
                          backend="triton_table")
    with pytest.raises(ValueError, match="coords must be an int32"):
        qkv_rope_operands(vision_patch_coords(GRIDS).long(), heads=HEADS, head_dim=HEAD_DIM)
    with pytest.raises(ValueError, match="does not support autograd"):
        qkv_rope(x.clone().requires_grad_(), w, b, ops, **kw)
    # heads that W does not have (the operands built for them too)
    ops7 = qkv_rope_operands(vision_patch_coords(GRIDS), heads=7, head_dim=HEAD_DIM,
                             backend="triton")
    with pytest.raises(ValueError, match="heads=7 does not match the weight"):
        qkv_rope(x, w, b, ops7, **{**kw, "heads": 7})
