"""The embedded code sandbox: each run in a throwaway bubblewrap sandbox of its own, with rlimits, a seccomp
filter and, where the host allows, a cgroup.

A run's isolation is one sequence over a few short files, read together for a security review: the
interpreter programs run with (sandbox_python.py), bubblewrap's namespaces and mounts (bwrap.py), the
rlimits (rlimits.py), the system calls refused (seccomp.py), the cgroup (cgroup.py) and the reading of the
outcome (process.py). What a program sees and why: docs/sandboxes.md ("The local sandbox") and docs/sandbox.md.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .base import SandboxResult, SandboxUnavailable
from .bwrap import Bubblewrap, bwrap_path, check_bwrap_works
from .cgroup import CgroupLimiter
from .files import check_names, workdir_relative
from .languages import BINARY, COMPILE_MEMORY_MB, Language, available, command, find_language, missing_tools
from .phase import Phase
from .process import ProcessOutcome, classify, run_capped
from .rlimits import limited_argv
from .runtime import RUNTIME_ENV, runtime_dir, runtime_python
from .sandbox_python import RUNTIME_MOUNT, mounted_interpreter, pick_python, world_readable
from .seccomp import seccomp_program


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
    _jail: Bubblewrap | None = field(init=False, repr=False, default=None)
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
        bwrap = bwrap_path()
        if bwrap is None:
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
        drops_root = bwrap is not None and os.geteuid() == 0  # root runs each program as a fresh uid
        self._python, self.runtime_problem = pick_python(self.python, drops_root)
        self._inside = self._python
        if bwrap is not None:
            self._inside = mounted_interpreter(self._python)
            check_bwrap_works(bwrap, drops_root)
        for path in self.pythonpath:
            if not Path(path).is_dir():
                raise SandboxUnavailable(f"LocalSandbox(pythonpath=...): {path} is not a directory")
            if drops_root and not world_readable(Path(path)):
                raise SandboxUnavailable(
                    f"LocalSandbox(pythonpath=...): {path} is not readable by the sandbox's unprivileged uid "
                    "(every folder above it needs o+rx)"
                )
        if bwrap is not None:
            self._jail = Bubblewrap(
                bwrap,
                self._python,
                self._inside,
                self.pythonpath,
                tmp_mb=self.tmp_mb,
                max_processes=self.max_processes,
                max_output_bytes=self.max_output_bytes,
                fetch_limit=self._fetch_limit,
                seccomp=seccomp_program() if self.seccomp else None,
                cgroups=CgroupLimiter.detect() if self.use_cgroups else None,
                drops_root=drops_root,
            )

    @property
    def sandboxed(self) -> bool:
        return self._jail is not None

    def languages(self) -> list[str]:
        """The languages whose tools this machine has (languages.py)."""
        return available()

    def origin(self) -> dict[str, str]:
        return {"host_executable": str(self._python)}

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

    @property
    def _fetch_limit(self) -> int:
        return self.max_file_mb << 20

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
        run = Phase(program, stdin, timeout, limits, lang, files, fetch_files, memory_mb, compiling, compiled)
        try:
            if self._jail is not None:
                outcome, started, oom_killed, fetched = self._jail.run(run, watch)
            else:
                (outcome, fetched), started, oom_killed = self._run_unsandboxed(run, watch), True, False
        except OSError as exc:
            return SandboxResult(status="sandbox_error", stderr=f"could not run the sandbox: {exc}")
        result = classify(outcome, started=started, signal_offset=128 if self.sandboxed else None)
        if oom_killed and result.status in ("error", "killed"):
            result.status = "memory"
        result.files = fetched
        return result

    def _run_unsandboxed(
        self, run: Phase, watch: Callable[[int], None] | None
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
