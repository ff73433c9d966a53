"""Files a run is given and gives back (SandboxFusion's `files` and `fetch_files`).

Names are paths relative to the run's private working directory (`/tmp` in the sandbox, a fresh
size-capped tmpfs), or absolute paths under it or under `/mnt` (SandboxFusion's own tests write there; a
run whose files name `/mnt` gets it as a link to `/tmp/.mnt`, so it shares the working directory's size
cap). Anything else, `..` that climbs out included, is refused with a ValueError that says why.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import posixpath
from collections.abc import Iterable, Mapping

WORKDIR = "/tmp"
SCRATCH = "/mnt"
SCRATCH_IN_WORKDIR = ".mnt"
MAX_FILES = 256
SKIPPED_MARK = "IGNORE_THIS_FILE"  # SandboxFusion skips `files` entries whose name holds this

# Runs inside the sandbox when files are to be fetched: runs the program (argv[4:]) as its child, then
# writes the fetched files, base64 in one JSON object, to fd argv[1] (up to argv[2] bytes in all) and
# exits as the program did (128 + N after a death by signal N, as bubblewrap reports it).
COLLECTOR = """\
import base64, json, os, stat, sys
out, limit, names = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
pid = os.fork()
if pid == 0:
    os.close(out)
    try:
        os.execv(sys.argv[4], sys.argv[4:])
    finally:
        os._exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
found, total = {}, 0
for name, path in names:
    chunks, want = [], limit - total + 1
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO left in place must not block
    except OSError:
        continue
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            continue
        while want > 0 and (chunk := os.read(fd, min(want, 1 << 20))):
            chunks.append(chunk)
            want -= len(chunk)
    except OSError:
        continue
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if total + len(data) <= limit:
        total += len(data)
        found[name] = base64.b64encode(data).decode()
payload = memoryview(json.dumps(found).encode())
while payload:
    payload = payload[os.write(out, payload):]
os._exit(code if code >= 0 else 128 - code)
"""


def workdir_relative(name: str) -> str:
    """`name` as a path relative to the working directory; ValueError for one outside it."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise ValueError(f"file name {name!r} is not a usable path")
    path = posixpath.normpath(name)
    if path.startswith("/"):
        for root, inside in ((WORKDIR, ""), (SCRATCH, SCRATCH_IN_WORKDIR)):
            if path.startswith(root + "/"):
                return posixpath.join(inside, path[len(root) + 1 :])
        raise ValueError(
            f"file name {name!r} is outside the run's working directory: use a relative path, or one under {WORKDIR} or {SCRATCH}"
        )
    if path in (".", "..") or path.startswith("../"):
        raise ValueError(f"file name {name!r} leaves the run's working directory")
    return path


def sandbox_path(name: str) -> str:
    """Where `name` lives inside the sandbox."""
    return posixpath.join(WORKDIR, workdir_relative(name))


def check_names(names: Iterable[str]) -> list[str]:
    """The names, each checked with workdir_relative; ValueError for a bad one or too many."""
    names = list(names)
    if len(names) > MAX_FILES:
        raise ValueError(f"{len(names)} files: at most {MAX_FILES} per run")
    for name in names:
        workdir_relative(name)
    return names


def decode_files(files: Mapping[str, str | None]) -> dict[str, bytes]:
    """SandboxFusion's `files` (name -> base64) as bytes; null entries and SandboxFusion's skip mark are left out."""
    decoded = {}
    for name, content in files.items():
        if content is None or SKIPPED_MARK in name:
            continue
        try:
            decoded[name] = base64.b64decode(content)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"files[{name!r}] is not base64: {exc}") from exc
    check_names(decoded)
    return decoded


def encode_files(files: Mapping[str, bytes]) -> dict[str, str]:
    """Bytes as SandboxFusion's base64 strings."""
    return {name: base64.b64encode(data).decode() for name, data in files.items()}


def read_collected(fd: int, limit: int) -> dict[str, bytes]:
    """What COLLECTOR wrote to the memory file `fd`; nothing when it wrote nothing usable (the program
    died with it, or overwrote it)."""
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, limit * 4 // 3 + (MAX_FILES << 12) + 1024)
    try:
        found = json.loads(raw or b"{}")
        return {str(name): base64.b64decode(data) for name, data in found.items()}
    except (ValueError, TypeError, AttributeError, binascii.Error):
        return {}
