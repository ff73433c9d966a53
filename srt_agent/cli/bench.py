"""`srt-agent bench …`: the benchmarks of `srt_agent.bench`, each a thin shell that prints tables and writes JSON."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer
from rich.table import Table

from ..console import progress
from .common import PLAIN, bench_app, console, preload_for_vllm, reported, write_json
from .quiet import LOG_NAME, command_log, third_party_output_to, verbose_option

# Options several benchmarks take alike.
MODEL = typer.Option("smollm2", help="Model: 'smollm2', 'tiny-llama', an HF directory or a .gguf file.")
JSON = typer.Option(None, "--json", help="Write the result as JSON here.")
PLOT_PNG = typer.Option(None, "--plot", help="Also draw the result as a PNG here.")
IN_OUT = verbose_option(f"OUT/{LOG_NAME}")  # --verbose of a benchmark with a run folder
BATCH_INVARIANT = typer.Option(
    "auto", help="The engine's float64 attention: on, off or auto (on a CPU whose linears are batch-invariant)."
)


def batch_invariant_choice(value: str) -> bool | str:
    """``--batch-invariant``'s on / off / auto as the engine takes it."""
    if value not in ("auto", "on", "off"):
        raise typer.BadParameter("choose on, off or auto", param_hint="--batch-invariant")
    return value if value == "auto" else value == "on"


@bench_app.command("engine")
def bench_engine(
    model: str = MODEL,
    prompts: int = typer.Option(4, min=1, help="Distinct chat prompts."),
    samples: int = typer.Option(2, min=1, help="Samples per prompt (at least enough to fill the batch)."),
    epochs: int = typer.Option(2, min=1, help="Passes over the same prompts, drafter trees kept (new seeds each)."),
    max_tokens: int = typer.Option(64, min=1, help="Tokens per sample."),
    batch: list[int] = typer.Option([], "--batch", help="Batch sizes (engine max_batch; default 1 and 8)."),
    method: list[str] = typer.Option([], "--method", help="Drafters (default: none, srt and arctic)."),
    everything: bool = typer.Option(
        False, "--all", help="Every exactly on-policy drafter at batch 1, 8 and 32, with transformers' generate."
    ),
    hf: bool | None = typer.Option(
        None, "--hf/--no-hf", help="Also time transformers' generate at batch 1 (default: with --all)."
    ),
    max_draft_tokens: int = typer.Option(16, min=0, help="Draft nodes per sequence and step, at most."),
    adaptive: bool = typer.Option(
        True, "--adaptive/--no-adaptive", help="Size drafts with the cost model, or verify every drafted node."
    ),
    threads: int | None = typer.Option(None, min=1, help="torch threads (default: torch's choice)."),
    dtype: str = typer.Option(
        "float32", help="Policy dtype: float32 or bfloat16 (bf16 matmuls use AMX where the CPU has it)."
    ),
    seed: int = typer.Option(0),
    batch_invariant: str = BATCH_INVARIANT,
    quick: bool = typer.Option(False, "--quick", help="Tiny random model, tiny workload: seconds."),
    json_path: Path | None = JSON,
    plot: Path | None = PLOT_PNG,
    verbose: bool = verbose_option(command_log("bench-engine")),
):
    """The speculative engine per drafter and batch size (tokens/s, tokens per forward, speedup); by default
    none, srt and arctic at batch 1 and 8 (minutes), with --all every drafter at batch 1, 8 and 32."""
    invariant = batch_invariant_choice(batch_invariant)
    from ..bench.engine import EngineBenchConfig, engine_plan, result_lines, run_engine_bench, summary_table

    sizes = dict(
        model=model,
        prompts=prompts,
        samples=samples,
        epochs=epochs,
        max_tokens=max_tokens,
        max_draft_tokens=max_draft_tokens,
        seed=seed,
        threads=threads,
    )
    config = EngineBenchConfig.quick() if quick else EngineBenchConfig.everything(**sizes) if everything else None
    config = dataclasses.replace(
        config or EngineBenchConfig(**sizes), dtype=dtype, adaptive_drafts=adaptive, batch_invariant=invariant
    )
    config.methods = tuple(method) or config.methods
    config.batches = tuple(batch) or config.batches
    config.hf_baseline = config.hf_baseline if hf is None else hf
    with (
        third_party_output_to(command_log("bench-engine"), console, verbose),
        progress(console, "bench engine", config.runs(), plan=engine_plan(config)) as work,
    ):

        def report(run: dict) -> None:
            work.done(f"{run['method']} b={run['batch']} epoch {run['epoch']}: {run['tokens_per_s']:.1f} tok/s")

        with reported(ValueError, code=1, message=PLAIN):
            result = run_engine_bench(config, report, work.now)
    console.print(summary_table(result))
    for note in result_lines(result):
        console.print(f"[dim]{note}[/dim]")
    write_json(result, json_path)
    if plot is not None:
        from ..bench.engine_plot import plot_engine_bench

        console.print(f"wrote {plot_engine_bench(result, plot)}")


@bench_app.command("prefix")
def bench_prefix(
    env_file: Path = typer.Argument(
        Path("envs/retool_arith.yaml"), help="Env config (YAML) whose rollouts are measured."
    ),
    model: str | None = typer.Option(None, help="Override the config's model."),
    limit: int = typer.Option(4, min=1, help="Tasks (each rolled out n times)."),
    n: list[int] = typer.Option([4, 8], "--n", min=1, help="Group sizes (samples per task); repeat the option."),
    drafter: list[str] = typer.Option(["none", "srt"], help="Drafters; the first is the reference; repeat the option."),
    max_batch: int | None = typer.Option(None, min=1, help="Override the config's engine max_batch."),
    quick: bool = typer.Option(False, "--quick", help="Tiny random model, one task in groups of 2: seconds."),
    json_path: Path | None = JSON,
    verbose: bool = verbose_option(command_log("bench-prefix")),
):
    """Rollouts with prefix sharing off and on (per group size and drafter): prefill computed, wall time, tokens/s."""
    from ..bench.prefix import PrefixBenchConfig, result_table, run_prefix_bench

    config = (
        PrefixBenchConfig.quick(env_file)
        if quick
        else PrefixBenchConfig(env_file, model, limit, tuple(n), tuple(drafter), max_batch)
    )
    plan = f"{config.limit} tasks in groups of {', '.join(map(str, config.group_sizes))}, drafters " + ", ".join(
        config.drafters
    )
    with (
        third_party_output_to(command_log("bench-prefix"), console, verbose),
        progress(console, "bench prefix", config.runs(), plan=f"{plan}, sharing off and on") as work,
    ):
        result = run_prefix_bench(
            config,
            lambda r: work.done(
                f"n={r.n} {r.drafter} sharing={'on' if r.sharing else 'off'}: {r.wall_s:.1f} s, "
                f"{r.tokens_per_s:.1f} tokens/s, prefill computed {r.prefill_computed} (unique {r.unique_prompt_tokens})"
            ),
        )
    console.print(result_table(result))
    for row in result["ratios"]:
        figures = {k: round(v, 2) for k, v in row.items() if isinstance(v, float)}
        if figures:
            console.print(
                f"[dim]n={row['n']} {row['drafter']} sharing={'on' if row['sharing'] else 'off'}: {figures}[/dim]"
            )
    write_json(result, json_path)


@bench_app.command("update")
def bench_update(
    model: str = MODEL,
    prompts: int = typer.Option(4, min=1, help="Prompts in the GRPO-shaped batch."),
    samples: int = typer.Option(4, min=1, help="Samples per prompt."),
    prompt_tokens: int = typer.Option(130, min=1, help="Tokens per prompt."),
    response_tokens: int = typer.Option(110, min=2, help="Tokens per response (a masked tool span included)."),
    micro_batch_tokens: int = typer.Option(768, min=64, help="Tokens per forward/backward."),
    lora_rank: int = typer.Option(16, min=1, help="LoRA rank of the LoRA row."),
    repeats: int = typer.Option(3, min=1, help="Interleaved repetitions (the best of each method counts)."),
    quick: bool = typer.Option(False, "--quick", help="Tiny random model, tiny batch: seconds."),
    json_path: Path | None = JSON,
    verbose: bool = verbose_option(command_log("bench-update")),
):
    """The trainer's update (packed, LM head on trained tokens only; full and LoRA) against plain HF forward+backward."""
    from ..bench.update import UpdateBenchConfig, run_update_bench

    config = (
        UpdateBenchConfig.quick()
        if quick
        else UpdateBenchConfig(
            model=model,
            prompts=prompts,
            samples=samples,
            prompt_tokens=prompt_tokens,
            response_tokens=response_tokens,
            tool_tokens=min(20, response_tokens // 4),
            micro_batch_tokens=micro_batch_tokens,
            lora_rank=lora_rank,
            repeats=repeats,
        )
    )
    plan = f"3 methods × {config.repeats} repeats of one update ({config.prompts} prompts × {config.samples} samples)"
    with (
        third_party_output_to(command_log("bench-update"), console, verbose),
        progress(console, "bench update", 3 * config.repeats, plan=plan) as work,
    ):
        result = run_update_bench(config, lambda name, s: work.done(f"{name}: {s:.1f} s"))
    table = Table(
        "method", "best s", "tokens/s", "trained tokens/s", "vs HF", title=f"{result['tokens']} tokens per update"
    )
    for name, row in result["methods"].items():
        table.add_row(
            name,
            f"{row['best_s']:.2f}",
            f"{row['tokens_per_s']:.1f}",
            f"{row['trained_tokens_per_s']:.1f}",
            f"{row['vs_hf']:.2f}x",
        )
    console.print(table)


@bench_app.command("roofline")
def bench_roofline(
    model: str = MODEL,
    dtype: str = typer.Option("float32", help="Policy dtype: float32 or bfloat16."),
    device: str = typer.Option("auto", help="auto (CUDA when present), cpu or cuda."),
    context: int = typer.Option(512, min=1, help="Tokens already cached per sequence."),
    reps: int = typer.Option(5, min=1, help="Rounds per measurement (the best is kept)."),
    threads: int | None = typer.Option(None, min=1, help="torch threads (default: torch's choice)."),
    profile: bool = typer.Option(True, "--profile/--no-profile", help="Also profile the 1- and 16-token steps."),
    clock: str = typer.Option("wall", help="wall, or cpu (process CPU time: on a shared machine, with --threads 1)."),
    quick: bool = typer.Option(False, "--quick", help="Tiny random model, a short context, one round: seconds."),
    json_path: Path | None = JSON,
    verbose: bool = verbose_option(command_log("bench-roofline")),
):
    """This device's bandwidth and GEMM throughput, the model's bytes and FLOPs, and each step shape's time vs its floor."""
    import torch

    from ..bench.roofline import roofline_lines, roofline_units, run_roofline
    from ..models import load_model

    if quick:
        model, context, reps = "tiny-llama", 32, 1
    if threads:
        torch.set_num_threads(threads)
    if clock not in ("wall", "cpu"):
        raise typer.BadParameter("choose wall or cpu", param_hint="--clock")
    plan = f"{model} at {context} tokens of context, {reps} rounds per measurement"
    with (
        reported(),
        third_party_output_to(command_log("bench-roofline"), console, verbose),
        progress(console, "bench roofline", roofline_units(profile), plan=plan) as work,
    ):
        work.now(f"loading {model}")
        loaded = load_model(model, dtype=dtype, device=device)
        result = run_roofline(loaded, context=context, reps=reps, profile=profile, clock=clock, work=work)
    for line in roofline_lines(result):
        console.print(line, highlight=False)
    write_json(result, json_path)


@bench_app.command("vllm")
def bench_vllm(
    env_file: Path = typer.Option(
        Path("envs/retool_train.yaml"), "--env", help="Env config (YAML) whose RL steps are measured."
    ),
    batch: list[int] = typer.Option(
        [],
        "--batch",
        min=1,
        help="Sequences each engine runs at once, one RL run per value (default 16; --all: 16 and 1).",
    ),
    method: list[str] = typer.Option(
        [],
        "--method",
        help="Methods (default: vllm:none, vllm:suffix, vllm:srt; --all: every one): vllm:none, vllm:stock (vLLM's "
        "own sampler), vllm:ngram, vllm:suffix, vllm:srt, vllm:srt+ahead (SRT with run-ahead), engine:none, engine:srt.",
    ),
    everything: bool = typer.Option(False, "--all", help="Every method at batch 16 and 1, 8 steps: hours on 2 cores."),
    steps: int | None = typer.Option(
        None,
        min=1,
        help="RL steps per run, the units the 95% intervals resample: fewer steps, wider intervals (default 4; --all 8).",
    ),
    prompts: int = typer.Option(4, min=1, help="Prompts per step."),
    samples: int = typer.Option(
        4, "--n", "--samples", min=1, help="Group size n: samples per prompt (a GRPO group; --samples: the same)."
    ),
    dataset_n: int = typer.Option(8, min=1, help="Distinct prompts (fewer than steps × prompts: prompts come back)."),
    model: str | None = typer.Option(None, help="Override the config's model."),
    out: Path = typer.Option(Path("runs/bench-vllm"), help="Run folders, one per batch size."),
    set_: list[str] = typer.Option([], "--set", help="Override any config key, e.g. --set max_turns=2 (repeatable)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the result as JSON here (also after every run)."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a PNG of generation time per step here."),
    verbose: bool = IN_OUT,
):
    """vLLM (none, stock, ngram, suffix, SRT as its proposer) and our engine (none, SRT) in the same RL steps,
    each ratio with a 95% paired bootstrap interval over the steps."""
    from ..bench.vllm import DEFAULT_VLLM_METHODS, VLLM_METHODS, VLLMBenchConfig, plot_vllm, run_vllm_bench, vllm_table

    preload_for_vllm()
    steps = steps or (8 if everything else 4)
    config = VLLMBenchConfig(
        env=str(env_file),
        batches=tuple(batch) or ((16, 1) if everything else (16,)),
        methods=tuple(method) or (tuple(m.name for m in VLLM_METHODS) if everything else DEFAULT_VLLM_METHODS),
        steps=steps,
        prompts_per_step=prompts,
        samples=samples,
        dataset_n=dataset_n,
        model=model,
        out=str(out),
        overrides=list(set_),
    )
    plan = (
        f"batch {', '.join(map(str, config.batches))}: {config.steps} RL steps each of {prompts} prompts × n = "
        f"{samples}, methods {', '.join(config.methods)}; "
        + ("about an hour per batch size on 2 cores, estimated" if everything else "about 10 minutes on 2 cores")
    )
    with (
        reported(),
        third_party_output_to(command_log("bench-vllm", out), console, verbose),
        progress(console, "bench vllm", steps * len(config.batches), plan=plan) as work,
    ):
        result = run_vllm_bench(
            config,
            log=lambda line: console.print(line, highlight=False),
            on_batch=lambda partial: write_json(partial, json_path),
            work=work,
        )
    console.print(vllm_table(result), markup=False, highlight=False, soft_wrap=True)
    write_json(result, json_path)
    if plot is not None:
        console.print(f"wrote {plot_vllm(result, plot)}")


@bench_app.command("headroom")
def bench_headroom(
    run: Path = typer.Argument(
        ...,
        help="A run folder of srt-agent train (its rollouts/step-N.jsonl), a rollout trace, or a shipped trace's name (retool_long).",
    ),
    k: int = typer.Option(8, min=1, help="Draft length (vLLM's num_speculative_tokens; 8 by default)."),
    method: list[str] = typer.Option(
        [],
        "--method",
        help="Structures to ask (default: srt, suffix, srt+prompt, srt+global); add -lastN to one to hold only "
        "the last N steps' rollouts (srt+global-last2).",
    ),
    choice: list[str] = typer.Option(
        [], "--choice", help="More ways to choose the chain: expected, context-N, backoff-N (bench/chain_choice.py)."
    ),
    json_path: Path | None = JSON,
):
    """What a linear draft could have gained per step (the oracle), what the most frequent path gains, and what the
    run achieved, in tokens per forward, for SRT's trees and SuffixDecoding's, from a run's rollouts."""
    from ..bench.headroom import HEADROOM_METHODS, headroom, headroom_table

    with reported(), progress(console, "bench headroom", plan=f"the steps of {run}: seconds a step") as work:
        result = headroom(run, k, method or HEADROOM_METHODS, choice, work)
    console.print(headroom_table(result))
    write_json(result, json_path)


@bench_app.command("replay")
def bench_replay(
    trace: Path = typer.Argument(
        ..., help="A rollout trace (every run writes them under OUT/traces/), or a shipped trace's name (retool_long)."
    ),
    drafter: list[str] = typer.Option([], "--drafter", help="Drafters to replay with (default: the trace's)."),
    max_draft_tokens: list[int] = typer.Option([], "--max-draft-tokens", help="Draft budgets to sweep."),
    max_depth: list[int] = typer.Option([], "--max-depth", help="Tree depths to sweep."),
    max_bytes: list[int] = typer.Option([], "--max-bytes", help="Cache byte budgets to sweep."),
    slack: list[float] = typer.Option(
        [], "--run-ahead-slack", help="Run-ahead slack values to sweep (uses recorded run-ahead content)."
    ),
    tokens_per_sequence: list[int] = typer.Option(
        [], "--run-ahead-tokens", help="Run-ahead tokens per sequence to sweep."
    ),
    pool: Path | None = typer.Option(None, help="Take run-ahead content from this trace instead."),
    json_path: Path | None = JSON,
):
    """Replay a recorded run without the model, sweeping draft budgets, tree limits and run-ahead settings."""
    from ..bench.replay import replay_sweep, sweep_table
    from ..bench.shipped_traces import recorded
    from ..rl.rollout_trace import RolloutTrace

    with reported(), progress(console, "bench replay", plan=f"{trace} once per setting: seconds each") as work:
        loaded = RolloutTrace.load(recorded(trace))
        result = replay_sweep(
            loaded,
            RolloutTrace.load(recorded(pool)) if pool else None,
            work,
            drafter=drafter,
            max_draft_tokens=max_draft_tokens,
            max_depth=max_depth,
            max_bytes=max_bytes,
            slack=slack,
            tokens_per_sequence=tokens_per_sequence,
        )
    console.print(sweep_table(result))
    write_json(result, json_path)
