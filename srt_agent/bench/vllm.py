"""`srt-agent bench vllm`: the field's comparison inside one RL run — vLLM without speculation, vLLM's
``ngram`` and ``suffix`` (arctic-inference) proposers, SRT inside vLLM, and our engine without and with SRT.

One RL run of the env per batch size: the policy is really updated every step and every engine receives
the new weights in place (vLLM's trees survive the reload). The rollouts that train come from an
unmeasured vLLM engine without speculation that generates first in each step; every measured method then
regenerates the step from the same weights and seeds, so each sees the same sequence of policies and no
method pays the first-after-update costs alone. Batch size B caps how many sequences each engine runs at
once (``engine.max_batch``: our engine's slots, vLLM's ``max_num_seqs``): B = 1 runs the step's rollouts one
after another, B = prompts × samples all at once. A step is a *revisit* when its prompts were rolled out in
an earlier step (the trees hold their earlier rollouts).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import EnvConfig, load_env_config
from ..engine.device_info import detect_device
from ..rl.metrics import identical_share
from ..rl.rollouts import RolloutRun, RolloutVariant


@dataclass(frozen=True)
class BenchMethod:
    """A measured method: a drafter on a backend."""

    name: str
    backend: str
    drafter: str


# Engines are built in this order. vLLM's ngram proposer imports numba, whose llvmlite holds an object
# that vLLM 0.31's kernel re-binding scan (run whenever an engine starts) cannot read: no vLLM engine can
# start in this process after it, so it comes last.
METHODS = (
    BenchMethod("vllm:none", "vllm", "none"),
    BenchMethod("vllm:suffix", "vllm", "suffix"),
    BenchMethod("vllm:srt", "vllm", "srt"),
    BenchMethod("vllm:ngram", "vllm", "ngram"),
    BenchMethod("engine:none", "engine", "none"),
    BenchMethod("engine:srt", "engine", "srt"),
)
BASELINE = "vllm:none"
TRAINER = "trainer"  # vLLM without speculation, generating the training rollouts first in every step


@dataclass
class VLLMBenchConfig:
    env: str = "envs/retool_train.yaml"
    batches: tuple[int, ...] = (16, 1)  # 16: the main job's step (4 prompts × 4 samples)
    methods: tuple[str, ...] = tuple(m.name for m in METHODS)
    steps: int = 4
    prompts_per_step: int = 4
    samples: int = 4
    dataset_n: int = 8  # with 4 prompts a step, every prompt comes back every second step
    model: str | None = None
    out: str = "runs/bench-vllm"
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE on the env config


def chosen_methods(names: Sequence[str]) -> list[BenchMethod]:
    known = {m.name: m for m in METHODS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(known)}")
    return [known[BASELINE]] + [m for m in METHODS if m.name in names and m.name != BASELINE]


def bench_env(cfg: VLLMBenchConfig, batch: int) -> EnvConfig:
    """The env file with the bench's shape; `batch` sequences at once in every engine."""
    overrides = [
        f"train.steps={cfg.steps}",
        f"train.prompts_per_step={cfg.prompts_per_step}",
        f"n_samples={cfg.samples}",
        f"dataset.n={cfg.dataset_n}",
        "train.compare=[]",
        f"train.checkpoint_every={cfg.steps}",
        "train.keep_checkpoints=1",
        "train.loggers=[]",
        f"engine.max_batch={batch}",
        "engine.run_ahead.enabled=false",
    ]
    return load_env_config(cfg.env, overrides + list(cfg.overrides))


def method_figures(runs: Sequence[RolloutRun], reference: Sequence[RolloutRun]) -> dict[str, float]:
    """Generation time, tokens, speed and draft figures of one method's rollouts in one step, and the share
    of its trajectories identical to `reference`'s (the training rollouts) token for token."""
    gen_s = sum(r.summary.wall_s for r in runs)
    tokens = sum(r.summary.model_tokens for r in runs)
    forwards = sum(r.summary.forwards for r in runs)
    proposed = sum(r.summary.draft_proposed for r in runs)
    accepted = sum(r.summary.draft_accepted for r in runs)
    return {
        "gen_s": gen_s,
        "tokens": float(tokens),
        "tok_s": tokens / gen_s if gen_s > 0 else 0.0,
        "forwards": float(forwards),
        "tokens_per_forward": tokens / forwards if forwards else 0.0,
        "draft_proposed": float(proposed),
        "draft_accepted": float(accepted),
        "acceptance": accepted / proposed if proposed else 0.0,
        "identical": identical_share(
            [t for r in reference for t in r.trajectories], [t for r in runs for t in r.trajectories]
        ),
    }


class StepLog:
    """The trainer's `on_step`: every method's figures per step, and whether the step revisits its prompts."""

    def __init__(self, names: Sequence[str], log: Callable[[str], None]):
        self.names, self.log = list(names), log
        self.steps: list[dict] = []
        self.seen: set = set()

    def __call__(self, step: int, metrics: dict[str, float], runs: dict[str, list[RolloutRun]]) -> None:
        keys = {t.key for run in runs[TRAINER] for t in run.tasks}
        revisit = bool(keys) and keys <= self.seen
        self.seen |= keys
        methods = {name: method_figures(runs[name], runs[TRAINER]) for name in self.names}
        base = methods[BASELINE]
        for figures in methods.values():
            figures["speedup_vs_vllm_none"] = base["gen_s"] / figures["gen_s"] if figures["gen_s"] > 0 else 0.0
            figures["token_speedup_vs_vllm_none"] = figures["tok_s"] / base["tok_s"] if base["tok_s"] > 0 else 0.0
        self.steps.append(
            {"step": step, "revisit": revisit, "reward": metrics.get("critic/score/mean"), "methods": methods}
        )
        self.log(
            f"step {step} ({'revisit' if revisit else 'first visit'}): "
            + ", ".join(
                f"{name} {m['gen_s']:.1f}s {m['tok_s']:.0f} tok/s ({m['token_speedup_vs_vllm_none']:.2f}x)"
                for name, m in methods.items()
            )
        )


def run_batch(cfg: VLLMBenchConfig, batch: int, methods: list[BenchMethod], loaded, log: Callable[[str], None]) -> dict:
    """One RL run at batch size `batch` with every method regenerating each step."""
    from rich.console import Console

    from ..rl.trainer import Trainer

    config = bench_env(cfg, batch)
    variants = [RolloutVariant(TRAINER, "none", backend="vllm")]
    variants += [RolloutVariant(m.name, m.drafter, backend=m.backend) for m in methods]
    recorder = StepLog([m.name for m in methods], log)
    log(
        f"batch {batch}: {cfg.steps} steps of {config.name}, {cfg.prompts_per_step} prompts × {cfg.samples} samples; "
        f"methods {', '.join(m.name for m in methods)}"
    )
    start = time.perf_counter()
    trainer = Trainer(
        config,
        Path(cfg.out) / f"batch-{batch}",
        loaded=loaded,
        variants=variants,
        on_step=recorder,
        console=Console(quiet=True),
        replace_run=True,
    )
    trainer.run()
    return {
        "batch": batch,
        "wall_s": time.perf_counter() - start,
        "steps": recorder.steps,
        "summary": summarize_steps(recorder.steps),
    }


def summarize_steps(steps: list[dict]) -> dict:
    """Per method: mean generation time over all steps, over revisits, over first visits, and the ratios
    to vLLM without speculation: its time / the method's (``speedup_*``), and its milliseconds per generated
    token / the method's (``token_speedup_*``); the share of trajectories identical to the training
    rollouts. With exact sampling (the default) every method emits the same tokens, so the first ratio
    compares speed on the same work; with ``engine.vllm.exact_sampling: false`` vLLM's methods sample
    different (equally likely) trajectories at T > 0 and only the second ratio compares speed."""
    out: dict[str, dict] = {}
    names = list(steps[0]["methods"]) if steps else []
    for name in names:
        row: dict[str, float | None] = {}
        for label, chosen in (
            ("all", steps),
            ("revisit", [s for s in steps if s["revisit"]]),
            ("first", [s for s in steps if not s["revisit"]]),
        ):
            if not chosen:
                row[f"gen_s_{label}"] = row[f"speedup_{label}"] = None
                continue
            mine = sum(s["methods"][name]["gen_s"] for s in chosen)
            base = sum(s["methods"][BASELINE]["gen_s"] for s in chosen)
            row[f"gen_s_{label}"] = mine / len(chosen)
            row[f"speedup_{label}"] = base / mine if mine > 0 else None
            my_tokens = sum(s["methods"][name]["tokens"] for s in chosen)
            base_tokens = sum(s["methods"][BASELINE]["tokens"] for s in chosen)
            row[f"token_speedup_{label}"] = (
                (base / base_tokens) / (mine / my_tokens) if mine > 0 and base_tokens else None
            )
        proposed = sum(s["methods"][name]["draft_proposed"] for s in steps)
        row["acceptance"] = sum(s["methods"][name]["draft_accepted"] for s in steps) / proposed if proposed else None
        row["identical"] = sum(s["methods"][name]["identical"] for s in steps) / len(steps) if steps else None
        row["tokens_per_forward"] = sum(s["methods"][name]["tokens"] for s in steps) / max(
            sum(s["methods"][name]["forwards"] for s in steps), 1.0
        )
        row["min_step_speedup"] = min(s["methods"][name]["speedup_vs_vllm_none"] for s in steps) if steps else None
        row["min_step_token_speedup"] = (
            min(s["methods"][name]["token_speedup_vs_vllm_none"] for s in steps) if steps else None
        )
        out[name] = row
    return out


def run_vllm_bench(
    cfg: VLLMBenchConfig, log: Callable[[str], None] = print, on_batch: Callable[[dict], None] | None = None
) -> dict:
    """Every batch size's RL run; the result (also handed to `on_batch` after each run) is JSON-ready."""
    from ..backends import vllm_missing
    from ..models import load_model

    missing = vllm_missing()
    if missing:
        raise ValueError(missing)
    methods = chosen_methods(cfg.methods)
    config = bench_env(cfg, max(cfg.batches))
    loaded = load_model(cfg.model or config.model, device=config.engine.device)
    info = detect_device(torch.device("cpu"))
    result = {
        "bench": "vllm",
        "machine": {
            "cpu": info.name,
            "flags": info.flags,
            "cpu_capability": info.cpu_capability,
            "threads": info.threads,
            "python": platform.python_version(),
        },
        "config": {
            "env": cfg.env,
            "steps": cfg.steps,
            "prompts_per_step": cfg.prompts_per_step,
            "samples": cfg.samples,
            "dataset_n": cfg.dataset_n,
            "methods": [m.name for m in methods],
            "overrides": list(cfg.overrides),
            "temperature": config.sampling.temperature,
            "max_response_tokens": config.max_response_tokens,
        },
        "runs": [],
    }
    for batch in cfg.batches:
        result["runs"].append(run_batch(cfg, batch, methods, loaded, log))
        if on_batch is not None:
            on_batch(result)
    return result


def vllm_table(result: dict) -> str:
    """Markdown: per batch and method, generation time per step (all / first visits / revisits) and speed-ups."""
    lines = []
    for run in result["runs"]:
        lines += [
            f"batch {run['batch']}",
            "",
            "| method | gen s/step | vs vllm:none | first visits | revisits | slowest step | per token "
            "| acceptance | tok/fwd | identical |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in run["summary"].items():

            def cell(key: str, fmt: str) -> str:
                return "–" if row.get(key) is None else fmt.format(row[key])

            lines.append(
                f"| {name} | {cell('gen_s_all', '{:.1f}')} | {cell('speedup_all', '{:.2f}x')} | "
                f"{cell('speedup_first', '{:.2f}x')} | {cell('speedup_revisit', '{:.2f}x')} | "
                f"{cell('min_step_speedup', '{:.2f}x')} | {cell('token_speedup_all', '{:.2f}x')} | "
                f"{cell('acceptance', '{:.0%}')} | {cell('tokens_per_forward', '{:.2f}')} | "
                f"{cell('identical', '{:.0%}')} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_vllm(result: dict, path: Path) -> Path:
    """Per batch size (columns): generation time per step (top) and generated tokens per second (bottom)
    of every method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 8), squeeze=False)
    for column, run in enumerate(runs):
        steps = [s["step"] for s in run["steps"]]
        for ax, key, label in (
            (axes[0][column], "gen_s", "generation time (s)"),
            (axes[1][column], "tok_s", "generated tokens / s"),
        ):
            for name in run["summary"]:
                ax.plot(steps, [s["methods"][name][key] for s in run["steps"]], marker="o", label=name)
            for s in run["steps"]:
                if s["revisit"]:
                    ax.axvspan(s["step"] - 0.5, s["step"] + 0.5, color="grey", alpha=0.1)
            ax.set_title(f"batch {run['batch']} (shaded: revisits)")
            ax.set_xlabel("RL step")
            ax.set_ylabel(label)
            ax.set_xticks(steps)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
