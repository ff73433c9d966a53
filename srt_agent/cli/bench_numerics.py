"""`srt-agent bench gap | gpu`: what a device's numbers are: the sampler-trainer gap of log-probs, one source
changed at a time, and the GPU check (exactness, speed, a GRPO step and a profile on the device)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..console import progress
from .bench import BATCH_INVARIANT, IN_OUT, JSON, MODEL, batch_invariant_choice
from .common import PLAIN, bench_app, console, reported, write_json
from .quiet import command_log, third_party_output_to


@bench_app.command("gap")
def bench_gap(
    model: str = MODEL,
    backend: str = typer.Option("engine", help="engine (ours) or vllm."),
    dtype: str = typer.Option("bfloat16", help="What the backend samples in: bfloat16, float16 or float32."),
    batch_invariant: str = BATCH_INVARIANT,
    prompts: int = typer.Option(8, min=1, help="Chat prompts, each sampled once."),
    max_tokens: int = typer.Option(64, min=1, help="Tokens per sample."),
    quick: bool = typer.Option(False, "--quick", help="Tiny random model, 2 prompts × 8 tokens: seconds."),
    json_path: Path | None = JSON,
):
    """The gap between a sampled token's log-prob and the trainer's, with one source changed at a time."""
    from ..bench.gap import GapConfig, run_gap

    invariant = batch_invariant_choice(batch_invariant)
    if quick:
        model, prompts, max_tokens = "tiny-llama", 2, 8
    plan = f"{model} on {backend} in {dtype}, {prompts} prompts × {max_tokens} tokens"
    with progress(console, "bench gap", 3, plan=plan) as work:
        result = run_gap(GapConfig(model, backend, dtype, invariant, prompts, max_tokens), work)
    console.print(f"{backend} in {dtype} (exact attention: {result['exact_attention']}), {result['tokens']} tokens")
    for name, row in result["rows"].items():
        console.print(f"  {name}: mean {row['logprob_diff_mean']:.2e}, max {row['logprob_diff_max']:.2e}")
    write_json(result, json_path)


@bench_app.command("gpu")
def bench_gpu(
    out: Path = typer.Option(..., "--out", help="Folder for one JSON per stage and summary.json."),
    device: str = typer.Option("auto", help="auto (CUDA when present), cuda or cpu."),
    quick: bool = typer.Option(False, "--quick", help="Tiny models and workloads: the dry run (seconds on a CPU)."),
    stage: list[str] = typer.Option([], "--stage", help="Stages to run (default: exactness, speed, train, profile)."),
    budget: float | None = typer.Option(None, min=10, help="Seconds for all stages (default 450; --quick: 120)."),
    verbose: bool = IN_OUT,
):
    """The GPU check: exactness on the device, the engine in bf16 on Qwen2.5-shaped random models (SRT vs none,
    verification cost), one GRPO step and a profiled batch-64 step; exits 1 if a stage failed."""
    from ..bench.gpu import run_gpu_check
    from ..bench.gpu_setup import GpuCheckConfig

    config = GpuCheckConfig.dry_run(device) if quick else GpuCheckConfig(device=device)
    config.stages = tuple(stage) or config.stages
    config.budget_s = budget or config.budget_s
    plan = f"stages {', '.join(config.stages)} within {config.budget_s:.0f} s"
    with (
        reported(ValueError, code=1, message=PLAIN),
        third_party_output_to(command_log("bench-gpu", out), console, verbose),
        progress(console, "bench gpu", len(config.stages), plan=plan) as work,
    ):
        summary = run_gpu_check(config, out, log=lambda line: console.print(line, highlight=False), work=work)
    for name, row in summary["stages"].items():
        console.print(
            f"{name}: {row['status']} in {row['wall_s']:.0f} s {json.dumps(row['headline'])}", highlight=False
        )
    console.print(f"[green]wrote {out}[/green]")
    if any(row["status"] == "error" for row in summary["stages"].values()):
        raise typer.Exit(1)
