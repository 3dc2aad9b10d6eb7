"""Every result file's older forms, as committed in this repository's history, are
upgraded by the next write rather than refused (issue 36 item 9).

The headers below were read from ``git log -- data/nvidia-h200/*.csv`` (one entry per
distinct header a commit wrote; f826a53, 88edead and 691d48a among them). Each old
file is rebuilt from the committed file's rows projected onto the old header, then
one current row is upserted into it: every old row must survive the migration."""

import csv
import io

import pandas as pd
import pytest

from rope_kernels.provenance import REPO_ROOT
from rope_kernels.study import results

DATA = REPO_ROOT / "data" / "nvidia-h200"


def _current(name: str):
    """The committed file with today's rows: the QKV sweep the defaults cite lives with the
    exploration data (data/exploration/), the rest in the device folder."""
    return DATA / name if (DATA / name).exists() else REPO_ROOT / "data" / "exploration" / "nvidia-h200" / name
_PROV = "device_name,device_kind,torch_version,triton_version,python_version,git_commit,timestamp"
_PAIRED = ("paired_saving_pct,paired_saving_pct_p20,paired_saving_pct_p80,paired_rope_cost_ms,"
           "paired_rope_cost_ms_p20,paired_rope_cost_ms_p80")
_TTFT = ("variant,resolution,images,vit_tokens,llm_tokens,mode,attention_kernel,timer,median_ms,"
         "p20_ms,p80_ms,samples,rope_share,copy_gbps,peak_mem_mb,layers,encoder," + _PROV)
_MB = ("variant,tokens,heads,head_dim,dtype,mode,timer,median_us,p20_us,p80_us,samples,"
       "calls_per_sample,input_sets,")
_QKV = ("variant,tokens,hidden,heads,head_dim,dtype,mode,config,timer,median_us,p20_us,p80_us,"
        "samples,flops,tflops,ratio_to_cublas,ratio_to_cublas_fused_rope,reference,max_abs_err,"
        "native_max_abs_err,error_tolerance,matches_float64,note,")

# (file written then, file it is now): old headers
OLD_HEADERS = {
    ("correctness.csv", "correctness.csv"): [
        # f826a53, 88edead, 691d48a: before supported/reason and the peer columns
        "variant,tokens,heads,head_dim,dtype,packed,max_abs_err,rel_err,native_max_abs_err,"
        "tolerance,inputs_intact,passed," + _PROV,
        # before the seed column
        "variant,tokens,heads,head_dim,dtype,packed,max_abs_err,rel_err,native_max_abs_err,"
        "tolerance,inputs_intact,passed,supported,reason,peer_package,peer_version,peer_sha256,"
        + _PROV,
    ],
    ("launches.csv", "launches.csv"): [
        # study_facts, since renamed derived_from_code; no peer columns
        "variant,launches_per_call,recorded,study_facts,per_forward,source,tokens,heads,head_dim,"
        "dtype,layers," + _PROV,
    ],
    ("ttft.csv", "encoder_latency.csv"): [
        _TTFT,                                   # f826a53, 691d48a
        _TTFT + "," + _PAIRED,                   # 88edead
        _TTFT + "," + _PAIRED + ",rope_device_ms",
        "variant,resolution,images,vit_tokens,llm_tokens,mode,attention_kernel,timer,median_ms,"
        "p20_ms,p80_ms,samples,round_positions,order_seed,profiled_rope_share,"
        "profiled_rope_device_ms,profiled_peak_mem_mb,copy_gbps,layers,encoder,peer_package,"
        "peer_version,peer_sha256," + _PAIRED + "," + _PROV,
    ],
    ("microbench.csv", "microbench.csv"): [
        _MB + "bytes,gbps,pct_of_copy,copy_gbps,copy_same_bytes_us,pct_of_copy_same_bytes,"
        "launches,peak_mem_mb,speedup_vs_native," + _PROV,
        _MB + "rounds,round_positions,order_seed,bytes,gbps,pct_of_copy,copy_gbps,"
        "copy_same_bytes_us,pct_of_copy_same_bytes,launches,peak_mem_mb,peer_package,"
        "peer_version,peer_sha256,speedup_vs_native," + _PROV,
        _MB + "rounds,round_positions,order_seed,bytes,gbps,pct_of_copy,copy_gbps,in_place,"
        "same_bytes_copy_us,pct_of_same_bytes_copy,launches,peak_mem_mb,peer_package,"
        "peer_version,peer_sha256,speedup_vs_native," + _PROV,
        _MB + "rounds,round_positions,order_seed,bytes,gbps,pct_of_copy,copy_gbps,in_place,"
        "same_bytes_copy_us,same_bytes_copy_tiling,pct_of_same_bytes_copy,launches,peak_mem_mb,"
        "peer_package,peer_version,peer_sha256,speedup_vs_native," + _PROV,
    ],
    ("fused_configs.csv", "fused_configs.csv"): [
        "tokens,heads,head_dim,dtype,mode,block_t,block_h,num_warps,is_default,timer,median_us,"
        "p20_us,p80_us,gbps,pct_of_copy,copy_gbps," + _PROV,
        "tokens,heads,head_dim,dtype,mode,strategy,block_t,block_h,num_warps,programs_per_sm,"
        "is_default,in_place,timer,median_us,p20_us,p80_us,gbps,pct_of_copy,copy_gbps," + _PROV,
    ],
    ("qkv_gemm.csv", "qkv_gemm.csv"): [_QKV + _PROV],
    ("qkv_gemm_sweep.csv", "qkv_gemm_sweep.csv"): [_QKV + _PROV],
}

CASES = [(old, now, header) for (old, now), headers in OLD_HEADERS.items() for header in headers]


def _old_file(now: str, header: str) -> tuple[str, int]:
    """The committed rows of ``now`` as a file with ``header`` (values by the current
    column, through the declared renames; a column since dropped holds a number), and
    how many distinct keys they hold."""
    table = results.TABLES[now]
    rows = pd.read_csv(_current(now), dtype=str, keep_default_na=False)
    names = header.split(",")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for _, r in rows.iterrows():
        writer.writerow([r[table.renamed.get(n, n)] if table.renamed.get(n, n) in r.index
                         else "1.5" for n in names])
    # an old header may lack a key column (a derived one): its rows then share keys
    present = [k for k in table.key if k in {table.renamed.get(n, n) for n in names}]
    return out.getvalue(), len(rows.drop_duplicates(subset=present))


@pytest.mark.parametrize("old,now,header", CASES,
                         ids=[f"{now}-{i}" for i, (_, now, _) in enumerate(CASES)])
def test_an_older_result_file_is_upgraded_by_the_next_write(tmp_path, old, now, header):
    text, n = _old_file(now, header)
    (tmp_path / old).write_text(text)
    current = results.read_table(_current(now))
    # a key column added since the committed file was written (rotation, issue 43): today's
    # rows carry it, with the value its declared migration gives the committed rows
    for column, derive in results.TABLES[now].derived.items():
        if column in results.TABLES[now].key and column not in current.columns:
            current[column] = derive(current)
    new = current.iloc[[0]].copy()
    key = list(results.TABLES[now].key)
    # a row under a key no old row has: every old row must be kept beside it
    first = key[0]
    new[first] = (("a-new-" + new[first].astype(str)) if pd.api.types.is_string_dtype(new[first])
                  else new[first] + 1000)
    merged = results.upsert_csv(tmp_path / now, new)
    assert len(merged) == n + 1
    assert list(pd.read_csv(tmp_path / now, nrows=0).columns) == list(current.columns)
    # the upgraded file is accepted by the write after
    assert len(results.upsert_csv(tmp_path / now, new)) == n + 1
