"""Float64 correctness rows for everything the study can time: every registered
variant on every dtype and shape (``correctness.check_variant``), every encoder-only
RoPE mode (``vocabulary.ENCODER_ONLY_ROPE``: the QKV projection with q and k rotated in
its epilogue, its rotation-free floor, no RoPE) the encoder benchmark times
(``encoder_mode_rows``), and, for every peer or mode that cannot run here, rows that say
so and why. Nothing the encoder or the microbenchmark times silently drops out of
``correctness.csv`` (issue 44: ``gemm_epilogue_cute_norot`` had encoder rows and none
here)."""

from __future__ import annotations

import math

from rope_kernels.correctness import CheckResult, check_variant

ABSENT = "absent here: "  # how a row of a peer that could not run here starts its reason


def absent_rows(status: list[dict], dtypes, shapes, rotations=("pairs",)) -> list[dict]:
    """Rows for peers that could not run here (``variants.peer_status()`` entries
    with ``available`` False), one per dtype, shape and rotation: not run, ``supported``
    False, and the reason."""
    rows = []
    for s in status:
        if s["available"]:
            continue
        for dt in dtypes:
            for (tokens, heads, head_dim), rotation in ((sh, r) for sh in shapes for r in rotations):
                rows.append(CheckResult(
                    variant=s["name"], tokens=tokens, heads=heads, head_dim=head_dim,
                    dtype=str(dt).removeprefix("torch."), packed=True, max_abs_err=math.nan,
                    rel_err=math.nan, native_max_abs_err=math.nan, tolerance=math.nan,
                    inputs_intact=True, passed=False, supported=False,
                    reason=ABSENT + s["reason"], peer_package=s.get("package", ""),
                    peer_version=s.get("version", ""), peer_sha256=s.get("sha256", ""),
                    rotation=rotation,
                ).as_dict())
    return rows


def sweep_names(names, status: list[dict]) -> list[str]:
    """The variants ``correctness_rows(names, ...)`` covers: ``names``, or where empty every
    registered variant, every peer the registry knows (``status``) and every encoder-only
    RoPE mode: all the microbenchmark and the encoder benchmark can time."""
    from rope_kernels.variants import VARIANTS
    from rope_kernels.vocabulary import ENCODER_ONLY_ROPE

    absent = [s["name"] for s in status if not s["available"] and s["name"] not in VARIANTS]
    return list(names) or list(VARIANTS) + absent + list(ENCODER_ONLY_ROPE)


def _row(name, tokens, heads, head_dim, dtype, rotation="pairs", **fields) -> dict:
    base = dict(variant=name, tokens=tokens, heads=heads, head_dim=head_dim, rotation=rotation,
                dtype=str(dtype).removeprefix("torch."), packed=True, max_abs_err=math.nan,
                rel_err=math.nan, native_max_abs_err=math.nan, tolerance=math.nan,
                inputs_intact=True, passed=False, supported=False)
    return CheckResult(**{**base, **fields}).as_dict()


def encoder_mode_rows(mode: str, dtypes, shapes, *, device, seed: int | None = None,
                      why_absent: str = "", rotations=("pairs",)) -> list[dict]:
    """Rows of encoder-only RoPE mode ``mode`` on every dtype and shape: a QKV-epilogue mode
    (``model.vit.GEMM_EPILOGUE_MODES``) is ``qkv.qkv_rope`` with the mode's backend and
    epilogue on x (T, hidden), W, b drawn fresh (hidden: heads x head_dim rounded up to 64,
    TMA's rows), against float64: rotated q/k and v for a rotating mode, the plain
    projection for a rotation-free floor, with the QKV benchmark's tolerance (twice the
    native path's own error in that dtype); inputs checked unchanged. Checked at the
    encoder's head_dim (Kimi's 72) only: the CuTe and QuACK kernels compile once per weight
    shape, and the encoder runs no other. ``none`` (no RoPE), modes absent here
    (``why_absent``), other head_dims and dtypes the GEMM does not take get a row saying why
    (not run). Each shape in each of ``rotations``: in ``"half"`` (Qwen's rotate-half, also
    at head_dim 72: Qwen3-VL's) the Triton mode's kernel runs as ``qkv_rope`` backend
    ``"triton_table"`` (the one that rotates halves: its angles-in-kernel path is Kimi's);
    the CuTe and QuACK modes are pairs-only (a row says so)."""
    import torch

    from rope_kernels.bench import qkv_bench as qb
    from rope_kernels.correctness import new_seed
    from rope_kernels.kernels.checks import GEMM_DTYPES
    from rope_kernels.model.vit import GEMM_EPILOGUE_MODES
    from rope_kernels.qkv import qkv_rope, qkv_rope_operands
    from rope_kernels.vocabulary import KIMI_HEAD_DIM

    rows = []
    for dt in dtypes:
        for (tokens, heads, head_dim), rotation in ((sh, r) for sh in shapes for r in rotations):
            at = (mode, tokens, heads, head_dim, dt, rotation)
            if why_absent:
                rows.append(_row(*at, reason=ABSENT + why_absent))
                continue
            if mode not in GEMM_EPILOGUE_MODES:
                rows.append(_row(*at, reason="no RoPE: the encoder's floor (nothing rotated to "
                                             "check)"))
                continue
            if head_dim != KIMI_HEAD_DIM:
                rows.append(_row(*at, reason=f"not checked at head_dim {head_dim}: the encoder "
                                             f"runs at Kimi's {KIMI_HEAD_DIM} only"))
                continue
            if dt not in GEMM_DTYPES:
                rows.append(_row(*at, reason="the QKV GEMM takes bfloat16/float16 only"))
                continue
            backend, epilogue = GEMM_EPILOGUE_MODES[mode]
            note = "" if epilogue == "rope" else \
                "rotation compiled out: checked against the plain projection"
            if rotation == "half" and epilogue == "rope":
                if backend != "triton":
                    rows.append(_row(*at, reason=f"rotates Kimi's interleaved pairs only: qkv_rope "
                                                 f"backend {backend!r} refuses rotation='half'"))
                    continue
                backend, note = "triton_table", "rotate-half: the Triton kernel reading cos/sin " \
                                                "(qkv_rope backend 'triton_table')"
            hidden = -(-heads * head_dim // 64) * 64
            s = new_seed() if seed is None else seed
            a = qb.make_args(tokens, hidden, heads, head_dim, device, seed=s, dtype=dt)
            before = [a[k].clone() for k in ("x", "w", "b")]
            ops = qkv_rope_operands(a["coords"], heads=heads, head_dim=head_dim, backend=backend,
                                    freqs_cis=a["freqs_cis"])
            with torch.no_grad():
                out = qkv_rope(a["x"], a["w"], a["b"], ops, heads=heads, head_dim=head_dim,
                               backend=backend, epilogue=epilogue, rotation=rotation)
            rotated, unrotated, scale = qb.references(a, heads, head_dim, rotation)
            reference, native = rotated if epilogue == "rope" else unrotated
            checked = qb._error(out, reference, native, scale)
            intact = all(torch.equal(t, a[k]) for t, k in zip(before, ("x", "w", "b")))
            ref = torch.cat([r.reshape(-1) for r in reference])
            got = out.double().unbind(1)
            rel = (torch.cat([g.reshape(-1) for g in got]) - ref).norm().item() / ref.norm().item()
            rows.append(_row(*at, max_abs_err=checked["max_abs_err"], rel_err=rel,
                             native_max_abs_err=native, tolerance=checked["error_tolerance"],
                             inputs_intact=intact, passed=checked["matches_float64"] and intact,
                             supported=True, seed=s, reason=note))
    return rows


def correctness_rows(names, dtypes, shapes, *, device, seed: int | None = None,
                     status: list[dict] | None = None, rotations=("pairs",)) -> list[dict]:
    """``check_variant`` of every named variant on every dtype and shape, the encoder-only
    modes' rows (``encoder_mode_rows``), and rows saying why each named peer or mode that
    cannot run here did not. Empty ``names``: ``sweep_names`` (every registered variant,
    every peer the registry knows (``peer_status()``), available or not, every
    encoder-only mode). ``dtypes``: names or torch dtypes; ``shapes``: [tokens, heads,
    head_dim] triples; ``seed``: the inputs' seed (None: a fresh one per check);
    ``rotations``: each shape is checked in each (a variant that does not implement one
    gets a row saying so, ``supported`` False)."""
    from rope_kernels.bench.microbench import parse_dtype
    from rope_kernels.variants import VARIANTS, encoder_only_absent, get_variant, peer_status
    from rope_kernels.vocabulary import ENCODER_ONLY_ROPE

    status = peer_status() if status is None else status
    absent = {s["name"]: s for s in status if not s["available"]}
    names = sweep_names(names, status)
    dts = [parse_dtype(d) for d in dtypes]
    modes_absent = encoder_only_absent() if set(names) & set(ENCODER_ONLY_ROPE) else {}
    rows = []
    for name in names:
        if name in ENCODER_ONLY_ROPE:
            rows += encoder_mode_rows(name, dts, shapes, device=device, seed=seed,
                                      why_absent=modes_absent.get(name, ""),
                                      rotations=rotations)
            continue
        if name in absent and name not in VARIANTS:
            rows += absent_rows([absent[name]], dts, shapes, rotations)
            continue
        variant = get_variant(name)
        for dt in dts:
            for (tokens, heads, head_dim), rotation in ((sh, r) for sh in shapes for r in rotations):
                rows.append(check_variant(variant, tokens=tokens, heads=heads, head_dim=head_dim,
                                          dtype=dt, device=device, seed=seed,
                                          rotation=rotation).as_dict())
    return rows


def absent(rows) -> "pd.Series":
    """Which rows (a DataFrame of these rows) are a peer that could not run here."""
    return rows["reason"].astype(str).str.startswith(ABSENT)
