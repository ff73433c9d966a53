"""Bubblewrap, the local sandbox's isolation: the command line of one run (user, PID, network, IPC and UTS
namespaces, a read-only view of the system, a private size-capped working directory, the interpreter mounted
at a fixed path, seccomp), started so that its first process is in the run's cgroup before the program
runs, run by root as a fresh unprivileged uid. What a program sees and why: docs/sandboxes.md."""

from __future__ import annotations

import functools
import json
import os
import secrets
import select
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .base import SandboxUnavailable
from .cgroup import CgroupLimiter
from .files import COLLECTOR, SCRATCH, SCRATCH_IN_WORKDIR, WORKDIR, read_collected, sandbox_path
from .languages import PROGRAM_ENV, command
from .phase import Phase
from .process import ProcessOutcome, run_capped
from .rlimits import limited_argv
from .runtime import venv_of
from .sandbox_python import RUNTIME_MOUNT, base_prefixes

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
# Where the extra `pythonpath` folders are mounted inside (beside the runtime's RUNTIME_MOUNT).
PYTHONPATH_MOUNT = "/opt/srt-pythonpath"
_FIRST_HOST_UID = 1 << 30  # per-run host uids are drawn from [2^30, 2^31): far from any real account


def bwrap_path() -> str | None:
    """The `bwrap` executable, or None when bubblewrap is not installed."""
    return shutil.which("bwrap")


def _bwrap_env() -> dict[str, str]:
    """bwrap's own environment: none of the caller's (the program's is set inside with --clearenv). An
    LD_PRELOAD the trainer runs with (tcmalloc, OpenMP from its venv) would have the loader of bwrap, started
    as the per-run uid, print that it cannot read them into the program's stderr."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


@functools.cache
def check_bwrap_works(bwrap: str, drops_root: bool) -> None:
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


@dataclass
class Bubblewrap:
    """How a local sandbox runs a phase under bubblewrap: what every run binds and limits, fixed when the
    sandbox is built (the interpreter on the host and `inside`, extra `pythonpath` folders, the working
    directory's size, the seccomp program, the cgroups, whether runs drop root to a fresh uid)."""

    bwrap: str
    python: Path
    inside: Path
    pythonpath: tuple[str, ...]
    tmp_mb: int
    max_processes: int
    max_output_bytes: int
    fetch_limit: int
    seccomp: bytes | None
    cgroups: CgroupLimiter | None
    drops_root: bool

    def argv(self, run: Phase, fds: _RunFds) -> list[str]:
        """bwrap's command line for `run`, its setup read from `fds`."""
        bwrap = [
            self.bwrap,
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
        for prefix in map(str, base_prefixes(self.python)):  # a pyenv or /opt interpreter under a venv
            bwrap += ["--ro-bind", prefix, prefix]
        pythonpath = [f"{PYTHONPATH_MOUNT}/{i}" for i in range(len(self.pythonpath))]
        env = {"PATH": f"{self.inside.parent}:/usr/local/bin:/usr/bin:/bin", **PROGRAM_ENV}
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
        venv = venv_of(self.python)
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
            command(run.language, run.program, str(self.inside), run.compiling), run.limits, self.inside
        )
        if run.fetch_files:
            names = json.dumps([[name, sandbox_path(name)] for name in run.fetch_files])
            argv = [
                str(self.inside),
                "-I",
                "-S",
                "-c",
                COLLECTOR,
                str(fds.fetched),
                str(self.fetch_limit),
                names,
                *argv,
            ]
        return bwrap + argv

    def run(
        self, run: Phase, watch: Callable[[int], None] | None
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
                seccomp=_memfd_with("srt-sandbox-seccomp", self.seccomp, open_fds) if self.seccomp else None,
                fetched=_memfd_with("srt-sandbox-fetched", b"", open_fds) if run.fetch_files else None,
                inputs={name: _memfd_with("srt-sandbox-file", data, open_fds) for name, data in run.files.items()},
            )
            if self.cgroups is not None:
                cgroup = self.cgroups.create((run.memory_mb + self.tmp_mb) << 20, self.max_processes + 2)
            user = _FIRST_HOST_UID + secrets.randbelow(_FIRST_HOST_UID) if self.drops_root else None
            outcome = run_capped(
                self.argv(run, fds),
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
            fetched = read_collected(fds.fetched, self.fetch_limit) if fds.fetched is not None else {}
            return outcome, b"child-pid" in status, cgroup is not None and cgroup.oom_killed(), fetched
        finally:
            for fd in list(open_fds):
                close(fd)
            if cgroup is not None:
                cgroup.remove()


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
        poller = select.poll()  # not select(): a busy server has descriptors past FD_SETSIZE (1024)
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(deadline - time.monotonic(), 0.0) * 1000):
            raise TimeoutError(f"bubblewrap did not start a sandbox within {timeout_s:.0f} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buffer += chunk
    pid = json.loads(buffer.split(b"\n", 1)[0]).get("child-pid")
    return int(pid) if pid is not None else None
