"""`srt-agent bench ablation`: SRT's stages, step by step through the trainer (SRT's Fig. 5 on our workload).

Consecutive RL steps where one engine per stage (``none``, which trains, ``history``, ``srt``,
``srt+run-ahead``) generates every step's prompts and seeds from the same weights; per stage and step the
accepted tokens per verification step, the times, run-ahead's share and the identical-tokens check, beside a
replay of each stage's trace. The protocol and the figures: docs/benchmarks/ablation.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..config import EnvConfig
from ..console import Progress
from ..engine.options import RunAheadOptions
from ..rl.replay import replay
from ..rl.rollout_trace import RolloutTrace
from ..rl.rollouts import RolloutVariant, window_prompt
from .methods import ALL_METHODS, bench_env
from .recorder import StepRecorder

STAGES = ("history", "srt", "srt+run-ahead")


@dataclass
class AblationConfig:
    env: str = "envs/retool_train.yaml"
    steps: int = 6
    dataset_n: int | None = 8  # distinct prompts: with 4 per step each comes back every 2 steps (epochs)
    starts: tuple[str, ...] = ("prompt",)  # run-ahead stages, one per start
    model: str | None = None
    out: str = "runs/ablation"
    update_bubble: bool = True  # also time an update with run-ahead beside it
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE on the env config

    @classmethod
    def quick(cls) -> AblationConfig:
        """Tiny random model, tiny steps: seconds (checks the pipeline, not the speed)."""
        return cls(
            steps=2,
            dataset_n=2,
            model="tiny-llama",
            out="runs/ablation-quick",
            update_bubble=False,
            overrides=[
                "train.prompts_per_step=2",
                "n_samples=2",
                "max_tokens_per_turn=12",
                "max_response_tokens=48",
                "max_turns=2",
                "engine.max_batch=4",
                "engine.max_context=512",
                "engine.calibrate=false",
                "cold_start.enabled=false",
                "engine.run_ahead.slack=1.0",
                "engine.run_ahead.tokens_per_sequence=8",
            ],
        )


def ablation_variants(config: EnvConfig, starts: tuple[str, ...]) -> list[RolloutVariant]:
    """Plain decoding (trains; the identity reference), then the stages; run-ahead as the config sets it
    (turned on), once per start."""
    methods = {m.name: m for m in ALL_METHODS}
    run_ahead = config.engine.run_ahead.model_copy(update={"enabled": True})
    stages = [methods[name].variant(None) for name in ("none", "history", "srt")]
    ahead = methods["srt+run-ahead"]
    for start in starts:
        options = run_ahead.model_copy(update={"start": start}).options(config.train.seed)
        stages.append(ahead.variant(options, name=ahead.name if start == starts[0] else f"{ahead.name}:{start}"))
    return stages


def ablation_env(cfg: AblationConfig) -> EnvConfig:
    """The env config the ablation runs: the env file with its overrides, no checkpoints kept, no loggers."""
    shape = [f"dataset.n={cfg.dataset_n}"] if cfg.dataset_n is not None else []
    return bench_env(cfg.env, cfg.steps, shape, cfg.overrides)


def run_ablation(cfg: AblationConfig, log: Callable[[str], None] = print, work: Progress | None = None) -> dict:
    """Run the ablation (see the module docstring); writes traces under `cfg.out` and returns the result.
    `work` hears of each RL step, and of the update bubble's measurement, as they end."""
    from rich.console import Console

    from ..models import load_model
    from ..rl.trainer import Trainer

    config = ablation_env(cfg)
    variants = ablation_variants(config, cfg.starts)
    loaded = load_model(cfg.model or config.model, device=config.engine.device)
    work = work or Progress.unseen()
    recorder = StepRecorder(
        config,
        variants,
        lambda r: work.done(f"step {r.step}: " + ", ".join(f"{n} {f.gen_s:.1f} s" for n, f in r.figures.items())),
    )
    trainer = Trainer(
        config,
        Path(cfg.out),
        loaded=loaded,
        variants=variants,
        on_step=recorder,
        console=Console(quiet=True),
        replace_run=True,
    )
    log(
        f"ablation: {cfg.steps} steps of {config.name}, {config.train.prompts_per_step} prompts × {config.n_samples} samples, "
        f"stages {', '.join(v.name for v in variants)}"
    )
    start = time.perf_counter()
    work.now("cold start and step 1")
    report = trainer.run()
    wall = time.perf_counter() - start
    recorded = recorder.traces()
    traces = {}
    for name, trace in recorded.items():
        traces[name] = str(trace.save(Path(cfg.out) / "traces" / f"{name.replace(':', '-')}.json"))
    validation = validate_replay(recorded, variants)
    rows = recorder.rows()
    result = {
        "config": dataclasses.asdict(cfg),
        "env": config.model_dump(mode="json"),
        "model": report["model"],
        "wall_s": wall,
        "stages": [v.name for v in variants],
        "rows": rows,
        "summary": summarize_rows(rows),
        "replay": validation,
        "traces": traces,
        "cold_start": report.get("cold_start"),
    }
    if cfg.update_bubble:
        work.now("a policy update with run-ahead beside it")
        result["update_bubble"] = measure_update_bubble(config, loaded)
        work.done("update bubble measured")
    return result


def summarize_rows(rows: list[dict]) -> list[dict]:
    """Per stage, over the steps after the first (its trees start empty): means and totals."""
    out = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        later = [r for r in mine if r["step"] > 1] or mine
        forwards = sum(r["forwards"] for r in later)
        accepted = sum(r["accepted_per_forward"] * r["forwards"] for r in later)
        gen = sum(r["gen_s"] for r in later)
        base = sum(r["gen_s"] for r in rows if r["variant"] == "none" and r["step"] in {x["step"] for x in later})
        out.append(
            dict(
                variant=name,
                steps=len(later),
                accepted_per_forward=accepted / forwards if forwards else 0.0,
                gen_s=gen,
                step_s=sum(r["step_s"] for r in later),
                speedup_vs_none=base / gen if gen else 0.0,
                identical=sum(r["identical"] for r in mine) / len(mine),
                run_ahead_tokens=sum(r["run_ahead_tokens"] for r in mine),
                run_ahead_time_share=sum(r["run_ahead_time_share"] * r["gen_s"] for r in mine)
                / max(sum(r["gen_s"] for r in mine), 1e-9),
            )
        )
    return out


def validate_replay(traces: dict[str, RolloutTrace], variants: list[RolloutVariant]) -> list[dict]:
    """Replay every drafting stage's trace with its own settings; per step, predicted against measured."""
    rows = []
    for v in variants:
        if v.drafter == "none":
            continue
        start = time.perf_counter()
        steps = replay(traces[v.name])
        seconds = time.perf_counter() - start
        for s in steps:
            rows.append(
                dict(
                    variant=v.name,
                    step=s.step,
                    replayed=s.accepted_per_forward,
                    measured=s.recorded_accepted_per_forward,
                    error=s.error,
                    replayed_s=s.simulated_s,
                    measured_s=s.recorded_s,
                    run_ahead_tokens=s.run_ahead_tokens,
                    replay_wall_s=seconds / len(steps),
                )
            )
    return rows


def measure_update_bubble(config: EnvConfig, loaded, samples_per_update: int = 8) -> dict:
    """Time a GRPO-shaped policy update alone, then with an engine running ahead beside it on the env's
    prompts (the update bubble), alternately, in this process: is the engine's work free there?"""
    import torch

    from ..agent.rollout import build_controller
    from ..rl.policy import Policy
    from .update import UpdateBenchConfig, packed_update, workload

    bench = UpdateBenchConfig(
        prompts=max(1, samples_per_update // config.n_samples),
        samples=config.n_samples,
        prompt_tokens=150,
        response_tokens=200,
        tool_tokens=30,
    )
    samples = workload(bench, loaded.model.get_input_embeddings().weight.shape[0])
    policy = Policy(loaded.model)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-9)
    options = RunAheadOptions(
        bubbles=("update",), budget_tokens=1 << 20, tokens_per_sequence=config.engine.run_ahead.tokens_per_sequence
    )
    controller = build_controller(config, loaded=loaded, drafter="srt", tools={}, run_ahead=options)
    engine = controller.engine
    tasks = config.dataset.tasks()[: config.train.prompts_per_step]
    window = [window_prompt(controller, t) for t in tasks]
    alone, beside, tokens = [], [], []
    try:
        packed_update(policy, optimizer, samples, config.train.micro_batch_tokens)  # warm-up
        for _ in range(2):
            t0 = time.perf_counter()
            packed_update(policy, optimizer, samples, config.train.micro_batch_tokens)
            alone.append(time.perf_counter() - t0)
            before = engine.call(lambda e: e.run_ahead.stats.tokens).result()
            engine.call(lambda e: e.run_ahead.open(window, phase="update")).result()
            t0 = time.perf_counter()
            packed_update(policy, optimizer, samples, config.train.micro_batch_tokens)
            beside.append(time.perf_counter() - t0)
            engine.call(lambda e: e.run_ahead.close()).result()
            tokens.append(engine.call(lambda e: e.run_ahead.stats.tokens).result() - before)
    finally:
        engine.close()
    return dict(
        update_tokens=sum(len(s) for s in samples),
        update_alone_s=min(alone),
        update_beside_run_ahead_s=min(beside),
        slowdown=min(beside) / min(alone),
        run_ahead_tokens=sum(tokens) / len(tokens),
        run_ahead_tokens_per_s=sum(tokens) / sum(beside),
        times_alone_s=alone,
        times_beside_s=beside,
        threads=torch.get_num_threads(),
    )


def plot_ablation(result: dict, path: str | Path) -> Path:
    """Accepted tokens per verification step, generation time and run-ahead's share per stage and step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    rows = result["rows"]
    stages = [s for s in result["stages"]]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    panels = (
        ("accepted tokens per verification step", "accepted_per_forward", [s for s in stages if s != "none"]),
        ("generation time per step (s)", "gen_s", stages),
        ("run-ahead share of the generation time", "run_ahead_time_share", [s for s in stages if "run-ahead" in s]),
    )
    for ax, (title, key, names) in zip(axes, panels):
        for name in names:
            points = sorted((r["step"], r[key]) for r in rows if r["variant"] == name)
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        if key == "accepted_per_forward":
            for name in names:
                replayed = sorted((r["step"], r["replayed"]) for r in result.get("replay", []) if r["variant"] == name)
                if replayed:
                    ax.plot(*zip(*replayed), linestyle=":", color=ax.lines[names.index(name)].get_color(), alpha=0.7)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.legend(fontsize="small")
    fig.suptitle(f"SRT ablation: {result['model']} (dotted: trace replay)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ablation_tables(result: dict) -> list:
    """Rich tables: each stage over the steps, each step, the replay against the run, the update bubble."""
    from rich.table import Table

    summary = Table(
        "stage",
        "accepted / step",
        "gen s",
        "step s",
        "vs none",
        "identical",
        "run-ahead tokens",
        "run-ahead time share",
        title="stages over steps 2+ (step 1's trees start empty)",
    )
    for r in result["summary"]:
        summary.add_row(
            r["variant"],
            f"{r['accepted_per_forward']:.3f}",
            f"{r['gen_s']:.1f}",
            f"{r['step_s']:.1f}",
            f"{r['speedup_vs_none']:.2f}x",
            f"{r['identical']:.0%}",
            str(r["run_ahead_tokens"]),
            f"{r['run_ahead_time_share']:.1%}",
        )
    steps = Table(
        "step",
        "stage",
        "accepted / step",
        "tokens / fwd",
        "gen s",
        "step s",
        "identical",
        "run-ahead tokens",
        "row share",
        "time share",
        title="per step",
    )
    for r in result["rows"]:
        steps.add_row(
            str(r["step"]),
            r["variant"],
            f"{r['accepted_per_forward']:.3f}",
            f"{r['tokens_per_forward']:.2f}",
            f"{r['gen_s']:.1f}",
            f"{r['step_s']:.1f}",
            f"{r['identical']:.0%}",
            str(r["run_ahead_tokens"]),
            f"{r['run_ahead_row_share']:.1%}",
            f"{r['run_ahead_time_share']:.1%}",
        )
    replayed = Table(
        "stage", "step", "measured", "replayed", "error", title="trace replay: accepted tokens per verification step"
    )
    for r in result["replay"]:
        replayed.add_row(
            r["variant"], str(r["step"]), f"{r['measured']:.3f}", f"{r['replayed']:.3f}", f"{r['error']:.1%}"
        )
    tables = [summary, steps, replayed]
    bubble = result.get("update_bubble")
    if bubble:
        update = Table(
            "update alone s", "update beside run-ahead s", "slowdown", "run-ahead tokens", title="the update bubble"
        )
        update.add_row(
            f"{bubble['update_alone_s']:.1f}",
            f"{bubble['update_beside_run_ahead_s']:.1f}",
            f"{bubble['slowdown']:.2f}x",
            f"{bubble['run_ahead_tokens']:.0f}",
        )
        tables.append(update)
    return tables
