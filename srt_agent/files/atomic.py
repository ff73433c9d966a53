"""Atomic writes: a file or a folder appears whole under its name, or not at all.

Everything is written next to the target under a temporary name, flushed, and renamed into place (a
rename within one filesystem is atomic). An interrupted write leaves the previous version as it was;
a file writer killed outright leaves only its temporary file (``name.PID.*.tmp``), which the next
write to the same path removes.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[BinaryIO], None]) -> None:
    """Write `data` (text, bytes, or a function that writes into the open binary file) to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_writers_files(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_folder(target: str | os.PathLike, replace: bool = True, fsync: bool = False) -> Iterator[Path]:
    """A fresh temporary folder next to `target` to fill; when the block ends without an error it becomes
    `target`, else it is removed.

    `replace`: a `target` that exists is replaced; otherwise a `target` that appeared in the meantime (a
    concurrent writer finished first) is kept and this one dropped. `fsync`: flush every file before the
    rename.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if fsync:
            for file in tmp.iterdir():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        if replace and target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if replace or not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_dead_writers_files(path: Path) -> None:
    """Delete `path`'s temp files (``name.PID.*.tmp``) whose writing process no longer exists."""
    for tmp in path.parent.glob(f"{glob.escape(path.name)}.*.tmp"):
        pid = tmp.name[len(path.name) + 1 :].split(".", 1)[0]
        if pid.isdigit() and not _process_exists(int(pid)):
            tmp.unlink(missing_ok=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True
