"""`srt-agent bench project RUN`: what SRT would buy a recorded run on a GPU, from its own rollouts."""

from __future__ import annotations

from pathlib import Path

import typer

from .bench import JSON
from .common import bench_app, console, reported, write_json


@bench_app.command("project")
def bench_project(
    run: Path = typer.Argument(
        ...,
        help="A run folder of srt-agent train, a rollout trace or a shipped trace's name (retool_long), or a verl trainer.rollout_data_dir.",
    ),
    device: str = typer.Option("H100", help="The GPU to project onto: H100, H200, A100 or L40S."),
    model: Path | None = typer.Option(None, help="The model shape: a Hugging Face config.json (default Qwen2.5-1.5B)."),
    tokenizer: str | None = typer.Option(
        None, help="verl dumps only: the run's model (an HF folder or model spec) whose tokenizer reads its text."
    ),
    max_batch: int | None = typer.Option(None, min=1, help="Rows at once (default: the run's; 256 for verl dumps)."),
    fixed_ms: float | None = typer.Option(None, min=0.0, help="Cost per step outside the kernels (default 1 ms)."),
    host_us: float | None = typer.Option(
        None, min=0.0, help="The drafter's host µs per row and step (default: the run's measured figure)."
    ),
    overlap_host: bool = typer.Option(False, help="The drafter's host work runs beside the GPU's (async scheduling)."),
    json_path: Path | None = JSON,
):
    """Replay a recorded run's rollouts through none, SRT (with run-ahead where recorded) and SuffixDecoding on a
    GPU's roofline, and check the replay against the run's measured generation times."""
    from ..bench.project import project_run
    from ..rl.projection import ProjectionSettings, projection_lines
    from ..rl.roofline_cost import FIXED_S

    settings = ProjectionSettings(device, model, FIXED_S * 1e3 if fixed_ms is None else fixed_ms, host_us, overlap_host)
    with reported():
        loaded = None
        if tokenizer is not None:
            from ..models import load_tokenizer

            loaded = load_tokenizer(tokenizer)
        result = project_run(run, settings, loaded, max_batch)
    for line in projection_lines(result):
        console.print(line, highlight=False)
    for name, figures in result["methods"].items():
        console.print(f"  {name}: {figures['tokens_per_forward']:.2f} tokens per forward", highlight=False)
    write_json(result, json_path)
