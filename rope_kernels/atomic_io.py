"""Files replaced atomically, never half-written: the one home of ``write_atomic``
(results, reports, traces, the compile matrix, the peer cache and Slurm state all
write through it).

A write goes to a temporary file in the same folder, is flushed to disk, then
renamed over the target (``os.replace`` is atomic on POSIX): a reader sees the
old file or the new one, never a torn one, even if the process dies midway. What a
rename would silently break (a symbolic link, a file with other hard links, a
read-only file) is refused with one line instead.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


class ResultFileError(ValueError):
    """A result file that cannot be merged safely; nothing was written."""


def check_replaceable(path: Path) -> None:
    """Refuse to replace what a rename would silently break: a symbolic link or a
    file with other hard links (the rename would put a new file in its place and
    leave the target, or the other names, with the old content) or a file made
    read-only (someone protected it)."""
    path = Path(path)
    if path.is_symlink():
        raise ResultFileError(f"{path} is a symbolic link (to {os.readlink(path)}); results "
                              "are written to regular files only: replace the link with the "
                              "file, or write to the target's folder")
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise ResultFileError(f"{path} is not a regular file; nothing was written")
    if st.st_nlink > 1:
        raise ResultFileError(f"{path} has {st.st_nlink} hard links: replacing it would leave "
                              "the other names with the old content; nothing was written "
                              "(copy it to a file of its own)")
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK):
        raise ResultFileError(f"{path} is read-only; nothing was written (make it writable "
                              "to replace it)")


def read_regular_file(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file; a named pipe (whose read would
    wait forever for a writer), a device, a socket or a folder is a one-line
    ``ResultFileError``. O_NONBLOCK makes opening a pipe return at once."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ResultFileError(f"{path} is not a regular file (a pipe, device or folder); "
                                  "nothing was read")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = -1  # the file object closes it
            return fh.read()
    finally:
        if fd >= 0:
            os.close(fd)


def write_atomic(path: Path, data: str | bytes, *, through_link: bool = False,
                 keep_mode: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically (temp file + fsync + rename); a
    symbolic link or read-only file at ``path`` is refused (:func:`check_replaceable`).

    For a file a person owns (README.md): ``through_link`` replaces a symbolic link's
    target instead of refusing the link (the link stays a link), ``keep_mode`` gives
    the new file the old one's permission bits (else the umask's)."""
    path = Path(path)
    if through_link and path.is_symlink():
        try:
            path = path.resolve(strict=True)
        except (FileNotFoundError, RuntimeError) as exc:  # dangling or a loop
            raise ResultFileError(f"{path} is a symbolic link to nothing readable "
                                  f"({os.readlink(path)}): {exc}; nothing was written") from None
    check_replaceable(path)
    old_mode = None
    if keep_mode:
        with contextlib.suppress(FileNotFoundError):
            old_mode = stat.S_IMODE(path.stat().st_mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes 0600; results are shared files
        os.chmod(tmp, old_mode if old_mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
