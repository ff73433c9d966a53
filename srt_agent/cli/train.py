"""`srt-agent train`: RL training (cold start, then GRPO / DAPO / PPO with SRT rollouts), the main job."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from .common import app, bad_input, console, preload_for_vllm, reported
from .quiet import LOG_NAME, command_log, third_party_output_to, verbose_option


@app.command()
def train(
    env_file: Path = typer.Argument(..., help="Env config (YAML) with optional train: and cold_start: sections."),
    steps: int | None = typer.Option(None, min=1, help="RL steps (default: the config's train.steps)."),
    out: Path | None = typer.Option(
        None,
        help="Run folder for checkpoints, logs and reports (default: runs/<env name>, or runs/<env name>-N when that holds a run; the resumed run's with --resume).",
    ),
    resume: Path | None = typer.Option(
        None,
        help="Continue a run from its folder (its newest checkpoint) or a step folder; the run goes on in its own folder.",
    ),
    compare: str | None = typer.Option(
        None, help="Comma-separated drafters that regenerate every step for timing, e.g. none,suffix."
    ),
    algorithm: str | None = typer.Option(None, help="grpo, dapo or ppo (default: the config's)."),
    model: str | None = typer.Option(
        None, help="Override the config's model: smollm2, tiny-llama, an HF dir, a .gguf."
    ),
    cold_start: bool | None = typer.Option(
        None, "--cold-start/--no-cold-start", help="Run (or skip) the SFT cold start."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override any config key, e.g. --set train.lr=1e-5 (repeatable)."),
    backend: str | None = typer.Option(
        None, help="Rollout backend: engine (ours), vllm, or auto (default: the config's engine.backend)."
    ),
    keep_checkpoints: int | None = typer.Option(
        None, min=1, help="Newest checkpoints the run folder keeps (default: the config's train.keep_checkpoints, 1)."
    ),
    max_memory: float | None = typer.Option(
        None,
        help="GB the run may plan for (all its processes); it refuses to start above (default: the config's "
        "train.max_memory_gb, else the machine's available memory).",
    ),
    verbose: bool = verbose_option(f"OUT/{LOG_NAME}"),
):
    """RL training: ReTool cold start, then GRPO / DAPO / PPO with SRT rollouts (the main job)."""
    from ..config import load_env_config
    from ..rl.checkpoint import claim_out_dir, fresh_run_folder, run_folder
    from ..rl.coldstart import ColdStartError
    from ..rl.trainer import Trainer

    overrides = (
        list(set_)
        + ([f"train.algorithm={algorithm}"] if algorithm else [])
        + ([f"engine.backend={backend}"] if backend else [])
        + ([f"train.max_memory_gb={max_memory}"] if max_memory is not None else [])
        + ([f"train.keep_checkpoints={keep_checkpoints}"] if keep_checkpoints is not None else [])
    )
    try:
        with reported(ColdStartError, *bad_input()):
            config = load_env_config(env_file, overrides)
            if config.engine.backend in ("vllm", "auto"):
                preload_for_vllm()
            names = [c.strip() for c in compare.split(",") if c.strip()] if compare is not None else None
            config = config.for_run(steps=steps, compare=names, cold_start=cold_start)
            if out is None and resume is None:  # the default folder: a new run never lands on an old one
                out = fresh_run_folder(Path("runs") / config.name)
                if out.name != config.name:
                    console.print(f"runs/{config.name} holds an earlier run: this one goes to {out}", highlight=False)
            out = out or run_folder(resume)
            claim_out_dir(out, resume, replace_run=False)  # before its log: another run's folder stays untouched
            with third_party_output_to(command_log("train", out), console, verbose):
                trainer = Trainer(config, out, resume=resume, model=model, console=console)
                report = trainer.run()
    except KeyboardInterrupt:
        console.print(interrupted_line(out), highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    if report.get("interrupted"):
        console.print(interrupted_line(out), highlight=False, soft_wrap=True)
        raise typer.Exit(130)


def interrupted_line(out: Path | None) -> str:
    """One line after Ctrl-C: where the newest checkpoint is and the exact command that continues the run."""
    from ..rl.checkpoint import find_checkpoint

    try:
        saved = find_checkpoint(out) if out is not None else None
    except FileNotFoundError:
        saved = None
    if saved is None:
        return "[yellow]interrupted before the first RL step finished: nothing to resume[/yellow]"
    args, skip = [], False
    for arg in sys.argv[1:]:  # the same command, with --resume OUT instead of --out/--resume
        if skip:
            skip = False
        elif arg in ("--out", "--resume"):
            skip = True
        elif not arg.startswith(("--out=", "--resume=")):
            args.append(arg)
    command = shlex.join(["srt-agent", *args, "--resume", str(out)])
    step = int(saved.name.removeprefix("step-"))
    return f"[yellow]interrupted: step {step} saved in {saved}; continue with: {command}[/yellow]"
