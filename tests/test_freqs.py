"""Kimi's 2D RoPE table and image-size rule."""

import csv
import math
from pathlib import Path

import pytest
import torch

from rope_kernels import grid_tokens, image_patch_grid, vision_freqs_cis

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "reference"


def kimi_table(head_dim, max_h=512, max_w=512, theta=10000.0):
    """Kimi's construction, written independently: the whole max_h x max_w table."""
    n = max_h * max_w
    flat = torch.arange(n).float()
    x_pos = flat % max_w
    y_pos = flat // max_w
    dims = torch.arange(0, head_dim, 4)[: head_dim // 4].float()
    f = 1.0 / (theta ** (dims / head_dim))
    xa, ya = torch.outer(x_pos, f).float(), torch.outer(y_pos, f).float()
    x_cis = torch.polar(torch.ones_like(xa), xa)
    y_cis = torch.polar(torch.ones_like(ya), ya)
    table = torch.cat([x_cis.unsqueeze(-1), y_cis.unsqueeze(-1)], dim=-1)
    return table.reshape(max_h, max_w, -1)


@pytest.mark.parametrize("head_dim", [8, 72, 128])
def test_matches_kimi_table_exactly(head_dim):
    grids = [(1, 3, 5), (1, 7, 2), (2, 2, 3)]
    table = kimi_table(head_dim, 16, 16)
    expected = torch.cat([table[:h, :w].reshape(-1, head_dim // 2).repeat(t, 1)
                          for t, h, w in grids])
    got = vision_freqs_cis(grids, head_dim)
    assert got.dtype == torch.complex64 and got.shape == (grid_tokens(grids), head_dim // 2)
    assert torch.equal(got, expected)


def test_angles_follow_the_formula_in_float64():
    head_dim, theta = 72, 10000.0
    h, w = 9, 11
    got = vision_freqs_cis([(1, h, w)], head_dim, theta=theta)
    for token in (0, 5, 57, h * w - 1):
        row, col = divmod(token, w)
        for i in range(head_dim // 4):
            f = theta ** (-4 * i / head_dim)
            for pair, pos in ((2 * i, col), (2 * i + 1, row)):
                want = complex(math.cos(pos * f), math.sin(pos * f))
                assert abs(complex(got[token, pair]) - want) < 1e-5


def test_frames_repeat_and_tensor_grids():
    a = vision_freqs_cis([(3, 4, 6)], 8)
    one = vision_freqs_cis([(1, 4, 6)], 8)
    assert torch.equal(a, one.repeat(3, 1))
    assert torch.equal(vision_freqs_cis(torch.tensor([[3, 4, 6]]), 8), a)


def test_largest_grid():
    f = vision_freqs_cis([(1, 512, 512)], 8)
    assert f.shape == (512 * 512, 4)
    assert torch.allclose(f.abs(), torch.ones(()), atol=1e-6)


def test_image_token_counts_match_reference():
    with open(REFERENCE / "kimi_k25_image_tokens.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= 8
    for row in rows:
        t, h, w = image_patch_grid(int(row["width"]), int(row["height"]))
        assert t * h * w == int(row["vit_tokens"]), row
        assert (h // 2) * (w // 2) == int(row["llm_tokens"]), row


def test_large_images_are_scaled_to_the_patch_limit():
    t, h, w = image_patch_grid(4000, 3000)
    assert h * w <= 16384 * 1.05 and h <= 512 and w <= 512
    assert image_patch_grid(14000, 100)[2] == 512  # one side capped
    with pytest.raises(ValueError, match="positive"):
        image_patch_grid(0, 10)
    with pytest.raises(TypeError, match="int"):
        image_patch_grid(10.5, 10)
