"""Headline numbers per device, read back from data/<device>/*.csv.

Shared by notebooks/06_summary and reports/index.html so both say the same.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rope_kernels import catalogue
from rope_kernels.study.results import TABLES, current_file, read_table
from rope_kernels.study.specs import ENCODER_LATENCY_CSV, MICROBENCH_CSV
from rope_kernels.study.rows import kimi_rows
from rope_kernels.study.targets import PR_TABLE_CSV as PR_TABLE
from rope_kernels.vocabulary import KIMI_HEAD_DIM, KIMI_HEADS

KIMI = (KIMI_HEADS[0], KIMI_HEAD_DIM)  # heads x head_dim of Kimi-K2.5's vision tower (TP=1)


# What device_summary reads of each file: a file without them is refused naming it.
SUMMARY_COLUMNS = {MICROBENCH_CSV: ("variant", "tokens", "heads", "head_dim", "dtype", "mode",
                                      "median_us", "device_name", "git_commit"),
                   ENCODER_LATENCY_CSV: ("variant", "resolution", "images", "mode", "median_ms",
                                           "device_name")}


def load_device_tables(data_root: Path, name: str, device_folders: str = "all") -> pd.DataFrame:
    """Concatenate ``data/*/<name>`` (reference data excluded); a folder whose file
    still has its former name (``results.Table.formerly``, e.g. ttft.csv for
    encoder_latency.csv) is read from that. Files written before a column was
    renamed (e.g. the ``profiled_`` names) are read with the current names.
    ``device_folders``: "all" or "committed" (see ``all_devices``)."""
    keep = _device_filter(data_root, device_folders)
    frames = []
    folders = sorted(p for p in Path(data_root).iterdir() if p.is_dir()) \
        if Path(data_root).is_dir() else []
    for folder in folders:
        if folder.name == "reference" or (keep is not None and folder.name not in keep):
            continue
        path = current_file(folder / name)
        if path is None:
            continue
        df = read_table(path, required=SUMMARY_COLUMNS.get(name, ()))
        renamed = TABLES[name].renamed if name in TABLES else {}
        df = df.rename(columns={old: new for old, new in renamed.items() if new not in df.columns})
        df["device_folder"] = path.parent.name
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def pr_comparison(micro: pd.DataFrame, pr: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Our native and fused beside the PR's published rows (same shapes, bf16).
    ``check``: met / missed (our fused at or under the PR's time), or, with cold
    L2, "within noise" where our fused time is below its physical minimum
    (``minimal_us``: its minimal bytes at the copy bandwidth of the same run)."""
    ours = micro[(micro["mode"] == mode) & (micro["dtype"] == "bfloat16")
                 & micro["variant"].isin(["native", "fused"])]
    wide = ours.pivot_table(index=["tokens", "heads", "head_dim"], columns="variant",
                            values="median_us").reset_index()
    wide = wide.rename(columns={"native": "our_native_us", "fused": "our_fused_us"})
    out = pr.merge(wide, on=["tokens", "heads", "head_dim"], how="inner")
    if out.empty:
        return out
    out["our_speedup"] = out["our_native_us"] / out["our_fused_us"]
    out["fused_at_or_under_pr"] = out["our_fused_us"] <= out["fused_us"]
    out["check"] = out["fused_at_or_under_pr"].map({True: "met", False: "missed"})
    if mode == "cudagraph" and {"bytes", "copy_gbps"} <= set(micro.columns):
        keys = ["tokens", "heads", "head_dim"]
        fused = ours[ours["variant"] == "fused"]
        minimal = (fused.assign(minimal_us=fused["bytes"] / (fused["copy_gbps"] * 1e3))
                   .groupby(keys, as_index=False)["minimal_us"].mean())
        out = out.merge(minimal, on=keys, how="left")
        # Warm-L2 times have no DRAM minimum; cold ones below it are noise, not a pass.
        below = out["our_fused_us"] < out["minimal_us"]
        out.loc[below, "check"] = "within noise"
    return out


def peer_ratios(rows: pd.DataFrame, times: pd.Series) -> dict:
    """``ratio_<variant>``: time of each other variant over the time of ours, like for
    like (in-place variants over ``fused_inplace``, others over ``fused``; > 1: ours
    faster), from ``times`` (median per variant at one shape)."""
    from rope_kernels.study.findings import ordered
    from rope_kernels.study.rows import like_for_like

    out = {}
    for v in ordered(times.index):
        ours = like_for_like(rows, v)
        if ours in times.index and v in times.index:
            out[f"ratio_{v}"] = times[v] / times[ours]
    return out


CPU_TIMING = "CPU (Triton interpreter, wall clock): not comparable, no savings shown"


def device_summary(micro: pd.DataFrame, ttft: pd.DataFrame, pr: pd.DataFrame | None = None) -> dict:
    """One device's headline row (NaN where the data does not cover a figure)."""
    nan = float("nan")
    row: dict = {}
    cpu = any("device_kind" in df.columns and (df["device_kind"].astype(str) == "cpu").any()
              for df in (micro, ttft) if not df.empty)
    if not (micro.empty and ttft.empty):  # a CPU run's times are not comparable with a GPU's
        row["timed_on"] = CPU_TIMING if cpu else "GPU"
    if not micro.empty:
        row["device_name"] = micro["device_name"].iloc[0]
        row["microbench_commit"] = ", ".join(sorted(set(micro["git_commit"].astype(str))))
        # Kimi's rows as findings and summaries take them, every token count measured
        kimi = kimi_rows(micro, "cudagraph", heads=(KIMI[0],), tokens=None)
        fused = kimi[kimi["variant"] == "fused"]
        if not fused.empty:
            big = fused[fused["tokens"] == fused["tokens"].max()].iloc[0]
            row["kimi_tokens"] = int(big["tokens"])
            row["fused_speedup_vs_native"] = big["speedup_vs_native"]
            row["fused_pct_of_copy"] = big["pct_of_copy"]
            at = kimi[kimi["tokens"] == big["tokens"]].drop_duplicates("variant").set_index("variant")
            row.update(peer_ratios(kimi, at["median_us"]))
        if pr is not None and not pr.empty:
            for mode in ("cudagraph", "cudagraph_warm"):
                cmp = pr_comparison(micro, pr, mode)
                if len(cmp):
                    noise = int((cmp["check"] == "within noise").sum())
                    row[f"pr_fused_at_or_under_{mode}"] = (
                        f"{int((cmp['check'] == 'met').sum())}/{len(cmp)}"
                        + (f" ({noise} within noise)" if noise else ""))
    if not ttft.empty:
        row.setdefault("device_name", ttft["device_name"].iloc[0])
        if "git_commit" in ttft:
            row["encoder_commit"] = ", ".join(sorted(set(ttft["git_commit"].astype(str))))
        t = ttft[(ttft["mode"] == "cudagraph") & (ttft["resolution"] == "1024x1024")]
        if t.empty:  # e.g. a CPU run: its first mode at its largest resolution
            t = ttft[ttft["mode"] == ttft["mode"].iloc[0]]
            t = t[t["resolution"] == t.loc[t["vit_tokens"].idxmax(), "resolution"]] \
                if "vit_tokens" in t else t[t["resolution"] == t["resolution"].iloc[0]]
        if not t.empty:
            n = t["images"].max()
            at = t[t["images"] == n].set_index("variant")["median_ms"]
            if {"native", "fused"} <= set(at.index):
                row["encoder_images"] = int(n)
                row["encoder_resolution"] = t["resolution"].iloc[0]
                row["encoder_native_ms"] = at["native"]
                row["encoder_fused_ms"] = at["fused"]
                if cpu:  # interpreter wall clock: a "saving" of -95% says nothing about a GPU
                    return row
                row["encoder_saving_ms"] = at["native"] - at["fused"]
                row["encoder_saving_pct"] = 100 * (at["native"] - at["fused"]) / at["native"]
                for v in catalogue.names("encoder", "engine"):  # the engines' RoPE in the encoder
                    if v in at.index:
                        row[f"encoder_saving_pct_{v}"] = 100 * (at["native"] - at[v]) / at["native"]
    return row


def committed_device_folders(data_root: Path) -> set[str] | None:
    """Names of the folders under ``data_root`` that hold files tracked by git (the
    results a clone carries, whatever local runs added); None without git."""
    import subprocess

    data_root = Path(data_root).resolve()
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=data_root,
                             capture_output=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {Path(p).parts[0] for p in out.decode().split("\0") if len(Path(p).parts) > 1}


def _device_filter(data_root: Path, device_folders: str) -> set[str] | None:
    if device_folders not in ("all", "committed"):
        raise ValueError(f"device_folders must be 'all' or 'committed', got {device_folders!r}")
    return committed_device_folders(data_root) if device_folders == "committed" else None


def all_devices(data_root: Path, device_folders: str = "all") -> pd.DataFrame:
    """One summary row per device folder under ``data_root``. ``device_folders``:
    "all" (every folder, local runs included) or "committed" (only folders git
    tracks: the same table on every clone, what nbval compares; every folder when
    the tree has no git)."""
    micro = load_device_tables(data_root, MICROBENCH_CSV, device_folders)
    from rope_kernels.encoder_parallel import kimi_encoder_rows, one_gpu_rows
    # Kimi's encoder on one GPU (the further towers' rows: notebook 04's "Other vision towers")
    ttft = kimi_encoder_rows(one_gpu_rows(load_device_tables(data_root, ENCODER_LATENCY_CSV, device_folders)))
    pr = read_table(PR_TABLE) if PR_TABLE.exists() else None
    folders = sorted(set(micro.get("device_folder", pd.Series(dtype=str)))
                     | set(ttft.get("device_folder", pd.Series(dtype=str))))
    rows = []
    for folder in folders:
        m = micro[micro["device_folder"] == folder] if not micro.empty else micro
        t = ttft[ttft["device_folder"] == folder] if not ttft.empty else ttft
        rows.append({"device": folder, **device_summary(m, t, pr), **target_counts(Path(data_root) / folder)})
    return pd.DataFrame(rows)


def target_counts(device_dir: Path) -> dict:
    """``targets``: how many of the study's targets each verdict holds on a device's
    rows (``rope_kernels.study.targets``), e.g. "3 met, 10 missed, 10 not measured"."""
    from rope_kernels.study import targets as T

    if not Path(device_dir).is_dir():
        return {}
    counts = T.summarize(T.evaluate(T.load_tables(device_dir)))["verdict"].value_counts()
    return {"targets": ", ".join(f"{int(counts[v])} {v}" for v in T.VERDICTS if v in counts)}


def tower_rows(micro: pd.DataFrame, mode: str = "cudagraph", dtype: str = "bfloat16") -> pd.DataFrame:
    """One row per device and tower (``towers.py``) at the tower's largest timed token
    count: its rotation and shape, our fused kernel's time and share of the same-bytes copy,
    and the best peer of the same kind (out of place against ``fused``, in place against
    ``fused_inplace``) with ``lead`` = its time over ours and ``lead_worst`` = its p20 over
    our p80 (> 1: ours ahead beyond the p20/p80 noise), ``trail_worst`` our p20 over its p80
    (> 1: the peer ahead beyond that noise). Kimi-K2.5's rows are the pairs rows
    at its 16 x 72 (rows from before the tower column name no tower)."""
    from rope_kernels.catalogue import names as catalogued
    from rope_kernels.towers import TOWERS

    cols = ["device_folder", "tower", "rotation", "tokens", "heads", "head_dim", "ours", "ours_us",
            "ours_pct_of_same_bytes_copy", "best_peer", "peer_us", "lead", "lead_worst", "trail_worst"]
    if micro.empty:
        return pd.DataFrame(columns=cols)
    g = micro[(micro["mode"] == mode) & (micro["dtype"] == dtype)].copy()
    g["rotation"] = g["rotation"].fillna("pairs") if "rotation" in g else "pairs"
    g["tower"] = g["tower"].fillna("") if "tower" in g else ""
    kimi = TOWERS["kimi_k25"]
    untagged = (g["tower"] == "") & (g["rotation"] == kimi.rotation) & (g["heads"] == kimi.heads) \
        & (g["head_dim"] == kimi.head_dim)
    g.loc[untagged, "tower"] = kimi.name
    peers = set(catalogued("rope", peer=True))
    folders = g["device_folder"] if "device_folder" in g else pd.Series("", index=g.index)
    g["device_folder"] = folders
    rows = []
    for (folder, tower), t in g[g["tower"].isin(list(TOWERS))].groupby(["device_folder", "tower"]):
        at = t[t["tokens"] == t["tokens"].max()]
        for ours in ("fused", "fused_inplace"):
            mine = at[at["variant"] == ours]
            if mine.empty:
                continue
            me = mine.iloc[0]
            rivals = at[at["variant"].isin(peers)
                        & (at["in_place"].astype(str) == str(ours == "fused_inplace"))]
            best = rivals.loc[rivals["median_us"].idxmin()] if len(rivals) else None
            rows.append({"device_folder": folder, "tower": tower, "rotation": me["rotation"],
                         "tokens": int(me["tokens"]), "heads": int(me["heads"]),
                         "head_dim": int(me["head_dim"]), "ours": ours, "ours_us": me["median_us"],
                         "ours_pct_of_same_bytes_copy": me.get("pct_of_same_bytes_copy", float("nan")),
                         "best_peer": best["variant"] if best is not None else "",
                         "peer_us": best["median_us"] if best is not None else float("nan"),
                         "lead": best["median_us"] / me["median_us"] if best is not None else float("nan"),
                         "lead_worst": best["p20_us"] / me["p80_us"] if best is not None else float("nan"),
                         # > 1: the peer ahead of ours beyond the p20/p80 noise
                         "trail_worst": me["p20_us"] / best["p80_us"] if best is not None else float("nan")})
    return pd.DataFrame(rows, columns=cols)
