"""`srt-agent bench paper`: SRT's Table 1 measured here — every rollout method side by side in real RL runs.

For each algorithm (GRPO, DAPO, PPO) one short RL run regenerates every step's prompts and seeds with each
method from the same weights; the rollouts that train come from an unmeasured engine (`TRAINER`) that runs
first, so no measured method pays for running first after a weight update. Per method: generation and step
time, time per token, accepted tokens per verification step, and whether its rollouts are token for token
plain decoding's (SPEC-RL, lenient, with its share of differing trajectories). A second GRPO run with n = 8
gives SRT's Table 3. The protocol and the figures: docs/benchmarks/paper.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ALGORITHMS, EnvConfig
from ..console import Progress
from ..drafting import DRAFTERS, drafter_unavailable, make_drafter
from ..rl.rollouts import RolloutVariant
from .methods import ALL_METHODS, Method, bench_env as load_bench_env, pick
from .recorder import RecordedStep, StepRecorder

PAPER_METHODS = tuple(m for m in ALL_METHODS if m.backend is None)  # every drafter on the env's backend
BASELINE = "none"
TRAINER = "trainer"  # the variant whose rollouts train: plain decoding, first in every step, not measured


@dataclass
class PaperBenchConfig:
    env: str = "envs/retool_train.yaml"
    algorithms: tuple[str, ...] = ALGORITHMS
    methods: tuple[str, ...] = tuple(m.name for m in PAPER_METHODS)
    steps: int = 3
    prompts_per_step: int = 4
    samples: int = 4
    dataset_n: int = 8  # distinct prompts: with 4 per step each comes back every 2 steps (an epoch)
    ablation_samples: int = 8  # Table 3: n = `samples` (the GRPO run) against n = this, same rollouts per step
    ablation_methods: tuple[str, ...] = ("none", "suffix", "srt", "srt+run-ahead")
    model: str | None = None
    out: str = "runs/paper"
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE on the env config

    @classmethod
    def quick(cls) -> PaperBenchConfig:
        """Two small steps per algorithm (2 prompts × 2 samples, the prompts recur every step); the env's
        token limits stay, so the full run's cached cold start serves (the cache key includes them)."""
        return cls(steps=2, prompts_per_step=2, samples=2, dataset_n=2, ablation_samples=4, out="runs/paper-quick")


def paper_steps(cfg: PaperBenchConfig) -> int:
    """RL steps the benchmark runs in all: every algorithm's, and the n-ablation's."""
    ablation = bool(cfg.ablation_samples) and "grpo" in cfg.algorithms
    return cfg.steps * (len(cfg.algorithms) + ablation)


def paper_plan(cfg: PaperBenchConfig) -> str:
    """What the benchmark will run, and about how long the default and `--quick` take on 2 cores."""
    what = (
        f"{', '.join(cfg.algorithms)}, {cfg.steps} steps of {cfg.prompts_per_step} prompts × {cfg.samples} samples, "
        f"methods {', '.join(cfg.methods)}: {paper_steps(cfg)} RL steps"
    )
    if cfg.model == "tiny-llama":
        return what + "; seconds to minutes"
    return what + "; with SmolLM2 about 3-4 h on 2 cores, estimated (--quick: 43 min measured)"


def available_methods(names: tuple[str, ...]) -> tuple[list[Method], dict[str, str]]:
    """The methods that can run here, and why each other one cannot (unknown drafter, missing package)."""
    runnable, skipped = [], {}
    for method in pick(names, PAPER_METHODS, BASELINE, as_named=True):
        if method.drafter not in DRAFTERS:
            skipped[method.name] = (
                f"drafter {method.drafter!r} is not in this build (drafters: {', '.join(sorted(DRAFTERS))})"
            )
        elif (reason := drafter_unavailable(method.drafter)) is not None:  # e.g. arctic-inference not installed
            skipped[method.name] = reason
        else:
            runnable.append(method)
    return runnable, skipped


def method_variants(methods: list[Method], config: EnvConfig) -> list[RolloutVariant]:
    """The trainer's rollout variants: the unmeasured training rollouts first, then every method (run-ahead
    as the config sets it, on)."""
    run_ahead = config.engine.run_ahead.model_copy(update={"enabled": True}).options(config.train.seed)
    return [RolloutVariant(TRAINER, "none")] + [m.variant(run_ahead) for m in methods]


def bench_env(cfg: PaperBenchConfig, algorithm: str, samples: int, prompts: int) -> EnvConfig:
    """The env file with the bench's shape: `algorithm`, its steps, `prompts` × `samples` rollouts per step."""
    recur = max(1, cfg.dataset_n // cfg.prompts_per_step)  # steps between a prompt's visits, as in the main run
    shape = [
        f"train.algorithm={algorithm}",
        f"train.prompts_per_step={prompts}",
        f"n_samples={samples}",
        f"dataset.n={prompts * recur}",
        "train.keep_checkpoints=1",
    ]
    config = load_bench_env(cfg.env, cfg.steps, shape, cfg.overrides)
    # Every method's engine keeps a KV cache of max_batch slots: no more than a step's rollouts need.
    config.engine.max_batch = min(config.engine.max_batch, prompts * samples)
    return config


def token_differences(reference: list, other: list) -> tuple[int, int]:
    """(trajectories, tokens) of `other` that differ from `reference`, pair by pair: a token differs where
    the responses disagree at its position, or where only one of them reaches it; a trajectory only one
    side has differs in all its tokens."""
    trajectories = tokens = 0
    for a, b in itertools.zip_longest(reference, other):
        x = a.response_ids if a is not None else []
        y = b.response_ids if b is not None else []
        if a is None or b is None or x != y:
            trajectories += 1
            tokens += sum(p != q for p, q in zip(x, y)) + abs(len(x) - len(y))
    return trajectories, tokens


def compared_rows(
    record: RecordedStep, exact: set[str], log: Callable[[str], None] = print, done: Callable[[str], None] | None = None
) -> list[dict]:
    """Every variant's row of a step (`RecordedStep.row`), the measured ones with how far their rollouts
    differ from the baseline's (the baseline's from the training rollouts'); logs a line per exact method that
    differs, and hands `done` (default: `log`) the step's line."""
    trajectories = {name: [t for run in rs for t in run.trajectories] for name, rs in record.runs.items()}
    rows = [record.row(name) for name in record.runs]
    measured = [r for r in rows if r["variant"] != TRAINER]
    for row in measured:
        name = row["variant"]
        reference = trajectories[TRAINER if name == BASELINE else BASELINE]
        row["differing_trajectories"], row["differing_tokens"] = token_differences(reference, trajectories[name])
        row["trajectories"] = max(len(reference), len(trajectories[name]))
        row["identical"] = 1 - row["differing_trajectories"] / row["trajectories"] if row["trajectories"] else 0.0
        if name in exact and row["differing_trajectories"]:
            log(
                f"  step {record.step}: MISMATCH: {name}'s rollouts differ from plain decoding's in "
                f"{row['differing_trajectories']} of {row['trajectories']} trajectories ({row['differing_tokens']} tokens)"
            )
    (done or log)(
        f"  step {record.step}: generation s "
        + ", ".join(f"{r['variant']} {r['gen_s']:.1f}" for r in measured)
        + f"; reward {record.metrics.get('critic/score/mean', 0.0):.2f}"
    )
    return rows


def run_algorithm(
    cfg: PaperBenchConfig,
    algorithm: str,
    methods: list[Method],
    loaded,
    samples: int,
    prompts: int,
    out: Path,
    log: Callable[[str], None] = print,
    work: Progress | None = None,
) -> dict:
    """One RL run of `algorithm` with every method regenerating each step; its rows and per-method cells.
    `work` hears of each step as it ends (a line for it, in place of `log`'s)."""
    from rich.console import Console

    from ..rl.trainer import Trainer

    config = bench_env(cfg, algorithm, samples, prompts)
    variants = method_variants(methods, config)
    exact, rows = {m.name for m in methods if m.exact}, []
    done = (lambda line: work.done(f"{algorithm} n={samples}{line.removeprefix('  ')}")) if work else None
    recorder = StepRecorder(config, variants, lambda record: rows.extend(compared_rows(record, exact, log, done)))
    trainer = Trainer(
        config, out, loaded=loaded, variants=variants, on_step=recorder, console=Console(quiet=True), replace_run=True
    )
    start = time.perf_counter()
    report = trainer.run()
    return {
        "algorithm": algorithm,
        "samples": samples,
        "prompts_per_step": prompts,
        "wall_s": time.perf_counter() - start,
        "rows": rows,
        "cells": {m.name: cell(rows, m) for m in methods},
        "reward": [m.get("critic/score/mean") for m in report["steps"]],
        "cold_start": report.get("cold_start"),
    }


def cell(rows: list[dict], method: Method) -> dict:
    """One method's figures: times and acceptance over a run's steps after the first (means per step;
    per-token and per-verification ratios of sums), identity with plain decoding over every step.
    Step 1 stays in the rows and plots but not in the times: every tree starts empty, and the process's
    first passes pay one-time costs (oneDNN builds a kernel per new shape), charged to whichever engine
    runs first. An exact method whose rollouts differ in any step is a `mismatch`."""
    measured = [r for r in rows if r["step"] > 1] or rows
    mine = [r for r in measured if r["variant"] == method.name]
    base = [r for r in measured if r["variant"] == BASELINE]
    every_step = [r for r in rows if r["variant"] == method.name]
    steps = max(len(mine), 1)
    gen = sum(r["gen_s"] for r in mine)
    tokens = sum(r["model_tokens"] for r in mine)
    forwards = sum(r["forwards"] for r in mine)
    trajectories = sum(r["trajectories"] for r in every_step)
    differing = sum(r["differing_trajectories"] for r in every_step)
    out = dict(
        exact=method.exact,
        steps=len(mine),
        gen_s=gen / steps,
        step_s=sum(r["step_s"] for r in mine) / steps,
        ms_per_token=1000 * gen / tokens if tokens else 0.0,
        accepted_per_step=sum(r["accepted_per_forward"] * r["forwards"] for r in mine) / forwards if forwards else 0.0,
        speedup_vs_baseline=sum(r["gen_s"] for r in base) / gen if gen else 0.0,
        identical=1 - differing / trajectories if trajectories else 0.0,
        differing_trajectory_share=differing / trajectories if trajectories else 0.0,
        differing_tokens=sum(r["differing_tokens"] for r in every_step),
        mismatch=method.exact and (differing > 0 or not trajectories),
        model_tokens=tokens,
        gen_s_per_step=[r["gen_s"] for r in mine],
    )
    if not method.exact:
        out["lenience"] = make_drafter(method.drafter).lenience
    return out


def run_paper_bench(
    cfg: PaperBenchConfig,
    log: Callable[[str], None] = print,
    on_run: Callable[[dict], None] | None = None,
    work: Progress | None = None,
) -> dict:
    """Every algorithm's run, then the n-ablation; returns the result (rows, cells, skipped methods).
    `on_run(result so far)` sees it after every run (a long benchmark leaves its figures as it goes); `work`
    hears of every RL step (`paper_steps` in all) as it ends."""
    import torch

    from ..models import load_model

    methods, skipped = available_methods(cfg.methods)
    for name, why in skipped.items():
        log(f"skipped {name}: {why}")
    first = bench_env(cfg, cfg.algorithms[0] if cfg.algorithms else "grpo", cfg.samples, cfg.prompts_per_step)
    loaded = load_model(cfg.model or first.model, device=first.engine.device)
    initial = {k: v.clone() for k, v in loaded.model.state_dict().items()}  # engines train the shared module in place
    started = time.perf_counter()
    runs = []

    def run(algorithm: str, chosen: list[Method], samples: int, prompts: int, label: str) -> dict:
        loaded.model.load_state_dict(initial)
        log(
            f"{label}: {cfg.steps} steps × {prompts} prompts × {samples} samples, methods {', '.join(m.name for m in chosen)}"
        )
        if work is not None:
            work.now(f"{label}: cold start and step 1")
        result = run_algorithm(cfg, algorithm, chosen, loaded, samples, prompts, Path(cfg.out) / label, log, work)
        log(
            f"{label}: {result['wall_s']:.0f} s (cold start {'cached' if (result['cold_start'] or {}).get('cached') else 'run'})"
        )
        return result

    def result(ablation: dict | None = None) -> dict:
        return {
            "config": dataclasses.asdict(cfg),
            "model": loaded.name,
            "threads": torch.get_num_threads(),
            "wall_s": time.perf_counter() - started,
            "methods": [
                dict(name=m.name, label=m.label, drafter=m.drafter, run_ahead=m.run_ahead, exact=m.exact)
                for m in methods
            ],
            "skipped": skipped,
            "runs": runs,
            "ablation": ablation,
            "mismatches": mismatches(runs, ablation),
        }

    for algorithm in cfg.algorithms:
        runs.append(run(algorithm, methods, cfg.samples, cfg.prompts_per_step, algorithm))
        if on_run is not None:
            on_run(result())
    ablation = None
    if cfg.ablation_samples and "grpo" in cfg.algorithms:
        chosen = [m for m in methods if m.name in cfg.ablation_methods]
        prompts = max(1, cfg.prompts_per_step * cfg.samples // cfg.ablation_samples)
        wide = run("grpo", chosen, cfg.ablation_samples, prompts, f"grpo-n{cfg.ablation_samples}")
        narrow = next(r for r in runs if r["algorithm"] == "grpo")
        ablation = {"runs": [narrow_subset(narrow, chosen), wide]}
    return result(ablation)


def mismatches(runs: list[dict], ablation: dict | None = None) -> list[str]:
    """Every cell of an exact method whose rollouts were not token for token plain decoding's."""
    every = runs + ([ablation["runs"][-1]] if ablation else [])
    return [
        f"{run['algorithm']} n={run['samples']}: {name} differs in {c['differing_trajectory_share']:.0%} of its trajectories "
        f"({c['differing_tokens']} tokens)"
        for run in every
        for name, c in run["cells"].items()
        if c["mismatch"]
    ]


def merge_results(results: list[dict]) -> dict:
    """Results of runs made apart (e.g. one process per algorithm) as one: their runs in order, the first
    ablation found, the methods of the first, the skipped ones of all."""
    if not results:
        raise ValueError("nothing to merge")
    merged = dict(results[0])
    merged["runs"] = [run for r in results for run in r["runs"]]
    merged["ablation"] = next((r["ablation"] for r in results if r.get("ablation")), None)
    merged["skipped"] = {k: v for r in results for k, v in r["skipped"].items()}
    merged["wall_s"] = sum(r["wall_s"] for r in results)
    merged["mismatches"] = mismatches(merged["runs"], merged["ablation"])
    return merged


def narrow_subset(run: dict, methods: list[Method]) -> dict:
    """A run's figures restricted to `methods` (the n-ablation's n = samples column)."""
    names = {m.name for m in methods}
    return {
        **run,
        "cells": {k: v for k, v in run["cells"].items() if k in names},
        "rows": [r for r in run["rows"] if r["variant"] in names],
    }


# ----- reports ----------------------------------------------------------------------------------------

BLOCKS = (
    ("Generation time per step (s)", "gen_s", "{:.1f}"),
    ("Step time (s)", "step_s", "{:.1f}"),
    ("Time per generated token (ms)", "ms_per_token", "{:.1f}"),
)


def _label(result: dict, name: str) -> str:
    method = next(m for m in result["methods"] if m["name"] == name)
    return method["label"]


def paper_table(result: dict) -> str:
    """Markdown shaped like SRT's Table 1: methods × algorithms, three metric blocks; the exact methods'
    identity with the baseline and accepted tokens per verification step beside them."""
    runs = result["runs"]
    algos = [r["algorithm"].upper() for r in runs]
    head = (
        ["Method"] + [f"{a}" for _ in BLOCKS for a in algos] + ["identical to baseline", "accepted / verification step"]
    )
    group = [""] + [title for title, _, _ in BLOCKS for _ in algos] + ["", ""]
    lines = [
        "| " + " | ".join(f"{g}<br>{h}" if g else h for g, h in zip(group, head)) + " |",
        "|---|" + "---:|" * (len(head) - 1),
    ]
    best = {}
    for _, key, _ in BLOCKS:
        for run in runs:
            exact = [c[key] for c in run["cells"].values() if c["exact"]]
            best[(key, run["algorithm"])] = min(exact) if exact else None
    for m in result["methods"]:
        name = m["name"]
        cells = [run["cells"][name] for run in runs]
        row = [_label(result, name)]
        for _, key, fmt in BLOCKS:
            for run, c in zip(runs, cells):
                text = fmt.format(c[key])
                row.append(f"**{text}**" if c["exact"] and c[key] == best[(key, run["algorithm"])] else text)
        if m["exact"]:
            row.append(" / ".join(f"{c['identical']:.0%}" + (" MISMATCH" if c["mismatch"] else "") for c in cells))
        else:
            row.append(
                " / ".join(f"{1 - c['differing_trajectory_share']:.0%}" for c in cells)
                + f" (lenience {cells[0].get('lenience', 0):.2f}: "
                + ", ".join(f"{c['differing_tokens']} tokens differ" for c in cells)
                + ")"
            )
        row.append(" / ".join("-" if name == BASELINE else f"{c['accepted_per_step']:.2f}" for c in cells))
        lines.append("| " + " | ".join(row) + " |")
    lines += [""] + [f"- `{name}` skipped: {why}" for name, why in result["skipped"].items()]
    lines += [
        f"- MISMATCH (an exact method was not plain decoding): {m}" for m in mismatches(runs, result.get("ablation"))
    ]
    return "\n".join(lines) + "\n"


def ablation_table(result: dict) -> str:
    """Markdown shaped like SRT's Table 3: generation time per step at n samples per prompt, and SRT's
    lead over SuffixDecoding (its generation time over SRT's)."""
    ablation = result.get("ablation")
    if not ablation:
        return ""
    runs = ablation["runs"]
    head = ["Method"] + [
        f"n = {r['samples']} ({r['prompts_per_step']} prompts): gen s / accepted per step" for r in runs
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(runs)]
    for name in runs[0]["cells"]:
        row = [_label(result, name)]
        for r in runs:
            c = r["cells"][name]
            row.append(f"{c['gen_s']:.1f} / " + ("-" if name == BASELINE else f"{c['accepted_per_step']:.2f}"))
        lines.append("| " + " | ".join(row) + " |")
    if all("srt" in r["cells"] and "suffix" in r["cells"] for r in runs):
        leads = [
            r["cells"]["suffix"]["gen_s"] / r["cells"]["srt"]["gen_s"] if r["cells"]["srt"]["gen_s"] else 0.0
            for r in runs
        ]
        lines.append(
            "| SRT's lead over SuffixDecoding (gen time ratio) | " + " | ".join(f"{x:.2f}x" for x in leads) + " |"
        )
    return "\n".join(lines) + "\n"


def plot_paper(result: dict, folder: str | Path) -> list[Path]:
    """PNG per run: every method's generation time over the steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    runs = list(result["runs"]) + ([result["ablation"]["runs"][-1]] if result.get("ablation") else [])
    paths = []
    for run in runs:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name in run["cells"]:
            points = sorted((r["step"], r["gen_s"]) for r in run["rows"] if r["variant"] == name)
            ax.plot(*zip(*points), marker="o", label=name, linestyle="--" if name == "spec-rl" else "-")
        ax.set_title(f"{run['algorithm'].upper()}, n = {run['samples']}: generation time per step ({result['model']})")
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", ncol=2)
        fig.tight_layout()
        path = folder / f"gen_time_{run['algorithm']}_n{run['samples']}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
