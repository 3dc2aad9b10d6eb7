"""Result files that are never lost or half-written.

- Writes go to a temporary file in the same folder, are flushed to disk, then
  renamed over the target (``os.replace`` is atomic on POSIX): a reader sees
  the old file or the new one, never a torn one, even if the run dies midway.
- Re-runs upsert rows by key (variant, shape, dtype, mode, device): a row
  measured again replaces its old self, every other row stays.
- An exclusive lock on ``<file>.lock`` serialises concurrent runs writing to
  the same folder, so two read-modify-write cycles cannot interleave.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

MICROBENCH_KEY = ("variant", "tokens", "heads", "head_dim", "dtype", "mode", "device_name")
TTFT_KEY = ("variant", "resolution", "images", "mode", "device_name")


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float = 600.0):
    """Exclusive advisory lock on ``<path>.lock`` for the duration of the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{lock_path} is held by another run for over {timeout_s} s")
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` atomically (temp file + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are shared files
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def upsert_csv(path: Path, rows: pd.DataFrame | Sequence[dict], key: Sequence[str]) -> pd.DataFrame:
    """Merge ``rows`` into the CSV at ``path`` by ``key``; returns the merged table."""
    path = Path(path)
    new = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    key = list(key)
    missing = [k for k in key if k not in new.columns]
    if missing:
        raise ValueError(f"rows lack key column(s) {missing} for {path.name}")
    if new.empty:
        raise ValueError(f"no rows to write to {path}")
    with file_lock(path):
        if path.exists() and path.stat().st_size > 0:
            old = pd.read_csv(path)
            merged = pd.concat([old, new], ignore_index=True)
        else:
            merged = new.copy()
        merged = merged.drop_duplicates(subset=key, keep="last").reset_index(drop=True)
        write_atomic(path, merged.to_csv(index=False))
    return merged
