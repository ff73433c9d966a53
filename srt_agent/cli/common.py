"""What every command shares: the Typer apps, the console, JSON output, and the vLLM start-up."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

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

    from ..backends import vllm_missing
    from ..integrations.vllm import preload_env

    if Path(sys.argv[0]).name != "srt-agent" or vllm_missing():
        return
    env = preload_env()
    if env is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def write_json(result: dict, path: Optional[Path]) -> None:
    """Write a benchmark's JSON result to `path` (creating folders) when one is given."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    console.print(f"[green]wrote {path}[/green]")
