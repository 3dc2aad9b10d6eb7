"""The distributed runner (issue 45) on a CPU: gloo, 2 processes. Its tp forward (each rank its
slice of one encoder's weights, two all-reduces a layer) and its dp forward (each rank its images,
one all-gather) give the whole encoder's output, and the rows carry the measured collectives."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rope_kernels.encoder_config import EncoderConfig

ROOT = Path(__file__).resolve().parents[1]
CFG = EncoderConfig(hidden=128, heads=8, layers=2, mlp=64, text_hidden=48, pos_grid=8)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, mode, grids, out):
    from rope_kernels.bench import distributed_encoder as de
    from rope_kernels.model.vit import MoonViTEncoder, encoder_inputs

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        full = MoonViTEncoder(CFG, dtype=torch.float32, seed=3)
        inp = encoder_inputs(grids, CFG, dtype=torch.float32, seed=5)
        model = de.shard_encoder(full, mode, rank, world)
        clock = de._Clock(False)
        got = de.distributed_forward(model, list(inp.grids), inp.patches, mode, "native", "sdpa_per_image", clock)
        comm = clock.take_ms()
        if rank == 0:
            want = full(inp.patches, inp.grids, rope="native", attention="sdpa_per_image")
            torch.save({"got": got, "want": want, "comm_ms": comm,
                        "shard_qkv": tuple(model.blocks[0].wqkv.weight.shape)}, out)
        dist.barrier()  # neither rank tears its gloo pairs down while the other still works
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode, grids", [("tp", [(1, 4, 4), (1, 2, 4)]), ("dp", [(1, 4, 4), (1, 2, 4), (1, 2, 2)])])
def test_the_modes_over_two_processes_give_the_whole_encoders_output(tmp_path, mode, grids):
    out = tmp_path / "out.pt"
    mp.spawn(_worker, args=(2, _port(), mode, grids, str(out)), nprocs=2, join=True)
    r = torch.load(out)
    assert r["got"].shape == r["want"].shape
    torch.testing.assert_close(r["got"], r["want"], rtol=1e-4, atol=1e-5)
    assert r["comm_ms"] > 0  # the collectives ran and were timed
    # tp: this rank's QKV is the shard's (3 x 4 of 8 heads x 16), as layer_gemms gives for 2 GPUs
    assert r["shard_qkv"] == ((3 * 64, 128) if mode == "tp" else (3 * 128, 128))


def test_a_bad_mode_or_rank_is_refused():
    from rope_kernels.bench import distributed_encoder as de
    from rope_kernels.model.vit import MoonViTEncoder

    full = MoonViTEncoder(CFG, dtype=torch.float32)
    with pytest.raises(ValueError, match="tp, dp"):
        de.shard_encoder(full, "ep", 0, 2)
    with pytest.raises(ValueError, match="rank"):
        de.shard_encoder(full, "tp", 2, 2)
    assert de._my_images(3, 0, 2) == (0, 2) and de._my_images(3, 1, 2) == (2, 1) and de._my_images(1, 1, 2) == (1, 0)


def test_the_entry_point_runs_under_torchrun(tmp_path):
    """``torchrun --nproc-per-node 2 -m rope_kernels.bench.distributed_encoder`` on the CPU (gloo)."""
    out = tmp_path / "rows.csv"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(_port()), "-m", "rope_kernels.bench.distributed_encoder",
                           "--mode", "tp", "--encoder", "small", "--images", "1", "--samples", "2",
                           "--dtype", "float32", "--variants", "native", "none", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_csv(out)
    assert set(rows.encoder_parallel) == {"tp2"} and set(rows.world_size) == {2}
    assert set(rows.variant) == {"native", "none"} and (rows.comm_ms > 0).all() and (rows.median_ms > 0).all()
    assert rows.comm_model.str.startswith("measured").all() and set(rows.backend) == {"gloo"}
    assert subprocess.run([sys.executable, "-m", "rope_kernels.bench.distributed_encoder", "--mode", "tp"],
                          env=env, capture_output=True, text=True, cwd=ROOT).returncode == 2  # not under torchrun
