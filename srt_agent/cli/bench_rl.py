"""`srt-agent bench ablation | paper`: SRT measured through the trainer, in real RL steps: its stages one at a
time, and every rollout method side by side in GRPO, DAPO and PPO runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from ..config.schema import ALGORITHMS
from ..console import progress
from .bench import IN_OUT, JSON, PLOT_PNG
from .common import bench_app, console, reported, write_json
from .quiet import command_log, third_party_output_to


@bench_app.command("ablation")
def bench_ablation(
    env_file: Path = typer.Option(
        Path("envs/retool_train.yaml"), "--env", help="Env config (YAML) whose RL steps are measured."
    ),
    steps: int = typer.Option(6, min=1, help="Consecutive RL steps."),
    dataset_n: int = typer.Option(
        8, min=1, help="Distinct prompts (they come back every dataset_n / prompts_per_step steps)."
    ),
    start: list[str] = typer.Option(
        ["prompt"], "--start", help="Run-ahead start(s): prompt and/or branch (one stage each)."
    ),
    model: str | None = typer.Option(None, help="Override the config's model."),
    out: Path | None = typer.Option(
        None, help="Run folder: rollouts, report, traces (default runs/ablation, with --quick runs/ablation-quick)."
    ),
    update_bubble: bool = typer.Option(
        True, "--update-bubble/--no-update-bubble", help="Also time a policy update with run-ahead beside it."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override any config key, e.g. --set engine.run_ahead.slack=0.2 (repeatable)."
    ),
    quick: bool = typer.Option(False, "--quick", help="Tiny random model, two tiny steps: seconds."),
    json_path: Path | None = JSON,
    plot: Path | None = PLOT_PNG,
    verbose: bool = IN_OUT,
):
    """SRT's stages step by step through the trainer: history-only trees, + online updates, + run-ahead."""
    from ..bench.ablation import AblationConfig, ablation_tables, plot_ablation, run_ablation

    if quick:
        config = dataclasses.replace(
            AblationConfig.quick(), env=str(env_file), overrides=AblationConfig.quick().overrides + list(set_)
        )
        config.out = str(out or config.out)
    else:
        config = AblationConfig(
            env=str(env_file),
            steps=steps,
            dataset_n=dataset_n,
            starts=tuple(start),
            model=model,
            out=str(out or "runs/ablation"),
            update_bubble=update_bubble,
            overrides=list(set_),
        )
    units = config.steps + config.update_bubble  # the steps, then the update bubble's measurement
    plan = f"{config.steps} RL steps of {config.env}, starts {', '.join(config.starts)}" + (
        "; seconds" if quick else "; with SmolLM2 about 30-60 min on 2 cores, estimated"
    )
    with (
        reported(),
        third_party_output_to(command_log("bench-ablation", config.out), console, verbose),
        progress(console, "bench ablation", units, plan=plan) as work,
    ):
        result = run_ablation(config, log=lambda line: console.print(line, highlight=False), work=work)
    for table in ablation_tables(result):
        console.print(table)
    write_json(result, json_path)
    if plot is not None:
        console.print(f"wrote {plot_ablation(result, plot)}")


@bench_app.command("paper")
def bench_paper(
    env_file: Path = typer.Option(
        Path("envs/retool_train.yaml"), "--env", help="Env config (YAML) whose RL runs are measured."
    ),
    algorithm: list[str] = typer.Option(list(ALGORITHMS), "--algorithm", help="Algorithms (one RL run each)."),
    method: list[str] = typer.Option(
        [], "--method", help="Methods to compare (default: all; unavailable ones are skipped)."
    ),
    steps: int = typer.Option(3, min=1, help="RL steps per algorithm."),
    prompts: int = typer.Option(4, min=1, help="Prompts per step."),
    samples: int = typer.Option(4, min=1, help="Samples per prompt (a GRPO group)."),
    ablation_samples: int = typer.Option(
        8, min=0, help="Samples per prompt of the n-ablation's GRPO run (0: skip it)."
    ),
    model: str | None = typer.Option(None, help="Override the config's model."),
    out: Path | None = typer.Option(
        None, help="Run folders, one per algorithm (default runs/paper, runs/paper-quick)."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override any config key, e.g. --set max_turns=2 (repeatable)."),
    quick: bool = typer.Option(
        False, "--quick", help="Two short steps per algorithm, 2 prompts × 2 samples (43 min on 2 CPU cores)."
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Write the result as JSON here (also after every run)."),
    plot: Path | None = typer.Option(None, "--plot", help="Write PNGs of generation time over steps into this folder."),
    from_json: list[Path] = typer.Option(
        [], "--from-json", help="Run nothing: merge these results (e.g. one per algorithm) and report them."
    ),
    verbose: bool = IN_OUT,
):
    """SRT's Table 1 measured here: every rollout method side by side in GRPO, DAPO and PPO runs."""
    from ..bench.paper import PAPER_METHODS, PaperBenchConfig, merge_results, paper_plan, paper_steps, run_paper_bench

    if from_json:
        paper_report(merge_results([json.loads(p.read_text()) for p in from_json]), json_path, plot)
        return

    base = (
        PaperBenchConfig.quick()
        if quick
        else PaperBenchConfig(
            steps=steps,
            prompts_per_step=prompts,
            samples=samples,
            dataset_n=2 * prompts,
            ablation_samples=ablation_samples,
        )
    )
    config = dataclasses.replace(
        base,
        env=str(env_file),
        algorithms=tuple(algorithm),
        model=model,
        overrides=base.overrides + list(set_),
        out=str(out) if out is not None else base.out,
        methods=tuple(method) if method else tuple(m.name for m in PAPER_METHODS),
    )
    with (
        reported(),
        third_party_output_to(command_log("bench-paper", config.out), console, verbose),
        progress(console, "bench paper", paper_steps(config), plan=paper_plan(config)) as work,
    ):
        result = run_paper_bench(
            config,
            log=lambda line: console.print(line, highlight=False),
            on_run=lambda partial: write_json(partial, json_path),
            work=work,
        )
    paper_report(result, json_path, plot)


def paper_report(result: dict, json_path: Path | None, plot: Path | None) -> None:
    """The paper benchmark's tables, its JSON and its plots."""
    from ..bench.paper import ablation_table, paper_table, plot_paper

    console.print(paper_table(result), markup=False, highlight=False, soft_wrap=True)
    console.print(ablation_table(result), markup=False, highlight=False, soft_wrap=True)
    write_json(result, json_path)
    for path in plot_paper(result, plot) if plot is not None else []:
        console.print(f"wrote {path}")
