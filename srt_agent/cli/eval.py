"""`srt-agent eval`: held-out evaluation of an env (base model or a checkpoint's policy) with 95% intervals."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import app, bad_input, console, preload_for_vllm, reported
from .quiet import LOG_NAME, command_log, third_party_output_to, verbose_option


@app.command("eval")
def eval_(
    env_file: Path = typer.Argument(..., help="Env config (YAML), e.g. envs/reasoning_gym_mix.yaml."),
    checkpoint: Path | None = typer.Option(
        None, help="Evaluate the policy of this checkpoint: a run folder (its newest step) or a step folder."
    ),
    n: int | None = typer.Option(
        None, "--n", min=1, help="Tasks to evaluate (default: the config's cold_start.eval_tasks, or 12)."
    ),
    samples: int = typer.Option(1, min=1, help="Samples per task."),
    tasks: str = typer.Option(
        "held-out",
        help="held-out: the trainer's held-out tasks (unseen in training, cold_start.eval_seed); "
        "dataset: the env's own dataset (e.g. a test file named by dataset.source).",
    ),
    out: Path | None = typer.Option(
        None, help="Folder for report.json, summary.md and rollouts.jsonl (default: runs/<env name>-eval)."
    ),
    model: str | None = typer.Option(
        None, help="Override the config's model: smollm2, tiny-llama, an HF dir, a .gguf."
    ),
    backend: str | None = typer.Option(
        None, help="Rollout backend: engine (ours), vllm, or auto (default: the config's engine.backend)."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override any config key, e.g. --set sampling.temperature=0.7."),
    verbose: bool = verbose_option(f"OUT/{LOG_NAME}"),
):
    """Held-out evaluation of an env: accuracy, tool use and reward with 95% intervals (report.json, summary.md)."""
    from ..config import load_env_config
    from ..rl.policy_eval import run_eval

    overrides = list(set_) + ([f"engine.backend={backend}"] if backend else [])
    with reported(*bad_input()):
        if tasks not in ("held-out", "dataset"):
            raise ValueError(f"--tasks {tasks!r}: choose held-out or dataset")
        if not env_file.is_file():
            raise FileNotFoundError(f"env file {env_file} does not exist")
        config = load_env_config(env_file, overrides)
        if config.engine.backend in ("vllm", "auto"):
            preload_for_vllm()
        out = out or Path("runs") / f"{config.name}-eval"
        with third_party_output_to(command_log("eval", out), console, verbose):
            run_eval(
                config, out, checkpoint=checkpoint, n=n, n_samples=samples, tasks=tasks, model=model, console=console
            )
