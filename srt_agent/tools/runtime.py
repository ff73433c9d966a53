"""The sandbox runtime: a Python virtual environment of its own for model-written code.

`scripts/install_sandbox_runtime.sh` builds it (from `sandbox_runtime.txt`'s pins: numpy, scipy, sympy,
mpmath, networkx, pandas, requests) at `$SRT_SANDBOX_RUNTIME`, else `.sandbox-venv` in the repository (run
by root in a checkout other users cannot enter, e.g. under /root, it builds it under /var/lib/srt-agent and
makes `.sandbox-venv` a link to it: sandboxes started by root run programs as an unprivileged uid).
LocalSandbox runs programs with it when it exists and no other interpreter is given; it holds none of
the trainer's packages, and the trainer's own environment is never bound into the sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

RUNTIME_ENV = "SRT_SANDBOX_RUNTIME"
_REPOSITORY = Path(__file__).resolve().parents[2]

# Run inside the sandbox to report what programs get: the interpreter and every installed distribution.
DESCRIBE_PROGRAM = """\
import importlib.metadata, json, platform, sys
packages = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()}
print(json.dumps({"executable": sys.executable, "version": platform.python_version(), "prefix": sys.prefix,
                  "packages": dict(sorted(packages.items()))}))
"""


def runtime_dir() -> Path:
    """Where the runtime lives: `$SRT_SANDBOX_RUNTIME`, else `.sandbox-venv` in the repository."""
    configured = os.environ.get(RUNTIME_ENV)
    return Path(configured).absolute() if configured else _REPOSITORY / ".sandbox-venv"


def runtime_python() -> Path | None:
    """The runtime's interpreter, or None when the runtime has not been built. A runtime folder that is a
    symbolic link (the install script's answer to a checkout others cannot enter) is followed: the sandbox
    mounts the folder it names."""
    python = runtime_dir().resolve() / "bin" / "python"
    return python if python.is_file() else None


def venv_of(python: Path) -> Path | None:
    """The virtual environment `python` belongs to (the folder above its bin/ holding pyvenv.cfg), if any."""
    folder = Path(os.path.abspath(python)).parent.parent
    return folder if (folder / "pyvenv.cfg").is_file() else None
