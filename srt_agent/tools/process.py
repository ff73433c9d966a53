"""Run one child process with a wall-clock deadline and a cap on how much output it may write, and read
what became of it as a sandbox's result (:func:`classify`, shared by the local and the Docker sandbox).

Output is read incrementally from non-blocking pipes; reading stops (and the process group is
killed) as soon as the cap is passed, so a program printing 100 MB costs at most the cap in memory.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .base import SandboxResult, is_memory_error

_CHUNK = 65536


@dataclass
class ProcessOutcome:
    """What a capped run produced. `returncode` is Popen's (negative: killed by that signal)."""

    returncode: int
    stdout: bytes
    stderr: bytes
    wall_s: float
    timed_out: bool
    output_limited: bool


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_capped(
    argv: Sequence[str],
    *,
    stdin: bytes = b"",
    timeout_s: float,
    max_output_bytes: int,
    pass_fds: Sequence[int] = (),
    user: int | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    on_spawn: Callable[[subprocess.Popen], None] | None = None,
) -> ProcessOutcome:
    """Run `argv` in a new session; kill its process group at the deadline or past the output cap.

    `max_output_bytes` bounds stdout and stderr together. `user`, when given, is both the uid and
    the gid the child runs as (supplementary groups dropped). `on_spawn(proc)` runs right after the
    start; if it raises, the process is killed and the error propagates.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
        cwd=cwd,
        env=env,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )
    if on_spawn is not None:
        try:
            on_spawn(proc)
        except BaseException:
            _kill_group(proc)
            proc.wait()
            _close_pipes(proc)
            raise
    stdout, stderr, timed_out, output_limited = _pump(proc, stdin, deadline, max_output_bytes)
    if timed_out or output_limited:
        _kill_group(proc)
    try:
        returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        returncode = proc.wait()
    _close_pipes(proc)
    return ProcessOutcome(
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        wall_s=time.monotonic() - start,
        timed_out=timed_out,
        output_limited=output_limited,
    )


def _pump(
    proc: subprocess.Popen, stdin: bytes, deadline: float, max_output_bytes: int
) -> tuple[bytes, bytes, bool, bool]:
    """Feed `stdin` and read stdout and stderr until both close, the deadline passes or the output passes
    the cap: (stdout, stderr, timed out, output limited), the output cut at the cap."""
    in_fd, out_fd, err_fd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    total = 0
    timed_out = output_limited = False
    pending = memoryview(stdin)
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream.fileno(), selectors.EVENT_READ)
        if pending:
            os.set_blocking(in_fd, False)
            sel.register(in_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        readers = 2
        while readers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                fd = key.fd
                if fd == in_fd:
                    try:
                        pending = pending[os.write(fd, pending[:_CHUNK]) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                data = os.read(fd, _CHUNK)
                if not data:
                    sel.unregister(fd)
                    readers -= 1
                    continue
                keep = max(max_output_bytes - total, 0)
                chunks[fd].append(data[:keep])
                total += len(data)
                if total > max_output_bytes:
                    output_limited = True
                    readers = 0
                    break
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), timed_out, output_limited


def _close_pipes(proc: subprocess.Popen) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        stream.close()


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
