"""What every command shares: the Typer apps, the console, JSON output, and the vLLM start-up."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="srt-agent: fast, exactly on-policy multi-turn RL rollouts (SRT).", no_args_is_help=True)
bench_app = typer.Typer(help="Side-by-side benchmarks with JSON output.", no_args_is_help=True)
sandbox_app = typer.Typer(help="The code sandbox.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(sandbox_app, name="sandbox")
# Piped output (logs, CI) gets room for the wide benchmark tables instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 140)


def preload_for_vllm() -> None:
    """vLLM runs fastest on CPU with Intel OpenMP and tcmalloc preloaded, which only takes effect when a
    process starts: the `srt-agent` command re-runs itself once with LD_PRELOAD set (called only where
    vLLM will run; in-process callers, e.g. tests, are left alone)."""
    import os

    from ..backends.vllm import preload_env, vllm_missing
    from ..backends.vllm.device_settings import cpu_build

    if Path(sys.argv[0]).name != "srt-agent" or vllm_missing() or not cpu_build():  # a GPU vLLM: no CPU preloads
        return
    env = preload_env()
    if env is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def write_json(result: dict, path: Path | None) -> None:
    """Write a benchmark's JSON result to `path` (creating folders) when one is given."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    console.print(f"[green]wrote {path}[/green]")


ERROR = "[red]error:[/red] {}"  # bad input
PLAIN = "[red]{}[/red]"  # a sandbox or benchmark that cannot run here


def bad_input() -> tuple[type[Exception], ...]:
    """What a command reports as bad input: a config or value that does not validate (`ConfigError` is a
    ValueError), a missing file, a sandbox that cannot start."""
    from ..tools import SandboxUnavailable

    return (ValueError, FileNotFoundError, SandboxUnavailable)


@contextmanager
def reported(*errors: type[Exception], code: int = 2, message: str = ERROR) -> Iterator[None]:
    """The commands' error handler: an expected failure in the block (one of `errors`; default: `bad_input`)
    is printed as one red line, never a traceback, and the command exits with `code`: 2 for bad input, 1
    where a benchmark or the sandbox cannot run here. `message` formats the exception."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, errors or bad_input()):
            raise
        console.print(message.format(exc), highlight=False)
        raise typer.Exit(code) from None
