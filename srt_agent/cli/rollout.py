"""`srt-agent rollout`: multi-turn rollouts of an env config, written as JSONL."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import app, console, preload_for_vllm, reported, write_json
from .quiet import command_log, third_party_output_to, verbose_option


@app.command()
def rollout(
    env_file: Path = typer.Argument(..., help="Env config (YAML), e.g. envs/retool_arith.yaml."),
    model: str | None = typer.Option(
        None, help="Override the config's model: smollm2, tiny-llama, an HF dir, a .gguf."
    ),
    n: int | None = typer.Option(None, "--n", min=1, help="Samples per task (default: the config's n_samples)."),
    limit: int | None = typer.Option(None, min=1, help="Use at most this many tasks."),
    drafter: str | None = typer.Option(None, help="Override the engine's drafter (none, srt, ngram, suffix, ...)."),
    backend: str | None = typer.Option(
        None, help="Rollout backend: engine (ours), vllm, or auto (default: the config's engine.backend)."
    ),
    out: Path = typer.Option(Path("rollouts.jsonl"), help="Where to write one JSON line per trajectory."),
    json_path: Path | None = typer.Option(None, "--json", help="Also write the summary as JSON here."),
    verbose: bool = verbose_option(command_log("rollout")),
):
    """Multi-turn rollouts of an env config with the embedded model and the local sandbox; writes JSONL."""
    from dataclasses import asdict

    from ..agent.report import rollout_env_file

    if backend in ("vllm", "auto"):
        preload_for_vllm()
    options = dict(model=model, n_samples=n, limit=limit, drafter=drafter, out=out, backend=backend)
    with reported(), third_party_output_to(command_log("rollout"), console, verbose):
        summary = rollout_env_file(env_file, console, **options)
    write_json(asdict(summary), json_path)
