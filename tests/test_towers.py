"""The tower catalogue (``rope_kernels.towers``): each tower's token counts from its own
image rule, Qwen's rotate-half angle layout, and a new tower as one entry that reaches the
microbench's shapes."""

import math

import pytest
import torch

from rope_kernels import towers
from rope_kernels.bench.microbench import Shape, expand_families
from rope_kernels.kernels.freqs import qwen_patch_coords, qwen_vision_freqs_cis, tower_freqs_cis
from rope_kernels.study.specs import _family_problem, _family_rows


# (tower, resolution) -> patches a side, worked out by hand from each model's rule:
# Kimi: sides padded up to 28 px (448 -> 16 x 2 = 32; 1024 -> 37 x 2 = 74 patches).
# Qwen2.5-VL: sides rounded to 28 px (448 -> 448, 1024 -> 1036), under max_pixels 12845056:
#   32 and 74 patches of 14 px. Qwen3-VL: 32 px (448 -> 448, 1024 -> 1024), patches of 16 px:
#   28 and 64.
SIDES = {("kimi_k25", "448x448"): 32, ("kimi_k25", "1024x1024"): 74,
         ("qwen25_vl", "448x448"): 32, ("qwen25_vl", "1024x1024"): 74,
         ("qwen3_vl", "448x448"): 28, ("qwen3_vl", "1024x1024"): 64}


@pytest.mark.parametrize("tower,resolution", sorted(SIDES))
@pytest.mark.parametrize("images", [1, 4, 16])
def test_each_towers_token_counts_come_from_its_image_rule(tower, resolution, images):
    assert towers.get_tower(tower).tokens(resolution, images) == images * SIDES[tower, resolution] ** 2


def test_the_microbench_counts_are_1_4_16_images_of_448_and_1024():
    want = sorted({n * SIDES["qwen3_vl", r] ** 2 for r in ("448x448", "1024x1024") for n in (1, 4, 16)})
    assert list(towers.tower_token_counts("qwen3_vl")) == want


def test_qwen_smart_resize_scales_into_its_pixel_bounds():
    # 8000 x 8000 is over Qwen3-VL's 16777216 pixels: scaled down, sides multiples of 32
    h, w = towers.qwen_smart_resize(8000, 8000, 32, 65536, 16777216)
    assert h * w <= 16777216 and h % 32 == 0 and w % 32 == 0 and h == w == 4096
    # 64 x 64 is under 65536 pixels: scaled up to 256 x 256
    assert towers.qwen_smart_resize(64, 64, 32, 65536, 16777216) == (256, 256)


def test_the_catalogue_holds_the_published_geometry():
    k, q3, q25 = (towers.get_tower(n) for n in ("kimi_k25", "qwen3_vl", "qwen25_vl"))
    assert (k.layers, k.hidden, k.heads, k.head_dim, k.rotation) == (27, 1152, 16, 72, "pairs")
    assert (q3.layers, q3.hidden, q3.heads, q3.head_dim, q3.mlp, q3.patch_size, q3.rotation) == \
        (27, 1152, 16, 72, 4304, 16, "half")
    assert (q25.layers, q25.hidden, q25.heads, q25.head_dim, q25.mlp, q25.patch_size) == \
        (32, 1280, 16, 80, 3420, 14)
    assert q25.full_attention_layers == (7, 15, 23, 31) and q25.windowed_layers == 28
    assert q3.windowed_layers == 0 and k.windowed_layers == 0
    assert all(t.source for t in towers.TOWERS.values())


def test_a_registered_dummy_tower_reaches_the_microbench_shapes():
    dummy = towers.Tower("dummy_vit", "dummy", layers=2, hidden=3 * 40, heads=3, mlp=64,
                         patch_size=10, merge_size=2, image_rule="qwen_smart_resize",
                         rotation="half", min_pixels=400, max_pixels=10 ** 8)
    towers.register(dummy)
    try:
        assert _family_problem({"tower": "dummy_vit"}) is None
        shapes = expand_families([{"tower": "dummy_vit"}])
        # 448 -> 440 px (multiple of 20): 44 patches a side; 1024 -> 1020: 102
        want = sorted({n * s * s for s in (44, 102) for n in (1, 4, 16)})
        assert [s.tokens for s in shapes] == want
        assert all(s == Shape(s.tokens, 3, 40, "half") and s.tower == "dummy_vit" for s in shapes)
        assert _family_rows({"tower": "dummy_vit"})["rotation"] == ["half"]
        with pytest.raises(ValueError, match="registered already"):
            towers.register(dummy)
    finally:
        towers.unregister("dummy_vit")
    assert "unknown tower" in _family_problem({"tower": "dummy_vit"})
    with pytest.raises(ValueError, match="unknown tower"):
        expand_families([{"tower": "dummy_vit"}])


def test_a_bad_tower_is_refused():
    with pytest.raises(ValueError, match="rotation"):
        towers.Tower("x", "x", 1, 64, 4, 8, 14, 2, "kimi", "neox")
    with pytest.raises(ValueError, match="layer indexes"):
        towers.Tower("x", "x", 4, 64, 4, 8, 14, 2, "kimi", "pairs", full_attention_layers=(4,),
                     window_px=112)
    with pytest.raises(ValueError, match="multiple of 4"):
        towers.Tower("x", "x", 1, 60, 6, 8, 14, 2, "kimi", "pairs")


def test_qwen_angles_are_row_then_column_halves_in_merge_window_order():
    """Against the layout written out here: vLLM's rot_pos_emb (positions in 2x2 window
    order, the (D/2)-dim rotary embedding of each axis, row half then column half)."""
    grid, head_dim, theta = [(1, 4, 6), (2, 2, 2)], 16, 10000.0
    freqs = qwen_vision_freqs_cis(grid, head_dim, theta=theta)
    dim = head_dim // 2
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    rows = []
    for t, h, w in grid:
        for _ in range(t):
            for wr in range(h // 2):
                for wc in range(w // 2):
                    for r in range(2):
                        for c in range(2):
                            rows.append((2 * wr + r, 2 * wc + c))
    pos = torch.tensor(rows, dtype=torch.float64)
    want = torch.cat((pos[:, :1] * inv, pos[:, 1:] * inv), dim=-1)
    assert freqs.shape == (sum(t * h * w for t, h, w in grid), head_dim // 2)
    assert torch.allclose(freqs.angle().double(), torch.atan2(want.sin(), want.cos()), atol=1e-5)
    assert qwen_patch_coords(grid)[:4].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    with pytest.raises(ValueError, match="multiples of merge_size"):
        qwen_patch_coords([(1, 3, 4)])


def test_tower_freqs_follow_the_towers_rotation():
    grid = [(1, 4, 4)]
    kimi = tower_freqs_cis("kimi_k25", grid)
    qwen = tower_freqs_cis("qwen3_vl", grid)
    assert kimi.shape == qwen.shape == (16, 36)
    # the same angles, laid out for their rotations: Kimi alternates column/row pairs
    # row-major, Qwen puts the row half first in window order
    assert not torch.allclose(kimi, qwen)
    assert math.isclose(sorted(kimi.angle().abs().flatten().tolist())[-1],
                        sorted(qwen.angle().abs().flatten().tolist())[-1], rel_tol=1e-6)


def test_a_rotate_half_encoder_agrees_with_native_and_refuses_pairs_only_kernels():
    """The encoder in Qwen3-VL's rotation (a CPU-sized twin): fused agrees with native's
    rotate-half path, the RoPE-free floor does not, and a pairs-only kernel or the QKV
    epilogue is refused with why (before anything runs)."""
    from dataclasses import replace

    from rope_kernels.bench.encoder_bench import encoder_not_run, make_bucket, native_agreement
    from rope_kernels.encoder_config import EncoderConfig
    from rope_kernels.model.vit import MoonViTEncoder, encoder_inputs

    assert EncoderConfig.qwen3_vl().rotation == "half" and EncoderConfig.qwen3_vl().head_dim == 72
    assert make_bucket("1024x1024", 2, tower="qwen3_vl").vit_tokens == 2 * 64 * 64
    cfg = replace(EncoderConfig.small(), patch=16, rotation="half", tower="qwen3_vl")
    model = MoonViTEncoder(cfg, dtype=torch.bfloat16)
    inp = encoder_inputs(make_bucket("64x64", 1, tower="qwen3_vl").grids, cfg, dtype=torch.bfloat16,
                         seed=torch.randint(0, 2**31, ()).item())
    agreement = native_agreement(model, inp, "sdpa_per_image", ["native", "fused_inplace", "none"])
    for v in ("native", "fused_inplace"):
        assert agreement[v]["max_rel_err_vs_fp32"] <= agreement[v]["agreement_tol_rel"], v
    assert agreement["none"]["max_rel_err_vs_fp32"] > agreement["none"]["agreement_tol_rel"]
    with pytest.raises(ValueError, match="pairs only"):
        model(inp.patches, inp.grids, rope="vllm_packed_qk")
    why = encoder_not_run(["vllm_packed_qk", "gemm_epilogue", "fused", "none"], cfg.head_dim,
                          torch.bfloat16, "half")
    assert set(why) == {"vllm_packed_qk", "gemm_epilogue"}


def test_the_summary_has_a_row_per_tower_with_the_best_same_kind_peer():
    import pandas as pd

    from rope_kernels.study.summary import tower_rows

    def row(variant, tokens, heads, head_dim, rotation, tower, us, in_place):
        return dict(variant=variant, tokens=tokens, heads=heads, head_dim=head_dim,
                    rotation=rotation, tower=tower, median_us=us, p20_us=0.9 * us, p80_us=1.1 * us,
                    in_place=in_place, mode="cudagraph", dtype="bfloat16",
                    pct_of_same_bytes_copy=90.0, device_folder="dev")
    micro = pd.DataFrame([
        # Kimi's rows from before the tower column (no tower), pairs at 16 x 72
        row("fused", 87616, 16, 72, "pairs", None, 100.0, False),
        row("quack_rotary", 87616, 16, 72, "pairs", None, 120.0, False),
        row("fused", 5476, 16, 72, "pairs", None, 10.0, False),  # not the largest count
        # Qwen3-VL, rotate-half at 16 x 72: the same-kind peer only (the in-place one is faster)
        row("fused", 65536, 16, 72, "half", "qwen3_vl", 80.0, False),
        row("vllm_merged", 65536, 16, 72, "half", "qwen3_vl", 400.0, False),
        row("vllm_rotary_qkv", 65536, 16, 72, "half", "qwen3_vl", 50.0, True),
        row("native", 65536, 16, 72, "half", "qwen3_vl", 900.0, False),  # a baseline, not a peer
    ])
    got = tower_rows(micro).set_index(["tower", "ours"])
    assert got.loc[("kimi_k25", "fused"), "best_peer"] == "quack_rotary"
    assert got.loc[("kimi_k25", "fused"), "lead"] == pytest.approx(1.2)
    assert got.loc[("kimi_k25", "fused"), "tokens"] == 87616
    q = got.loc[("qwen3_vl", "fused")]
    assert (q["best_peer"], q["rotation"], q["lead"]) == ("vllm_merged", "half", pytest.approx(5.0))
    assert q["lead_worst"] == pytest.approx(400 * 0.9 / (80 * 1.1))


def test_a_rotate_half_kernel_that_is_wrong_or_raises_is_not_timed():
    """checked_cases: each variant's rotate-half layout is checked against float64 before
    timing; one that gets it wrong (here: rotating pairs when asked for halves) or raises
    is a not-run case with why, for every shape of that layout."""
    from dataclasses import replace

    from rope_kernels.bench.microbench import checked_cases
    from rope_kernels.kernels.reference import native_rope
    from rope_kernels.variants import VARIANTS

    def pairs_whatever(xq, xk, freqs_cis, rotation="pairs"):
        return native_rope(xq, xk, freqs_cis)  # ignores the rotation: wrong for "half"

    def refuses(xq, xk, freqs_cis, rotation="pairs"):
        raise RuntimeError("no kernel for this head_dim\nsecond line")

    good = VARIANTS["fused"]
    wrong = replace(good, name="pairs_whatever", fn=pairs_whatever)
    raising = replace(good, name="refuses", fn=refuses)
    shapes = [Shape(40, 2, 8, "half"), Shape(80, 2, 8, "half"), Shape(40, 2, 8, "pairs")]
    cases = checked_cases([good, wrong, raising], shapes, [torch.bfloat16], "cpu")
    by = {(c["variant"], c["tokens"]): c["reason"] for c in cases}
    assert set(by) == {("pairs_whatever", 40), ("pairs_whatever", 80), ("refuses", 40), ("refuses", 80)}
    assert by["pairs_whatever", 40].startswith("fails the float64 check")
    assert by["refuses", 80] == "raised RuntimeError: no kernel for this head_dim"
