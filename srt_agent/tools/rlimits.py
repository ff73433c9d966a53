"""The resource limits of one local run: its argv behind what lowers the rlimits (CPU seconds, address space,
processes, file size; no core dumps) before the program starts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

PRLIMIT = "/usr/bin/prlimit"  # util-linux; sets the limits without a second interpreter start
_LIMIT_NAMES = ("cpu", "as", "nproc", "fsize")

# Without prlimit: a first interpreter lowers the rlimits, then becomes the program.
_LAUNCHER = """\
import os, resource, sys
names = ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE")
for name, value in zip(names, map(int, sys.argv[1:5])):
    if value >= 0:
        hard = value + 1 if name == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, name), (value, hard))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.argv[5], sys.argv[5:])
"""


def limited_argv(argv: Sequence[str], limits: list[int], python: Path, prlimit: str | None = PRLIMIT) -> list[str]:
    """`argv` behind what lowers the rlimits (cpu s, address space, processes, file size; -1 = leave
    alone; no core dumps): prlimit, else a first `python` that sets them and becomes the program. Inside the
    sandbox this runs in the new user namespace, so RLIMIT_NPROC counts only the sandbox's processes."""
    if prlimit is not None and os.path.exists(prlimit):
        options = [
            f"--{name}={value}:{value + 1 if name == 'cpu' else value}"
            for name, value in zip(_LIMIT_NAMES, limits)
            if value >= 0
        ]
        return [prlimit, *options, "--core=0:0", "--", *argv]
    return [str(python), "-I", "-S", "-c", _LAUNCHER, *map(str, limits), *argv]
