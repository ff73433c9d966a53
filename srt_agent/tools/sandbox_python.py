"""The Python interpreter a local sandbox's programs run with: which one (an interpreter or venv asked for,
the sandbox runtime when built, else the host's, else /usr/bin/python3), whether the per-run uid can read
it, what must be bound for it to start, and its path inside (a virtual environment at RUNTIME_MOUNT)."""

from __future__ import annotations

import os
import stat
import sys
import warnings
from pathlib import Path

from .base import SandboxUnavailable
from .files import WORKDIR
from .runtime import RUNTIME_ENV, runtime_dir, runtime_python, venv_of

# Where a virtual environment's interpreter (the runtime) is mounted inside: a fixed path outside the working
# directory, so a program sees the same interpreter path and an empty working directory wherever the runtime
# lives on the host (even under /tmp).
RUNTIME_MOUNT = "/opt/srt-runtime"


def world_readable(path: Path) -> bool:
    """Whether an unrelated uid can reach and read `path` (every ancestor searchable by others)."""
    path = path.resolve()
    for part in (path, *path.parents):
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return False
    return bool(path.stat().st_mode & stat.S_IROTH)


def readable_by_others(python: Path) -> bool:
    """Whether an unrelated uid can run `python`: the interpreter and, for a venv, the venv itself and
    the base installation its pyvenv.cfg names."""
    venv = venv_of(python)
    if not world_readable(python) or (venv is not None and not world_readable(venv / "pyvenv.cfg")):
        return False
    return all(world_readable(prefix) for prefix in base_prefixes(python))


def _interpreter_prefix(python: Path) -> Path:
    """The installation prefix that holds `python` (…/bin/python3 -> …)."""
    return python.resolve().parent.parent


def base_prefixes(python: Path) -> list[Path]:
    """The installation prefixes `python` needs bound, besides its venv: the one its symlinks lead to and,
    for a venv, the one its pyvenv.cfg's `home` names (a copied venv interpreter leads back to the venv)."""
    venv = venv_of(python)
    found = [_interpreter_prefix(python)]
    if venv is not None:
        for line in (venv / "pyvenv.cfg").read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                found.append(Path(value.strip()).resolve().parent)
    usr = Path("/usr")
    return [
        prefix
        for prefix in dict.fromkeys(found)
        if prefix != usr and usr not in prefix.parents and (venv is None or prefix != venv.resolve())
    ]


def _under(path: Path, folder: str) -> bool:
    return path == Path(folder) or Path(folder) in path.parents


def _closed_folders(path: Path) -> list[Path]:
    """The folders on the way to `path` (itself included) that other users cannot enter (lack o+x), outermost first."""
    closed = []
    for part in reversed((path.absolute(), *path.absolute().parents)):
        try:
            mode = part.stat().st_mode
        except OSError:
            break
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            closed.append(part)
    return closed


def mounted_interpreter(python: Path) -> Path:
    """`python`'s path inside; SandboxUnavailable when a prefix it needs would be hidden by (or show up in)
    the working directory."""
    venv = venv_of(python)
    for prefix in base_prefixes(python):
        if _under(prefix, WORKDIR):
            raise SandboxUnavailable(
                f"the interpreter {python} lives in {prefix}, under {WORKDIR}, the sandbox's working "
                "directory: use an interpreter installed elsewhere (a virtual environment may live anywhere)"
            )
    if venv is None:
        return python
    return Path(RUNTIME_MOUNT) / Path(os.path.abspath(python)).relative_to(venv)


def pick_python(asked: str | None, drops_root: bool) -> tuple[Path, str | None]:
    """The interpreter on the host (see LocalSandbox) and, when a runtime was asked for (built, or named by
    $SRT_SANDBOX_RUNTIME) but cannot be used, why. `drops_root`: programs run as an unprivileged uid, which
    must be able to read it."""
    if asked is not None:
        chosen = Path(asked)
        if chosen.is_dir():
            chosen = chosen / "bin" / "python"
        if not chosen.is_file():
            raise SandboxUnavailable(f"LocalSandbox(python={asked!r}): no such interpreter")
        if drops_root and not readable_by_others(chosen):
            raise SandboxUnavailable(
                f"LocalSandbox(python={asked!r}): the sandbox runs as an unprivileged uid that cannot read it"
            )
        return chosen, None
    problem = None
    runtime, folder = runtime_python(), runtime_dir()
    if runtime is not None:
        if not drops_root or readable_by_others(runtime):
            return runtime, None
        closed = " ".join(map(str, _closed_folders(folder)))
        fix = f"open {closed} to other users (chmod o+rx {closed})" if closed else f"chmod -R o+rX {folder}"
        problem = (
            f"the sandbox runtime {folder} cannot be read by the sandbox's unprivileged uid: {fix}, or build "
            f"it in a folder others can enter and set {RUNTIME_ENV} to it"
        )
    elif os.environ.get(RUNTIME_ENV):
        problem = (
            f"{RUNTIME_ENV}={os.environ[RUNTIME_ENV]} holds no sandbox runtime ({folder / 'bin' / 'python'} is "
            f"missing): build it there (bash scripts/install_sandbox_runtime.sh) or set {RUNTIME_ENV} to a built one"
        )
    if problem is not None:
        warnings.warn(f"{problem}; programs run without its libraries", RuntimeWarning, stacklevel=4)
    host = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not host.is_file():
        host = Path(sys.executable).resolve()
    if not drops_root or world_readable(host):
        return host, problem
    system = Path("/usr/bin/python3")
    if system.is_file() and world_readable(system):
        return system, problem
    raise SandboxUnavailable(
        f"the host interpreter {host} is not readable by the sandbox's unprivileged uid and "
        "/usr/bin/python3 is missing: install python3 (`apt-get install python3`) or pass python=<path>"
    )
