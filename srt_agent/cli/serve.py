"""`srt-agent serve`: an OpenAI-compatible rollout server (chat and completions, with token ids, log-probs
and multi-turn sessions) over the backend the env config's ``engine:`` section picks."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import app, bad_input, console, preload_for_vllm, reported
from .quiet import command_log, third_party_output_to, verbose_option


@app.command()
def serve(
    env_file: Path = typer.Argument(..., help="Env config (YAML): its model and engine: sections are served."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
    model: str | None = typer.Option(
        None, help="Override the config's model: smollm2, tiny-llama, an HF dir, a .gguf (also the served model name)."
    ),
    backend: str | None = typer.Option(
        None, help="Rollout backend: engine (ours), vllm, or auto (default: the config's engine.backend)."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override any config key, e.g. --set engine.max_context=4096."),
    log_level: str = typer.Option("info", help="uvicorn's log level."),
    verbose: bool = verbose_option(command_log("serve")),
):
    """OpenAI-compatible rollout server: /v1/chat/completions, /v1/completions, /v1/models, sessions under /sessions/{sid}/v1."""
    from ..config import load_env_config
    from ..serve import RolloutServer

    overrides = list(set_) + ([f"engine.backend={backend}"] if backend else [])
    log = command_log("serve")
    with reported(*bad_input()):
        config = load_env_config(env_file, overrides)
        if config.engine.backend in ("vllm", "auto"):
            preload_for_vllm()
        with third_party_output_to(log, console, verbose) as quiet:
            server = RolloutServer.from_config(
                config, model=model, log=lambda line: console.print(line, highlight=False)
            )
            url = f"http://{host}:{port}"
            console.print(
                f"serving [bold]{server.model_name}[/bold] on {url}/v1 (sessions: {url}/sessions/<id>/v1)",
                highlight=False,
            )
            if quiet:
                console.print(f"[dim]uvicorn's and the libraries' lines: {log} (--verbose shows them here)[/dim]")
            try:
                server.serve(host=host, port=port, log_level=log_level)
            finally:
                server.close()
