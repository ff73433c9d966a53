"""The embedded code sandbox: bubblewrap namespaces plus rlimits, one throwaway sandbox per run.

Each run gets its own user, PID, network, IPC and UTS namespaces (no network), a read-only view of the
system, a private size-capped `/tmp`, rlimits, a seccomp filter (seccomp.py) and, where the host allows, a
cgroup (cgroup.py); run by root, a fresh unprivileged uid. A run's isolation is one sequence, from the
bubblewrap arguments to the classification of the outcome, kept in one file for one security review.
What a program sees and why: docs/sandboxes.md ("The local sandbox") and docs/sandbox.md.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .base import SandboxResult, SandboxUnavailable, is_memory_error
from .cgroup import CgroupLimiter
from .files import (
    COLLECTOR,
    SCRATCH,
    SCRATCH_IN_WORKDIR,
    WORKDIR,
    check_names,
    read_collected,
    sandbox_path,
    workdir_relative,
)
from .languages import BINARY, COMPILE_MEMORY_MB, Language, command, find_language, missing_tools
from .process import ProcessOutcome, run_capped
from .runtime import RUNTIME_ENV, runtime_dir, runtime_python, venv_of
from .seccomp import seccomp_program

_HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
_ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "passwd",
    "group",
    "nsswitch.conf",
    "alternatives",
    "ssl",
)
_LIB_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SANDBOX_UID = 1000
# Where a virtual environment's interpreter (the runtime) and the extra `pythonpath` folders are mounted
# inside: fixed paths outside the working directory, so a program sees the same interpreter path and an
# empty working directory wherever the runtime lives on the host (even under /tmp).
RUNTIME_MOUNT = "/opt/srt-runtime"
PYTHONPATH_MOUNT = "/opt/srt-pythonpath"
_FIRST_HOST_UID = 1 << 30  # per-run host uids are drawn from [2^30, 2^31): far from any real account

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


def bwrap_path() -> str | None:
    """The `bwrap` executable, or None when bubblewrap is not installed."""
    return shutil.which("bwrap")


def _world_readable(path: Path) -> bool:
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


def _readable_by_others(python: Path) -> bool:
    """Whether an unrelated uid can run `python`: the interpreter and, for a venv, the venv itself and
    the base installation its pyvenv.cfg names."""
    venv = venv_of(python)
    if not _world_readable(python) or (venv is not None and not _world_readable(venv / "pyvenv.cfg")):
        return False
    return all(_world_readable(prefix) for prefix in _base_prefixes(python))


def _bwrap_env() -> dict[str, str]:
    """bwrap's own environment: none of the caller's (the program's is set inside with --clearenv). An
    LD_PRELOAD the trainer runs with (tcmalloc, OpenMP from its venv) would have the loader of bwrap, started
    as the per-run uid, print that it cannot read them into the program's stderr."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


@functools.cache
def _check_bwrap_works(bwrap: str, drops_root: bool) -> None:
    """Start one empty sandbox (once per process) so a host that forbids it fails at construction."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/usr", "/usr"]
    for lib in _LIB_DIRS:
        if os.path.islink(lib):
            argv += ["--symlink", os.readlink(lib), lib]
    argv += ["/usr/bin/env", "true"]
    user = _FIRST_HOST_UID if drops_root else None
    try:
        probe = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=30,
            user=user,
            group=user,
            extra_groups=[] if user else None,
            env=_bwrap_env(),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"cannot run bubblewrap ({bwrap}) as the sandbox's user: {exc}") from exc
    if probe.returncode != 0:
        raise SandboxUnavailable(
            f"bubblewrap cannot create a sandbox here: {probe.stderr.strip() or f'exit code {probe.returncode}'}. "
            "Unprivileged user namespaces are probably disabled: allow them (e.g. `sysctl -w "
            "kernel.unprivileged_userns_clone=1`, or on Ubuntu 24.04+ `sysctl -w "
            "kernel.apparmor_restrict_unprivileged_userns=0`), or use make_sandbox('sandbox_fusion') or 'docker'."
        )


def _interpreter_prefix(python: Path) -> Path:
    """The installation prefix that holds `python` (…/bin/python3 -> …)."""
    return python.resolve().parent.parent


def _base_prefixes(python: Path) -> list[Path]:
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


@dataclass
class LocalSandbox:
    """Runs Python programs under bubblewrap (`bwrap`) with rlimits; see the module docstring.

    `memory_mb` caps each process's address space and, with cgroups (`use_cgroups`, on where the
    host allows), the RAM of the whole run plus its /tmp. `cpu_s` defaults to the timeout plus one
    second. `python` picks the interpreter inside, an executable or a virtual environment's folder
    (default: the sandbox runtime when built, else the host's, or `/usr/bin/python3` when the per-run
    uid cannot read the host's); `pythonpath` lists extra host directories (e.g. a site-packages)
    bound read-only and put on PYTHONPATH. Files fetched back are capped at `max_file_mb` together.
    `allow_unsandboxed=True` runs without bubblewrap when it is missing: rlimits and timeouts only, no
    isolation at all (a program can even kill the calling process).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_processes: int = 64
    max_file_mb: int = 16
    max_output_bytes: int = 65536
    cpu_s: float | None = None
    allow_unsandboxed: bool = False
    tmp_mb: int = 64
    python: str | None = None
    pythonpath: tuple[str, ...] = ()
    use_cgroups: bool = True
    seccomp: bool = True
    _cgroups: CgroupLimiter | None = field(init=False, repr=False, default=None)
    _seccomp: bytes | None = field(init=False, repr=False, default=None)
    _bwrap: str | None = field(init=False, repr=False, default=None)
    _python: Path = field(init=False, repr=False, default=Path(sys.executable))
    _inside: Path = field(init=False, repr=False, default=Path(sys.executable))
    runtime_problem: str | None = field(init=False, default=None)
    _runtime_checked: str | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_file_mb", "max_output_bytes", "tmp_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LocalSandbox.{name} must be positive, got {getattr(self, name)!r}")
        if self.cpu_s is not None and self.cpu_s <= 0:
            raise ValueError(f"LocalSandbox.cpu_s must be positive or None, got {self.cpu_s!r}")
        self.pythonpath = tuple(str(Path(p).resolve()) for p in self.pythonpath)
        self._bwrap = bwrap_path()
        if self._bwrap is None:
            if not self.allow_unsandboxed:
                raise SandboxUnavailable(
                    "bubblewrap (`bwrap`) is not installed, so code cannot be sandboxed. Install it "
                    "(Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install bubblewrap`), "
                    "use another sandbox (make_sandbox('sandbox_fusion') or 'docker'), or pass "
                    "allow_unsandboxed=True to run model-written code directly on this machine."
                )
            warnings.warn(
                "LocalSandbox is running code WITHOUT a sandbox (bwrap is missing, allow_unsandboxed=True): "
                "programs can read and write your files and use the network; only rlimits and timeouts apply.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._python = self._pick_python()
        self._inside = self._python
        if self.sandboxed:
            self._inside = self._mounted_interpreter()
            _check_bwrap_works(self._bwrap, self._drops_root)
        self._seccomp = seccomp_program() if self.sandboxed and self.seccomp else None
        if self.sandboxed and self.use_cgroups:
            self._cgroups = CgroupLimiter.detect()
        for path in self.pythonpath:
            if not Path(path).is_dir():
                raise SandboxUnavailable(f"LocalSandbox(pythonpath=...): {path} is not a directory")
            if self._drops_root and not _world_readable(Path(path)):
                raise SandboxUnavailable(
                    f"LocalSandbox(pythonpath=...): {path} is not readable by the sandbox's unprivileged uid "
                    "(every folder above it needs o+rx)"
                )

    @property
    def sandboxed(self) -> bool:
        return self._bwrap is not None

    @property
    def interpreter(self) -> Path:
        """The Python interpreter programs run with, as a path on the host."""
        return self._python

    @property
    def interpreter_inside(self) -> Path:
        """The interpreter as programs see it (their `sys.executable`): a virtual environment is mounted at
        RUNTIME_MOUNT, whatever its folder on the host."""
        return self._inside

    def check_runtime(self) -> str | None:
        """For runs that need the runtime's libraries (training): why it cannot be used, or None. Besides
        `runtime_problem`, a runtime that was picked must start inside and report its mounted prefix (the
        first answer is kept)."""
        if self.runtime_problem is not None or not self.sandboxed or self.python is not None:
            return self.runtime_problem
        if self._python != runtime_python():
            return None  # no runtime asked for (none built, $SRT_SANDBOX_RUNTIME unset): the host's interpreter
        if self._runtime_checked is None:
            probe = self.run("import sys\nprint(sys.prefix)", timeout_s=max(self.timeout_s, 30.0))
            if (probe.status, probe.stdout.strip()) == ("ok", RUNTIME_MOUNT):
                self._runtime_checked = ""
            else:
                said = (probe.stderr.strip().splitlines() or [probe.status])[-1]
                self._runtime_checked = (
                    f"the sandbox runtime {runtime_dir()} does not start inside the sandbox ({said}): rebuild it "
                    f"(bash scripts/install_sandbox_runtime.sh) or set {RUNTIME_ENV} to a working one"
                )
        return self._runtime_checked or None

    def _mounted_interpreter(self) -> Path:
        """The interpreter's path inside; SandboxUnavailable when a prefix it needs would be hidden by (or
        show up in) the working directory."""
        venv = venv_of(self._python)
        for prefix in _base_prefixes(self._python):
            if _under(prefix, WORKDIR):
                raise SandboxUnavailable(
                    f"the interpreter {self._python} lives in {prefix}, under {WORKDIR}, the sandbox's working "
                    "directory: use an interpreter installed elsewhere (a virtual environment may live anywhere)"
                )
        if venv is None:
            return self._python
        return Path(RUNTIME_MOUNT) / Path(os.path.abspath(self._python)).relative_to(venv)

    @property
    def _drops_root(self) -> bool:
        return self.sandboxed and os.geteuid() == 0

    def _pick_python(self) -> Path:
        """The interpreter (see the class docstring); sets `runtime_problem` when a runtime was asked for
        (built, or named by $SRT_SANDBOX_RUNTIME) but cannot be used."""
        if self.python is not None:
            chosen = Path(self.python)
            if chosen.is_dir():
                chosen = chosen / "bin" / "python"
            if not chosen.is_file():
                raise SandboxUnavailable(f"LocalSandbox(python={self.python!r}): no such interpreter")
            if self._drops_root and not _readable_by_others(chosen):
                raise SandboxUnavailable(
                    f"LocalSandbox(python={self.python!r}): the sandbox runs as an unprivileged uid that cannot read it"
                )
            return chosen
        runtime, folder = runtime_python(), runtime_dir()
        if runtime is not None:
            if not self._drops_root or _readable_by_others(runtime):
                return runtime
            closed = " ".join(map(str, _closed_folders(folder)))
            fix = f"open {closed} to other users (chmod o+rx {closed})" if closed else f"chmod -R o+rX {folder}"
            self.runtime_problem = (
                f"the sandbox runtime {folder} cannot be read by the sandbox's unprivileged uid: {fix}, or build "
                f"it in a folder others can enter and set {RUNTIME_ENV} to it"
            )
        elif os.environ.get(RUNTIME_ENV):
            self.runtime_problem = (
                f"{RUNTIME_ENV}={os.environ[RUNTIME_ENV]} holds no sandbox runtime ({folder / 'bin' / 'python'} is "
                f"missing): build it there (bash scripts/install_sandbox_runtime.sh) or set {RUNTIME_ENV} to a built one"
            )
        if self.runtime_problem is not None:
            warnings.warn(f"{self.runtime_problem}; programs run without its libraries", RuntimeWarning, stacklevel=4)
        host = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        if not host.is_file():
            host = Path(sys.executable).resolve()
        if not self._drops_root or _world_readable(host):
            return host
        system = Path("/usr/bin/python3")
        if system.is_file() and _world_readable(system):
            return system
        raise SandboxUnavailable(
            f"the host interpreter {host} is not readable by the sandbox's unprivileged uid and "
            "/usr/bin/python3 is missing: install python3 (`apt-get install python3`) or pass python=<path>"
        )

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        files: Mapping[str, bytes] | None = None,
        fetch_files: Sequence[str] = (),
        language: str = "python",
        compile_timeout_s: float = 10.0,
        deadline: float | None = None,
        watch: Callable[[int], None] | None = None,
    ) -> SandboxResult:
        """Run `code` in `language` (languages.py: python, bash, nodejs, cpp); never raises for anything the
        program does. A compiled language is compiled first, within `compile_timeout_s`, in a sandbox of its own.

        `files` (name -> content) are written into the run's working directory first; `fetch_files`
        come back in the result's `files` when the program ends by itself (see files.py for names).
        `deadline` (a `time.monotonic()` instant) cuts every phase short so that none runs past it;
        `watch(pid)` is told each phase's first process as it starts (the server's scheduler follows it).
        Bad names, inputs over `tmp_mb`, an unknown language or one this machine lacks raise ValueError.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0 or compile_timeout_s <= 0:
            raise ValueError(
                f"timeout_s and compile_timeout_s must be positive, got {timeout!r}, {compile_timeout_s!r}"
            )
        lang = find_language(language)
        problem = missing_tools(lang.name)
        if problem:
            raise ValueError(problem)
        files = dict(files or {})
        fetch_files = check_names(fetch_files)
        check_names(files)
        if sum(map(len, files.values())) > self.tmp_mb << 20:
            raise ValueError(f"the files given to a run take over its {self.tmp_mb} MB working directory")
        phase = functools.partial(self._phase, lang=lang, files=files, deadline=deadline, watch=watch)
        if lang.compile is None:
            return phase(code.encode(), stdin, timeout, self.memory_mb + lang.extra_address_space_mb, fetch_files)
        compiled = phase(code.encode(), "", compile_timeout_s, max(self.memory_mb, COMPILE_MEMORY_MB), [BINARY], True)
        binary = compiled.files.pop(BINARY, None)
        if compiled.status != "ok" or binary is None:
            if compiled.status == "ok":  # compiled, but the binary is over the fetch cap
                compiled.stderr += f"\nthe compiled program is over this sandbox's {self.max_file_mb} MB file cap"
            cut = compiled.status in ("overloaded", "sandbox_error")
            return SandboxResult(
                status=compiled.status if cut else "compile_error",
                stdout=compiled.stdout,
                stderr=compiled.stderr,
                exit_code=compiled.exit_code,
                wall_s=compiled.wall_s,
                compile=compiled,
            )
        result = phase(binary, stdin, timeout, self.memory_mb, fetch_files, compiled=True)
        result.compile = compiled
        return result

    def _phase(
        self,
        program: bytes,
        stdin: str,
        timeout: float,
        address_space_mb: int,
        fetch_files: list[str],
        compiling: bool = False,
        compiled: bool = False,
        *,
        lang: Language,
        files: dict[str, bytes],
        deadline: float | None,
        watch: Callable[[int], None] | None,
    ) -> SandboxResult:
        """One sandboxed process tree: a program's run, or its compiler's."""
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                return SandboxResult(status="timeout", stderr="no time was left to run it")
        cpu = self.cpu_s if self.cpu_s is not None and not compiling else timeout + 1.0
        nproc = self.max_processes if self.sandboxed else -1  # unsandboxed it would count all the user's processes
        limits = [max(1, math.ceil(cpu)), address_space_mb << 20, nproc, self.max_file_mb << 20]
        memory_mb = max(self.memory_mb, COMPILE_MEMORY_MB) if compiling else self.memory_mb
        run = _Run(program, stdin, timeout, limits, lang, files, fetch_files, memory_mb, compiling, compiled)
        try:
            if self.sandboxed:
                outcome, started, oom_killed, fetched = self._run_bwrap(run, watch)
            else:
                (outcome, fetched), started, oom_killed = self._run_unsandboxed(run, watch), True, False
        except OSError as exc:
            return SandboxResult(status="sandbox_error", stderr=f"could not run the sandbox: {exc}")
        result = classify(outcome, started=started, signal_offset=128 if self.sandboxed else None)
        if oom_killed and result.status in ("error", "killed"):
            result.status = "memory"
        result.files = fetched
        return result

    def _bwrap_argv(self, run: _Run, fds: _RunFds) -> list[str]:
        bwrap = [
            self._bwrap,
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns",
            "--die-with-parent", "--new-session",
            "--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID),
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for lib in _LIB_DIRS:
            if os.path.islink(lib):
                bwrap += ["--symlink", os.readlink(lib), lib]
            elif os.path.isdir(lib):
                bwrap += ["--ro-bind", lib, lib]
        for name in _ETC_FILES:
            bwrap += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        bwrap += ["--ro-bind-data", str(fds.hosts), "/etc/hosts"]
        for prefix in map(str, _base_prefixes(self._python)):  # a pyenv or /opt interpreter under a venv
            bwrap += ["--ro-bind", prefix, prefix]
        pythonpath = [f"{PYTHONPATH_MOUNT}/{i}" for i in range(len(self.pythonpath))]
        env = {
            "PATH": f"{self._inside.parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        if self.pythonpath:
            env["PYTHONPATH"] = ":".join(pythonpath)
        bwrap += ["--clearenv"]
        for key, value in env.items():
            bwrap += ["--setenv", key, value]
        bwrap += [
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(self.tmp_mb << 20), "--tmpfs", WORKDIR,
            *(["--perms", "0555"] if run.compiled else []), "--ro-bind-data", str(fds.code), run.program,
        ]  # fmt: skip
        if run.uses_scratch:
            scratch = f"{WORKDIR}/{SCRATCH_IN_WORKDIR}"
            bwrap += ["--dir", scratch, "--symlink", scratch, SCRATCH]
        for name, fd in fds.inputs.items():
            bwrap += ["--file", str(fd), sandbox_path(name)]
        venv = venv_of(self._python)
        if venv is not None:  # at a fixed path outside the working directory, wherever it is on the host
            bwrap += ["--ro-bind", str(venv), RUNTIME_MOUNT]
        for path, inside in zip(self.pythonpath, pythonpath):
            bwrap += ["--ro-bind", path, inside]
        bwrap += [
            "--remount-ro", "/",
            "--chdir", WORKDIR,
            "--json-status-fd", str(fds.status),
            "--block-fd", str(fds.block),
        ]  # fmt: skip
        if fds.seccomp is not None:
            bwrap += ["--seccomp", str(fds.seccomp)]
        argv = limited_argv(
            command(run.language, run.program, str(self._inside), run.compiling), run.limits, self._inside
        )
        if run.fetch_files:
            names = json.dumps([[name, sandbox_path(name)] for name in run.fetch_files])
            argv = [
                str(self._inside),
                "-I",
                "-S",
                "-c",
                COLLECTOR,
                str(fds.fetched),
                str(self._fetch_limit),
                names,
                *argv,
            ]
        return bwrap + argv

    @property
    def _fetch_limit(self) -> int:
        return self.max_file_mb << 20

    def _run_bwrap(
        self, run: _Run, watch: Callable[[int], None] | None
    ) -> tuple[ProcessOutcome, bool, bool, dict[str, bytes]]:
        """Run under bwrap; returns (outcome, whether the program started, whether it was OOM-killed,
        the files fetched).

        bwrap holds the program back (--block-fd) until the sandbox's first process, named on the
        status fd, is in the run's cgroup, so every process it ever forks is counted there too.
        """
        status = bytearray()
        open_fds: set[int] = set()
        cgroup = None

        def close(fd: int) -> None:
            open_fds.discard(fd)
            os.close(fd)

        def release(proc: subprocess.Popen) -> None:
            close(status_w)
            close(block_r)
            pid = _read_child_pid(status_r, status, timeout_s=max(run.timeout, 10.0))
            if pid is not None and cgroup is not None:
                cgroup.add(pid)
            if watch is not None:  # before the program starts
                watch(proc.pid)
            try:
                os.write(block_w, b"go")
            except BrokenPipeError:  # bwrap failed before starting anything; its stderr says why
                pass
            close(block_w)

        try:
            status_r, status_w = os.pipe()
            block_r, block_w = os.pipe()
            open_fds |= {status_r, status_w, block_r, block_w}
            fds = _RunFds(
                code=_memfd_with("srt-sandbox-program", run.code, open_fds),
                hosts=_memfd_with("srt-sandbox-hosts", _HOSTS, open_fds),
                status=status_w,
                block=block_r,
                seccomp=_memfd_with("srt-sandbox-seccomp", self._seccomp, open_fds) if self._seccomp else None,
                fetched=_memfd_with("srt-sandbox-fetched", b"", open_fds) if run.fetch_files else None,
                inputs={name: _memfd_with("srt-sandbox-file", data, open_fds) for name, data in run.files.items()},
            )
            if self._cgroups is not None:
                cgroup = self._cgroups.create((run.memory_mb + self.tmp_mb) << 20, self.max_processes + 2)
            user = _FIRST_HOST_UID + secrets.randbelow(_FIRST_HOST_UID) if self._drops_root else None
            outcome = run_capped(
                self._bwrap_argv(run, fds),
                stdin=run.stdin.encode(),
                timeout_s=run.timeout,
                max_output_bytes=self.max_output_bytes,
                pass_fds=tuple(fd for fd in open_fds if fd not in (status_r, block_w)),
                user=user,
                cwd="/",
                env=_bwrap_env(),
                on_spawn=release,
            )
            os.set_blocking(status_r, False)
            try:
                while chunk := os.read(status_r, 65536):
                    status += chunk
            except BlockingIOError:
                pass
            fetched = read_collected(fds.fetched, self._fetch_limit) if fds.fetched is not None else {}
            return outcome, b"child-pid" in status, cgroup is not None and cgroup.oom_killed(), fetched
        finally:
            for fd in list(open_fds):
                close(fd)
            if cgroup is not None:
                cgroup.remove()

    def _run_unsandboxed(
        self, run: _Run, watch: Callable[[int], None] | None
    ) -> tuple[ProcessOutcome, dict[str, bytes]]:
        with tempfile.TemporaryDirectory(prefix="srt-unsandboxed-") as workdir:
            program = Path(workdir) / Path(run.program).name
            program.write_bytes(run.code)
            program.chmod(0o555 if run.compiled else 0o444)
            for name, data in run.files.items():
                target = Path(workdir, workdir_relative(name))
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": workdir,
                "PYTHONUNBUFFERED": "1",
                "LANG": "C.UTF-8",
            }
            outcome = run_capped(
                limited_argv(
                    command(run.language, str(program), str(self._python), run.compiling), run.limits, self._python
                ),
                stdin=run.stdin.encode(),
                timeout_s=run.timeout,
                max_output_bytes=self.max_output_bytes,
                cwd=workdir,
                env=env,
                on_spawn=(lambda proc: watch(proc.pid)) if watch is not None else None,
            )
            fetched, total = {}, 0
            for name in run.fetch_files if not (outcome.timed_out or outcome.output_limited) else ():
                path = Path(workdir, workdir_relative(name))
                if path.is_file() and total + path.stat().st_size <= self._fetch_limit:
                    fetched[name] = path.read_bytes()
                    total += len(fetched[name])
            return outcome, fetched


@dataclass
class _Run:
    """One phase of a run (the program's, or its compiler's), checked. `code` is the program's file: its
    source, or the compiled binary when `compiled`."""

    code: bytes
    stdin: str
    timeout: float
    limits: list[int]
    language: Language
    files: dict[str, bytes]
    fetch_files: list[str]
    memory_mb: int
    compiling: bool = False
    compiled: bool = False

    @property
    def program(self) -> str:
        return self.language.program_path(self.compiled)

    @property
    def uses_scratch(self) -> bool:
        """Whether the run's files or fetched files name /mnt (only then does the sandbox have it)."""
        return any(
            workdir_relative(name).startswith(f"{SCRATCH_IN_WORKDIR}/") for name in (*self.files, *self.fetch_files)
        )


@dataclass
class _RunFds:
    """The descriptors bubblewrap reads a run's setup from (and the collector writes fetched files to)."""

    code: int
    hosts: int
    status: int
    block: int
    seccomp: int | None
    fetched: int | None
    inputs: dict[str, int]


def _memfd_with(name: str, data: bytes, owned: set[int]) -> int:
    """A memory file holding `data`, rewound for its reader; its fd is added to `owned`."""
    fd = os.memfd_create(name)
    owned.add(fd)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_child_pid(fd: int, buffer: bytearray, timeout_s: float) -> int | None:
    """Read bwrap's first JSON status line from `fd` (kept in `buffer`): the sandbox's outer pid.

    None when bwrap exits without starting a sandbox; TimeoutError when it says nothing in time.
    """
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buffer:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
        if not ready:
            raise TimeoutError(f"bubblewrap did not start a sandbox within {timeout_s:.0f} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buffer += chunk
    pid = json.loads(buffer.split(b"\n", 1)[0]).get("child-pid")
    return int(pid) if pid is not None else None


def classify(outcome: ProcessOutcome, *, started: bool = True, signal_offset: int | None = None) -> SandboxResult:
    """Turn a process outcome into a SandboxResult.

    `signal_offset=128` reads exit codes above 128 as deaths by signal (bubblewrap reports a child
    killed by signal N as 128+N); Popen's own negative codes always mean a signal. Like Popen's,
    the result's `exit_code` is -N for a death by signal N, and None when the sandbox killed it.
    """
    stdout = outcome.stdout.decode("utf-8", errors="replace")
    stderr = outcome.stderr.decode("utf-8", errors="replace")
    code = outcome.returncode
    result = SandboxResult(status="ok", stdout=stdout, stderr=stderr, exit_code=code, wall_s=outcome.wall_s)
    if outcome.output_limited:
        result.status, result.truncated, result.exit_code = "output_limit", True, None
    elif outcome.timed_out:
        result.status, result.exit_code = "timeout", None
    elif not started:
        result.status = "sandbox_error"
    elif code == 0:
        result.status = "ok"
    else:
        signum = -code if code < 0 else (code - signal_offset if signal_offset and code > signal_offset else None)
        if signum is not None:
            result.exit_code = -signum
            result.status = "timeout" if signum == signal.SIGXCPU else "killed"
        elif is_memory_error(stderr):
            result.status = "memory"
        else:
            result.status = "error"
    return result
