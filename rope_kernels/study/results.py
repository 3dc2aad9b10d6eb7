"""Result files that are never lost or half-written.

- Writes go to a temporary file in the same folder, are flushed to disk, then
  renamed over the target (``os.replace`` is atomic on POSIX): a reader sees
  the old file or the new one, never a torn one, even if the run dies midway.
- Re-runs upsert rows by key (variant, shape, dtype, mode, device): a row
  measured again replaces its old self, every other row stays.
- An exclusive lock on ``<file>.lock`` serialises concurrent runs writing to
  the same folder, so two read-modify-write cycles cannot interleave.
- Before any upsert the file on disk is checked against the rows being written
  (their columns and types are the schema: the code that writes declares it):
  a header that differs (a renamed, unknown or missing column), a line with the
  wrong number of fields or a value of the wrong type, a repeated header or a
  truncated last line is a ``ResultFileError`` naming the file and line, and
  nothing is rewritten. A deliberate change of columns is declared once, in
  ``specs.RESULT_FILES`` (``renamed`` / ``added`` / ``dropped``), and older files
  are migrated by it; so is a renamed file (``formerly``: the first upsert under
  the new name takes the old file's rows and removes it).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

# Atomic replacement (and its refusals) has one home, shared with bench/ and peers/.
from rope_kernels.atomic_io import (  # noqa: F401
    ResultFileError,
    check_replaceable,
    read_regular_file,
    write_atomic,
)

# Every result file's key and declared migrations live in the notebook specs.
from rope_kernels.study.specs import (  # noqa: F401
    ENCODER_LATENCY_KEY,
    MICROBENCH_KEY,
    MODELLED_TTFT_COLUMNS,
    PEER_COLUMNS,
    QKV_KEY,
    RESULT_FILES as TABLES,
    SPECS,
    Table,
)


# Columns that are text whatever they look like: a commit like 73e709120104 reads as
# the float 7.3e709120105 (inf) and a version like 3.10 as 3.1 if pandas guesses.
TEXT_COLUMNS = ("git_commit", "peer_package", "peer_version", "peer_sha256", "torch_version",
                "triton_version", "python_version", "config", "same_bytes_copy_tiling",
                "order_seed", "round_positions")


def read_table(path, required: Sequence[str] = ()) -> pd.DataFrame:
    """A result CSV for reading (summaries, targets, findings, the index, submit):
    ``TEXT_COLUMNS`` as text, the rest as pandas infers it, older column names as
    ``TABLES`` renames them, resolutions in their one spelling.

    The one checked reader: an empty or unreadable file, a malformed or unterminated
    line, a missing column of ``required``, or two rows under one key
    (a reader would mix them) is a one-line ``ResultFileError`` naming the file."""
    path = Path(path)
    text = _checked_text(path)
    table = table_for(path.name)
    try:
        df = pd.read_csv(io.StringIO(text), dtype={c: str for c in TEXT_COLUMNS})
    except (ValueError, pd.errors.ParserError) as exc:
        raise ResultFileError(f"{path}: not a readable CSV ({exc})") from None
    if table is not None:
        df = df.rename(columns={o: n for o, n in table.renamed.items()
                                if o in df.columns and n not in df.columns})
        # a key column added since the file was written, whose old value its rows give
        # (encoder_parallel: "1gpu"): readers select by the key, so it is filled here
        for col in table.key:
            if col not in df.columns and col in table.derived and len(df):
                df[col] = table.derived[col](df)
    if "resolution" in df.columns:
        df["resolution"] = df["resolution"].map(_one_spelling)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ResultFileError(f"{path}: lacks column(s) {missing} that its rows need; "
                              "was it written by this study?")
    # the key's columns the file holds (a reader's own file may carry fewer)
    key = [c for c in (table.key if table is not None else ()) if c in df.columns]
    repeated = df.duplicated(subset=key, keep=False) if key and len(df) else None
    if repeated is not None and repeated.any():
        lines = [i + 2 for i in df.index[repeated]][:6]
        raise ResultFileError(f"{path}: lines {lines} repeat a key ({', '.join(key)}): "
                              "which row holds the measurement is ambiguous; remove the "
                              "stale rows (resolutions are compared in one spelling)")
    return df


def _one_spelling(value):
    from rope_kernels.vocabulary import resolution_text

    try:
        return resolution_text(value)
    except (TypeError, ValueError):
        return value


def _check_line(path: Path, number: int, fields: list[str], header: list[str]) -> None:
    """Refuse data line ``number`` when it is the header again or holds another number of
    fields than the header (a malformed or truncated line)."""
    if fields == header:
        raise ResultFileError(f"{path}:{number}: the header is repeated mid-file")
    if len(fields) != len(header):
        raise ResultFileError(f"{path}:{number}: {len(fields)} fields where the header "
                              f"has {len(header)} (malformed or truncated line)")


def _checked_text(path: Path) -> str:
    """The text of a result CSV whose every line parses into the header's fields."""
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such result file") from None
    except OSError as exc:
        raise ResultFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{path}: not UTF-8 text ({exc})") from None
    if not text.strip():
        raise ResultFileError(f"{path}: the file is empty (not even a header); delete it "
                              "or re-run the notebook that writes it")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        lines = list(reader)
    except csv.Error as exc:
        raise ResultFileError(f"{path}:{reader.line_num}: not a well-formed CSV line "
                              f"({exc})") from None
    header = lines[0]
    if len(set(header)) != len(header):
        raise ResultFileError(f"{path}:1: the header repeats a column")
    if not text.endswith("\n"):
        raise ResultFileError(f"{path}:{len(lines)}: the last line is not terminated: "
                              "the file was truncated")
    for number, fields in enumerate(lines[1:], start=2):
        _check_line(path, number, fields, header)
    return text


def table_for(name: str) -> Table | None:
    """The ``TABLES`` entry of a result file's name, or of the file it was once
    called (``Table.formerly``); None for a file not declared there."""
    if name in TABLES:
        return TABLES[name]
    return next((t for t in TABLES.values() if name in t.formerly), None)


def current_file(path: Path) -> Path | None:
    """``path`` if it exists, else the existing file it was formerly called in the
    same folder (``Table.formerly``), else None: where a reader finds a table's rows
    before the next upsert moves them."""
    path = Path(path)
    if path.exists():
        return path
    table = TABLES.get(path.name)
    for name in (table.formerly if table else ()):
        if path.with_name(name).exists():
            return path.with_name(name)
    return None


def _lock_file(path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(path.name + ".lock")


def _flock_within(fh, operation: int, lock_path: Path, timeout_s: float) -> None:
    """Take ``operation`` (LOCK_EX or LOCK_SH) on ``fh``, polling until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fh.fileno(), operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock_path} is held by another run for over {timeout_s} s")
            time.sleep(0.05)


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float = 600.0):
    """Exclusive advisory lock on ``<path>.lock`` for the duration of the block."""
    lock_path = _lock_file(path)
    with open(lock_path, "a+") as fh:
        _flock_within(fh, fcntl.LOCK_EX, lock_path, timeout_s)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def run_lock(path: Path, timeout_s: float = 600.0, *, when_alone=None):
    """A lock on a device folder held for a whole study run.

    Several runs may share a device folder (a Slurm job array's tasks): each
    result file has its own exclusive lock and reports are replaced atomically,
    so runs hold the folder lock shared. A run that finds nobody else gets it
    exclusive first and calls ``when_alone()`` (cleaning up what killed runs
    left, which must not touch a live run's files), then downgrades to shared."""
    lock_path = _lock_file(path)
    with open(lock_path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        if alone:
            try:
                if when_alone is not None:
                    when_alone()
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH)  # downgrade: others may join now
        else:
            _flock_within(fh, fcntl.LOCK_SH, lock_path, timeout_s)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def check_writable_folder(folder: Path) -> None:
    """Make ``folder`` if needed and prove a file can be created in it; else a one-line
    ``ResultFileError`` (before a run spends time on results it cannot keep)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ResultFileError(f"cannot write to {folder}: {exc.strerror or exc}; nothing was "
                              "run (make the folder writable, or run from a checkout you "
                              "own)") from None


def check_result_files(folder: Path, names: Sequence[str]) -> None:
    """Before a run measures anything: each result file it will upsert into ``folder``
    (``names``, and the names they were formerly called) that already holds bytes must be
    one it can merge, a well-formed CSV whose lines all end and hold the header's fields,
    in a regular file it may replace; else the one-line ``ResultFileError`` the write
    would raise after the measurements. The columns are checked at the write, against
    the rows written."""
    for name in names:
        table = TABLES.get(name)
        for path in (Path(folder) / n for n in (name, *(table.formerly if table else ()))):
            check_replaceable(path)
            if path.exists() and path.stat().st_size > 0:
                try:
                    _checked_text(path)
                except ResultFileError as exc:
                    raise ResultFileError(f"{exc}; nothing was run (repair or move the file; "
                                          "the run would upsert its rows there)") from None


def upsert_csv(path: Path, rows: pd.DataFrame | Sequence[dict],
               key: Sequence[str] | None = None) -> pd.DataFrame:
    """Merge ``rows`` into the CSV at ``path`` by ``key`` (``TABLES``' key for the
    file's name by default); returns the merged table. The file on disk is checked
    against the rows first (``read_results``): on any mismatch nothing is written."""
    path = Path(path)
    new = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    table = TABLES.get(path.name)
    if key is None:
        if table is None:
            raise ValueError(f"{path.name} is not in specs.RESULT_FILES; pass its key")
        key = table.key
    elif table is not None and tuple(key) != table.key:
        raise ValueError(f"key {list(key)} for {path.name} differs from specs.RESULT_FILES' "
                         f"{list(table.key)}")
    key = list(key)
    if table is not None and len(new):  # a key column added since (encoder_parallel, rotation, encoder): as old rows get it
        for k in key:
            if k not in new.columns and k in table.derived:
                new = new.assign(**{k: table.derived[k](new)})
    missing = [k for k in key if k not in new.columns]
    if missing:
        raise ValueError(f"rows lack key column(s) {missing} for {path.name}")
    if new.empty:
        raise ValueError(f"no rows to write to {path}")
    if new.columns.duplicated().any():
        raise ValueError(f"rows for {path.name} repeat column(s) "
                         f"{sorted(set(new.columns[new.columns.duplicated()]))}")
    former = [path.with_name(n) for n in (table.formerly if table else ())]
    for p in [path, *former]:
        check_replaceable(p)
    with contextlib.ExitStack() as locks:
        for p in [path, *former]:
            locks.enter_context(file_lock(p))
        schema = new.dtypes.to_dict()
        # a former file's rows first: rows already under the current name are newer
        olds = [read_results(p, schema, table=table) for p in [*former, path]]
        merged = pd.concat([*(o for o in olds if o is not None), new], ignore_index=True)
        merged = merged[list(new.columns)]
        merged = merged.drop_duplicates(subset=key, keep="last").reset_index(drop=True)
        write_atomic(path, merged.to_csv(index=False))
        for p in former:  # its rows are in the file just written
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return merged


_INT = re.compile(r"[-+]?\d+")
_BOOL = {"True", "False"}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _kind(dtype) -> str:
    kind = getattr(dtype, "kind", "O")
    return {"i": "int", "u": "int", "f": "float", "b": "bool"}.get(kind, "text")


def _value_ok(text: str, kind: str) -> bool:
    if kind == "int":  # and within int64, the type the column is read as
        return bool(_INT.fullmatch(text)) and _INT64_MIN <= int(text) <= _INT64_MAX
    if kind == "float":
        if text == "":
            return True
        try:
            float(text)
        except ValueError:
            return False
        return True
    if kind == "bool":
        return text in _BOOL
    return True


def read_results(path: Path, schema: dict[str, object],
                 table: Table | None = None) -> pd.DataFrame | None:
    """The rows of the result CSV at ``path`` (None when it is absent or empty),
    checked against ``schema`` (column -> dtype of the rows being written) and
    migrated by ``table`` (default: ``TABLES``' declarations for its name, or for
    the name that replaced it). Raises ``ResultFileError``
    naming the file and line of the first problem."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return None
    text = path.read_bytes()
    try:
        text = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{path}: not UTF-8 text ({exc})") from None
    table = table or table_for(path.name) or Table(())
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        lines = list(reader)
    except csv.Error as exc:  # e.g. a quote never closed: the rest of the file is one field
        raise ResultFileError(f"{path}:{reader.line_num}: not a well-formed CSV line ({exc}); "
                              "nothing was written") from None
    header = lines[0]
    columns = [table.renamed.get(c, c) if table.renamed.get(c) in schema and c not in schema
               else c for c in header]
    if len(set(columns)) != len(columns):
        raise ResultFileError(f"{path}:1: the header repeats a column: {header}")
    added = [c for c in table.added if c in schema and c not in columns]
    dropped = [c for c in columns if c in table.dropped and c not in schema]
    unknown = [c for c in columns if c not in schema and c not in dropped]
    lacking = [c for c in schema if c not in columns and c not in added]
    if unknown or lacking:
        raise ResultFileError(
            f"{path}:1: the header does not match the rows this code writes"
            + (f"; columns only in the file: {unknown}" if unknown else "")
            + (f"; columns the file lacks: {lacking}" if lacking else "")
            + ". Nothing was written. If the columns changed on purpose, declare the "
            "rename or addition in rope_kernels/study/specs.py RESULT_FILES so old rows migrate.")
    if not text.endswith("\n"):
        raise ResultFileError(f"{path}:{len(lines)}: the last line is not terminated: "
                              "the file was truncated; nothing was written")
    kinds = [_kind(schema[c]) if c in schema else "text" for c in columns]
    for number, fields in enumerate(lines[1:], start=2):
        _check_line(path, number, fields, header)
        for name, kind, value in zip(columns, kinds, fields):
            # rows from before a declared added column hold it empty, whatever its type
            if not (_value_ok(value, kind) or (value == "" and name in table.added)):
                raise ResultFileError(f"{path}:{number}: column {name!r} holds {value!r}, "
                                      f"not {kind} like the rows being written")
    # Text is kept as written ('NA', 'null', 'None' are values, not missing); only an
    # empty numeric or bool field is missing, read into a type that writes back the same.
    try:
        old = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (ValueError, pd.errors.ParserError) as exc:  # what the line checks above missed
        raise ResultFileError(f"{path}: not a well-formed CSV ({exc}); nothing was "
                              "written") from None
    old.columns = columns
    for name, kind in zip(columns, kinds):
        if kind != "text":  # the values were checked above: these conversions cannot fail
            old[name] = _from_text(old[name], kind, name in table.added)
    old = old.drop(columns=dropped)
    for name in added:
        if name in table.derived:
            old[name] = table.derived[name](old)
            continue
        dtype = _read_dtype(_kind(schema[name]), True)
        missing = float("nan") if dtype == "float64" else pd.NA  # float64 holds no pd.NA
        old[name] = pd.Series([missing] * len(old), dtype=dtype)
    for name, values in table.recoded.items():
        if name in old.columns:
            old[name] = old[name].replace(values)
    return old


def _from_text(values: pd.Series, kind: str, may_be_empty: bool) -> pd.Series:
    """A checked column of CSV text as the type it is written from."""
    dtype = _read_dtype(kind, may_be_empty)
    if kind == "float":
        return values.replace("", "nan").astype(dtype)
    if kind == "bool":
        return values.map({"True": True, "False": False, "": pd.NA}).astype(dtype)
    return values.replace("", None).astype(dtype)


def _read_dtype(kind: str, may_be_empty: bool):
    """The pandas type a column of ``kind`` is read as: one whose missing values write
    back as empty fields and whose values write back as they were (an int column
    read as float would come back as '3.0')."""
    if kind == "int":
        return "Int64" if may_be_empty else "int64"
    if kind == "bool":
        return "boolean" if may_be_empty else bool
    if kind == "float":
        return "float64"
    return str


# mkstemp's names: ".<prefix>" + 8 characters of [a-z0-9_] + "<suffix>"
_STALE_TEMP = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.(?P<ext>tmp|ipynb)$")
# what write_atomic replaces in the swept folders: results, reports, traces
_WRITTEN_SUFFIXES = (".csv", ".ipynb", ".html", ".json.gz", ".json")


def _is_our_temp(name: str) -> bool:
    """A temporary file this code makes, by its whole name: ``.NAME.XXXXXXXX.tmp`` of
    ``write_atomic`` for a NAME it writes, or ``.NOTEBOOK.XXXXXXXX.ipynb`` of the runner
    for a study notebook; a user's hidden file (``.my.notes.ipynb``) is not one."""
    m = _STALE_TEMP.match(name)
    if not m:
        return False
    if m["ext"] == "ipynb":
        return m["name"] in SPECS
    return m["name"].endswith(_WRITTEN_SUFFIXES)


def sweep_temp_files(folder: Path, older_than_s: float = 60.0) -> list[Path]:
    """Remove temporary files a killed run left in ``folder`` (``.NAME.XXXXXXXX.tmp``
    from ``write_atomic``, ``.NOTEBOOK.XXXXXXXX.ipynb`` from the runner: ``_is_our_temp``).
    Only files older than ``older_than_s`` go, so another writer's file in flight is
    left alone; any other file stays, hidden or not."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    now = time.time()
    removed = []
    for p in folder.iterdir():
        if _is_our_temp(p.name) and p.is_file() and not p.is_symlink() \
                and now - p.stat().st_mtime > older_than_s:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return sorted(removed)
