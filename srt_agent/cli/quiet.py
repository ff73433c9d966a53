"""Keep the console for the project's own lines: what libraries print goes to a log, for every command that
starts a model (`train`, `eval`, `serve`, `rollout`, the benchmarks that load one); `--verbose` shows it.

vLLM, Triton, transformers, uvicorn and native code (OpenMP, NUMA binding) print start-up messages, warnings
and progress bars (a GGUF model's conversion) to the process's stdout and stderr, some from C or from child
processes. So the file descriptors themselves are pointed at the log for the duration, while the rich
console keeps writing to the terminal it had. Warnings raised by srt-agent's own modules still reach the
console. The log is the command's run folder's `third-party.log`, or `runs/<command>/third-party.log` for a
command without one (:func:`command_log`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console

LOG_NAME = "third-party.log"
PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def command_log(command: str, out: Path | None = None) -> Path:
    """Where `command`'s library output goes: its run folder `out`, else ``runs/<command>``."""
    return (Path(out) if out is not None else Path("runs") / command) / LOG_NAME


def verbose_option(where: str):
    """The `--verbose` option of a command whose library output goes to `where`."""
    return typer.Option(
        False,
        "--verbose",
        help=f"Show what libraries print (vLLM, transformers, ...) instead of logging it to {where}.",
    )


def _real_fd(stream) -> int | None:
    """The file descriptor behind `stream`, or None for an in-memory stream (a test's captured output)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


@contextmanager
def third_party_output_to(log_path: Path, console: Console, verbose: bool = False) -> Iterator[bool]:
    """Within the block, stdout and stderr (file descriptors 1 and 2, so C code and child processes too)
    append to `log_path` and `console` prints to the terminal; on a failure the console names the log.
    Yields whether the output goes to the log.

    Nothing changes with `verbose`, or when stdout is not a real file (in-process callers, tests)."""
    if verbose or _real_fd(sys.stdout) != 1 or _real_fd(sys.stderr) != 2:
        yield False
        return
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:  # an unwritable run folder: the run itself says so in one line
        yield False
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding=sys.stdout.encoding, errors="replace")
    previous_file, previous_showwarning = console.file, warnings.showwarning

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if str(filename).startswith(PACKAGE_DIR):
            console.print(f"[yellow]warning: {message}[/yellow]", highlight=False)
        else:
            previous_showwarning(message, category, filename, lineno, file, line)

    console.file = terminal
    warnings.showwarning = show_warning
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    try:
        yield True
    except (Exception, SystemExit) as exc:  # uvicorn exits 1 when it cannot listen
        if not isinstance(exc, SystemExit) or exc.code not in (0, None):
            console.print(f"[dim]what libraries printed is in {log_path}[/dim]", highlight=False)
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)
        console.file = previous_file
        warnings.showwarning = previous_showwarning
        terminal.close()
