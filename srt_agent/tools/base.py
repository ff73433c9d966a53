"""The contract every code sandbox meets: `run(code) -> SandboxResult`, never raising for the program; and
what a sandbox that runs programs itself tells `srt-agent sandbox serve` (:class:`ServedSandbox`)."""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol, runtime_checkable

SandboxStatus = Literal[
    "ok", "error", "timeout", "memory", "output_limit", "killed", "compile_error", "overloaded", "sandbox_error"
]
"""What happened to a program:

- ``ok``: exited with code 0;
- ``error``: exited with a non-zero code (an exception, ``sys.exit(1)``, a failed fork…);
- ``timeout``: ran past the wall-clock or CPU-time limit and was killed;
- ``memory``: ran out of its memory limit;
- ``output_limit``: wrote more than the output cap and was killed (the output kept is truncated);
- ``killed``: died from a signal the sandbox did not send (e.g. SIGSEGV, or it killed itself);
- ``compile_error``: a compiled language's program did not compile (or the compiler ran out of time);
- ``overloaded``: stopped at its time limit without having had that time to itself (it waited for a busy
  sandbox server or for a CPU more than it ran): not the program's fault;
- ``sandbox_error``: the sandbox itself failed (setup, an unreachable server): not the program's fault.
"""

SANDBOX_FAULTS = frozenset({"overloaded", "sandbox_error"})
"""Statuses that say nothing about the program: the call may be retried, and it is never the model's failure."""

SANDBOX_STATUSES: tuple[str, ...] = SandboxStatus.__args__  # type: ignore[attr-defined]


class SandboxUnavailable(RuntimeError):
    """A sandbox backend cannot work as configured (missing tool, unreachable daemon, bad option)."""


@dataclass
class SandboxResult:
    """The outcome of running one program in a sandbox.

    `exit_code` is the program's exit status, -N after a death by signal N, and None when the
    sandbox stopped it (timeout, output cap) or never ran it. `truncated`: output was cut.
    `files`: the files asked back from the run (name -> content) that it left behind. `compile`: for a
    compiled language, the compiler's own result (its stdout and stderr, how it ended).
    """

    status: SandboxStatus
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0
    truncated: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    compile: SandboxResult | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        """A JSON-ready dict (file contents in base64)."""
        files = {name: base64.b64encode(data).decode() for name, data in self.files.items()}
        return {**asdict(self), "files": files, "compile": self.compile.to_dict() if self.compile else None}


def is_memory_error(stderr: str) -> bool:
    """Whether a failed Python program's stderr ends in a MemoryError, or an extension module that could
    not be mapped (both: its address-space limit)."""
    lines = stderr.strip().splitlines()
    return bool(lines) and (
        lines[-1].startswith("MemoryError") or "failed to map segment from shared object" in lines[-1]
    )


@runtime_checkable
class CodeSandbox(Protocol):
    """Runs a Python program in isolation. Must not raise for anything the program does."""

    def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult: ...


@runtime_checkable
class ServedSandbox(CodeSandbox, Protocol):
    """A sandbox that runs programs itself, so `srt-agent sandbox serve` can put it behind SandboxFusion's
    API: a dataclass of the limits the server reports (it `dataclasses.replace`s `memory_mb` for a request
    that asks for another), whose `run` also takes `files`, `fetch_files` and `language`."""

    timeout_s: float
    memory_mb: int
    max_output_bytes: int
    tmp_mb: int
    max_file_mb: int

    @property
    def sandboxed(self) -> bool:
        """Whether programs run isolated (not so for the local sandbox allowed to run without bubblewrap)."""
        ...

    def languages(self) -> list[str]:
        """The languages it runs on this machine."""
        ...

    def origin(self) -> dict[str, str]:
        """Where its programs' interpreter comes from (``/v1/runtime`` adds it to what they report)."""
        ...
