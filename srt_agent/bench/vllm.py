"""`srt-agent bench vllm`: the field's comparison inside one RL run — vLLM without speculation, vLLM's
``ngram`` and ``suffix`` (arctic-inference) proposers, SRT inside vLLM, and our engine without and with SRT.

One RL run per batch size; an unmeasured engine generates the rollouts that train, and every measured
method regenerates each step from the same weights and seeds, exactly (all but ``vllm:stock``, vLLM as
shipped). Each ratio comes with a 95% paired bootstrap interval over steps (`ratio_interval`). The
protocol, the statistic and the figures: docs/benchmarks/vllm.md.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import EnvConfig
from ..console import Progress
from ..engine.options import RunAheadOptions
from ..engine.tail import TAIL_SEQUENCES, tail_figures
from ..rl.evaluate import bootstrap_statistic, ratio_text
from ..rl.metrics import StepFigures
from ..rl.rollouts import RolloutVariant
from ..runner.device_info import detect_device
from .methods import ALL_METHODS, Method, bench_env as load_bench_env, pick
from .recorder import RecordedStep, StepRecorder

VLLM_METHODS = tuple(m for m in ALL_METHODS if m.backend is not None)  # each names the backend it runs on
BASELINE = "vllm:none"
TRAINER = "trainer"  # vLLM without speculation, generating the training rollouts first in every step
# Pairs of methods compared head to head (the first's time over the second's), when both ran: SRT against
# vLLM's own proposers, and what exact sampling costs vLLM without speculation.
PAIRS = (
    ("vllm:srt", "vllm:suffix"),
    ("vllm:srt+ahead", "vllm:suffix"),
    ("vllm:srt+ahead", "vllm:srt"),
    ("vllm:srt", "vllm:ngram"),
    ("vllm:none", "vllm:stock"),
)
DEFAULT_VLLM_METHODS = ("vllm:none", "vllm:suffix", "vllm:srt")  # what `bench vllm` runs without --method or --all
DRAWS = 2000  # bootstrap draws per interval


@dataclass
class VLLMBenchConfig:
    env: str = "envs/retool_train.yaml"
    batches: tuple[int, ...] = (16, 1)  # 16: the main job's step (4 prompts × 4 samples)
    methods: tuple[str, ...] = tuple(m.name for m in VLLM_METHODS)
    steps: int = 8
    prompts_per_step: int = 4
    samples: int = 4  # the group size n: samples per prompt
    dataset_n: int = 8  # with 4 prompts a step, every prompt comes back every second step
    model: str | None = None
    out: str = "runs/bench-vllm"
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE on the env config


IDENTITY_COUNTS = ("near_ties", "faults", "observations")
TAIL_KEYS = ("step_s", "tail_s", "tail_tokens")  # engine steps' time, and the tail's (engine/tail.py)
TAIL_TIME = ("tail_s", "tail_tokens")


def chosen_methods(names: Sequence[str]) -> list[Method]:
    """The named methods, vLLM without speculation first, the others in the order engines can be built."""
    return pick(names, VLLM_METHODS, BASELINE)


def bench_env(cfg: VLLMBenchConfig, batch: int) -> EnvConfig:
    """The env file with the bench's shape; `batch` sequences at once in every engine."""
    shape = [
        f"train.prompts_per_step={cfg.prompts_per_step}",
        f"n_samples={cfg.samples}",
        f"dataset.n={cfg.dataset_n}",
        "train.keep_checkpoints=1",
        f"engine.max_batch={batch}",
        "engine.run_ahead.enabled=false",
    ]
    return load_bench_env(cfg.env, cfg.steps, shape, cfg.overrides)


def method_figures(figures: StepFigures) -> dict[str, float]:
    """Generation time, tokens, speed and draft figures of one method's rollouts in one step, and the share
    of its trajectories identical to the training rollouts token for token."""
    return {
        "run_ahead_tokens": float(
            figures.run_ahead.get("tokens", 0)
        ),  # generated for the trees only, never in `tokens`
        "gen_s": figures.gen_s,
        "tokens": float(figures.model_tokens),
        "tok_s": figures.tok_s,
        "forwards": float(figures.forwards),
        "tokens_per_forward": figures.tokens_per_forward,
        "draft_proposed": float(figures.draft_proposed),
        "draft_accepted": float(figures.draft_accepted),
        "acceptance": figures.acceptance,
        "identical": figures.identical,
        **{k: float(figures.tail.get(k, 0)) for k in TAIL_KEYS},
    }


def bench_step(record: RecordedStep, names: Sequence[str]) -> dict:
    """A step's entry: every method's figures (with its speed-ups over vLLM without speculation and what its
    differences from the training rollouts were), whether the step revisits its prompts, its reward."""
    methods = {name: method_figures(record.figures[name]) for name in names}
    for name, figures in methods.items():  # the first differences, judged (rl/identity.py); 0 where identical
        figures.update({k: record.metrics.get(f"compare/{name}/{k}", 0.0) for k in IDENTITY_COUNTS})
    base = methods[BASELINE]
    for figures in methods.values():
        figures["speedup_vs_vllm_none"] = base["gen_s"] / figures["gen_s"] if figures["gen_s"] > 0 else 0.0
        figures["token_speedup_vs_vllm_none"] = figures["tok_s"] / base["tok_s"] if base["tok_s"] > 0 else 0.0
    return {"step": record.step, "revisit": record.revisit, "reward": record.reward, "methods": methods}


def step_line(step: dict) -> str:
    """The log line of a step: every method's time, speed and speed-up per generated token."""
    return f"step {step['step']} ({'revisit' if step['revisit'] else 'first visit'}): " + ", ".join(
        f"{name} {m['gen_s']:.1f}s {m['tok_s']:.0f} tok/s ({m['token_speedup_vs_vllm_none']:.2f}x)"
        for name, m in step["methods"].items()
    )


def bench_variants(methods: Sequence[Method]) -> list[RolloutVariant]:
    """The trainer's variant (vLLM without speculation, generating the training rollouts) and one per method,
    each on an engine of its own; a method that is not exact samples with vLLM's own sampler, the others as
    the env config says."""
    trainer = RolloutVariant(TRAINER, "none", backend="vllm")
    return [trainer] + [m.variant(RunAheadOptions(), own_engine=True) for m in methods]


def run_batch(
    cfg: VLLMBenchConfig, batch: int, methods: list[Method], loaded, log: Callable[[str], None], work: Progress
) -> dict:
    """One RL run at batch size `batch` with every method regenerating each step (a line for each to `work`)."""
    from rich.console import Console

    from ..rl.trainer import Trainer

    config = bench_env(cfg, batch)
    variants = bench_variants(methods)
    names, steps = [m.name for m in methods], []

    def record(step: RecordedStep) -> None:
        steps.append(bench_step(step, names))
        work.done(f"batch {batch} {step_line(steps[-1]).strip()}")

    recorder = StepRecorder(config, variants, record)
    log(
        f"batch {batch}: {cfg.steps} steps of {config.name}, {cfg.prompts_per_step} prompts × n = {cfg.samples}; "
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
        "steps": steps,
        "summary": summarize_steps(steps, inexact=inexact_methods(config, methods)),
        "pairs": pair_ratios(steps),
    }


def inexact_methods(config: EnvConfig, methods: Sequence[Method]) -> list[str]:
    """The methods whose trajectories need not be the training rollouts' at T > 0: vLLM's, sampling with
    vLLM's own sampler (``vllm:stock``, or all of them under ``engine.vllm.exact_sampling: false``)."""
    return [
        m.name for m in methods if m.backend == "vllm" and not (m.exact_sampling and config.engine.vllm.exact_sampling)
    ]


def _sums(steps: Sequence[dict], name: str, keys: tuple[str, str]) -> tuple[list[float], list[float]]:
    return [s["methods"][name][keys[0]] for s in steps], [s["methods"][name][keys[1]] for s in steps]


def ratio_interval(
    steps: Sequence[dict],
    num: str,
    den: str,
    per_token: bool = False,
    draws: int = DRAWS,
    seed: int = 0,
    keys: tuple[str, str] = ("gen_s", "tokens"),
) -> tuple[float | None, list[float] | None]:
    """Method `num`'s generation time summed over `steps` over method `den`'s (per generated token when
    `per_token`: each one's summed time over its summed tokens), and its 95% paired bootstrap interval:
    each draw resamples the steps with replacement and takes the same ratio over the drawn steps (both
    methods' times from the same steps). Seeded: the same steps give the same interval. (None, None)
    without steps or time; (ratio, None) when `draws` is 0. `keys`: the figures read as time and tokens
    (``("tail_s", "tail_tokens")``: the tail's)."""
    if not steps:
        return None, None
    num_s, num_tokens = _sums(steps, num, keys)
    den_s, den_tokens = _sums(steps, den, keys)

    def ratio(rows: Sequence[int]) -> float | None:
        top, bottom = sum(num_s[i] for i in rows), sum(den_s[i] for i in rows)
        if per_token:
            top_tokens, bottom_tokens = sum(num_tokens[i] for i in rows), sum(den_tokens[i] for i in rows)
            if not top_tokens or not bottom_tokens:
                return None
            top, bottom = top / top_tokens, bottom / bottom_tokens
        return top / bottom if bottom > 0 else None

    point = ratio(range(len(steps)))
    if point is None or draws <= 0:
        return point, None
    bounds = bootstrap_statistic(len(steps), lambda rows: ratio(rows) or 0.0, draws=draws, seed=seed)
    return point, bounds


def _subsets(steps: Sequence[dict]) -> tuple[tuple[str, list[dict]], ...]:
    return (
        ("all", list(steps)),
        ("revisit", [s for s in steps if s["revisit"]]),
        ("first", [s for s in steps if not s["revisit"]]),
    )


def pair_ratios(steps: Sequence[dict], pairs: Sequence[tuple[str, str]] = PAIRS, seed: int = 0) -> dict[str, dict]:
    """Head to head, per pair ``(a, b)`` of methods that both ran, keyed ``"a / b"``: a's generation time
    over b's (``time_ratio_*``, over all steps, revisits and first visits) and a's time per generated token
    over b's (``token_time_ratio_*``), each with its interval under ``intervals``. Below 1: a is faster."""
    ran = set(steps[0]["methods"]) if steps else set()
    out: dict[str, dict] = {}
    for a, b in pairs:
        if a not in ran or b not in ran:
            continue
        row: dict = {"intervals": {}}
        for label, chosen in _subsets(steps):
            for key, per_token in (("time_ratio", False), ("token_time_ratio", True)):
                row[f"{key}_{label}"], bounds = ratio_interval(chosen, a, b, per_token, seed=seed)
                if bounds is not None:
                    row["intervals"][f"{key}_{label}"] = bounds
        out[f"{a} / {b}"] = row
    return out


def summarize_steps(steps: list[dict], inexact: Sequence[str] = (), seed: int = 0) -> dict:
    """Per method: mean generation time over all steps, over revisits, over first visits, and the ratios
    to vLLM without speculation: its time / the method's (``speedup_*``), and its milliseconds per generated
    token / the method's (``token_speedup_*``), each ratio with its 95% paired bootstrap interval over the
    steps (``intervals``, see `ratio_interval`); the share of trajectories identical to the training
    rollouts. With exact sampling (the default) every method emits the same tokens, so the first ratio
    compares speed on the same work; the methods in `inexact` (vLLM's own sampler: ``vllm:stock``, or every
    vLLM method under ``engine.vllm.exact_sampling: false``) sample different (equally likely) trajectories
    at T > 0 and only the second ratio compares their speed (``exact_sampling`` says which rows). The tail:
    the share of engine step time with at most `TAIL_SEQUENCES` sequences running (``tail_share``), the
    generated tokens per second there (``tail_tok_s``) and that speed over vLLM without speculation's
    (``tail_speedup``, with its interval)."""
    out: dict[str, dict] = {}
    names = list(steps[0]["methods"]) if steps else []
    for name in names:
        row: dict = {"exact_sampling": name not in inexact, "intervals": {}}
        for label, chosen in _subsets(steps):
            if not chosen:
                row[f"gen_s_{label}"] = row[f"speedup_{label}"] = row[f"token_speedup_{label}"] = None
                continue
            row[f"gen_s_{label}"] = sum(s["methods"][name]["gen_s"] for s in chosen) / len(chosen)
            for key, per_token in (("speedup", False), ("token_speedup", True)):
                row[f"{key}_{label}"], bounds = ratio_interval(chosen, BASELINE, name, per_token, seed=seed)
                if bounds is not None:
                    row["intervals"][f"{key}_{label}"] = bounds
        proposed = sum(s["methods"][name]["draft_proposed"] for s in steps)
        row["acceptance"] = sum(s["methods"][name]["draft_accepted"] for s in steps) / proposed if proposed else None
        row["identical"] = sum(s["methods"][name]["identical"] for s in steps) / len(steps) if steps else None
        row["tokens_per_forward"] = sum(s["methods"][name]["tokens"] for s in steps) / max(
            sum(s["methods"][name]["forwards"] for s in steps), 1.0
        )
        row.update(tail_figures({k: sum(s["methods"][name][k] for s in steps) for k in TAIL_KEYS}))
        ahead = sum(s["methods"][name].get("run_ahead_tokens", 0.0) for s in steps)
        row["run_ahead_share"] = ahead / (ahead + sum(s["methods"][name]["tokens"] for s in steps)) if ahead else None
        row["min_step_speedup"] = min(s["methods"][name]["speedup_vs_vllm_none"] for s in steps) if steps else None
        row["min_step_token_speedup"] = (
            min(s["methods"][name]["token_speedup_vs_vllm_none"] for s in steps) if steps else None
        )
        row["tail_speedup"], bounds = ratio_interval(steps, BASELINE, name, True, seed=seed, keys=TAIL_TIME)
        if bounds is not None:
            row["intervals"]["tail_speedup"] = bounds
        out[name] = row
    return out


def run_vllm_bench(
    cfg: VLLMBenchConfig,
    log: Callable[[str], None] = print,
    on_batch: Callable[[dict], None] | None = None,
    work: Progress | None = None,
) -> dict:
    """Every batch size's RL run; the result (also handed to `on_batch` after each run) is JSON-ready. `work`
    hears of every RL step as it ends."""
    from ..backends import vllm_missing
    from ..models import load_model

    missing = vllm_missing()
    if missing:
        raise ValueError(missing)
    work = work or Progress.unseen()
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
            "n": cfg.samples,  # group size: samples per prompt
            "samples": cfg.samples,  # the same, under its earlier name
            "dataset_n": cfg.dataset_n,
            "methods": [m.name for m in methods],
            "inexact_methods": inexact_methods(config, methods),
            "bootstrap": {"draws": DRAWS, "level": 0.95, "statistic": "ratio of summed times over resampled steps"},
            "overrides": list(cfg.overrides),
            "temperature": config.sampling.temperature,
            "max_response_tokens": config.max_response_tokens,
        },
        "runs": [],
    }
    for batch in cfg.batches:
        work.now(f"batch {batch}: vLLM's start-up and step 1")
        result["runs"].append(run_batch(cfg, batch, methods, loaded, log, work))
        if on_batch is not None:
            on_batch(result)
    return result


def pair_verdict(bounds: Sequence[float] | None) -> str:
    """Which of a pair is faster by its time ratio's interval (first / second), or that noise can't tell."""
    if not bounds:
        return "–"
    if bounds[1] < 1:
        return "first faster"
    if bounds[0] > 1:
        return "second faster"
    return "within noise"


def vllm_table(result: dict) -> str:
    """Markdown: per batch and method, generation time per step (all / first visits / revisits) and speed-ups
    with their 95% intervals; then each pair of methods head to head."""
    lines = []
    for run in result["runs"]:
        lines += [
            f"batch {run['batch']}",
            "",
            "| method | gen s/step | vs vllm:none | first visits | revisits | slowest step | per token "
            f"| acceptance | tok/fwd | identical | run-ahead tokens | ≤{TAIL_SEQUENCES} running | tail tok/s "
            "| tail vs vllm:none |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        inexact = []
        for name, row in run["summary"].items():

            def cell(key: str, fmt: str) -> str:
                return "–" if row.get(key) is None else fmt.format(row[key])

            def ratio(key: str) -> str:
                return ratio_text(row.get(key), row.get("intervals", {}).get(key))

            if not row.get("exact_sampling", True):
                inexact.append(name)
            lines.append(
                f"| {name} | {cell('gen_s_all', '{:.1f}')} | {ratio('speedup_all')} | "
                f"{ratio('speedup_first')} | {ratio('speedup_revisit')} | "
                f"{cell('min_step_speedup', '{:.2f}x')} | {ratio('token_speedup_all')} | "
                f"{cell('acceptance', '{:.0%}')} | {cell('tokens_per_forward', '{:.2f}')} | "
                f"{cell('identical', '{:.0%}')} | {cell('run_ahead_share', '{:.0%}')} | "
                f"{cell('tail_share', '{:.0%}')} | {cell('tail_tok_s', '{:.0f}')} | {ratio('tail_speedup')} |"
            )
        if inexact:
            lines += [
                "",
                f"{', '.join(inexact)}: vLLM's own sampler, not token-identical to the training rollouts at T > 0 "
                "(identical: its real share); its speed compares by the per-token column.",
            ]
        pairs = run.get("pairs") or {}
        if pairs:
            lines += [
                "",
                "| pair: first's time / second's | all steps | first visits | revisits | per token | verdict |",
                "|---|---:|---:|---:|---:|---|",
            ]
            for pair, row in pairs.items():
                cells = [
                    ratio_text(row.get(key), row["intervals"].get(key))
                    for key in ("time_ratio_all", "time_ratio_first", "time_ratio_revisit", "token_time_ratio_all")
                ]
                key = "token_time_ratio_all" if any(m in inexact for m in pair.split(" / ")) else "time_ratio_all"
                lines.append(f"| {pair} | {' | '.join(cells)} | {pair_verdict(row['intervals'].get(key))} |")
        lines.append("")
    return "\n".join(lines)


def plot_vllm(result: dict, path: Path) -> Path:
    """Per batch size (columns): generation time per step and generated tokens per second of every method,
    then each method's speed-ups over vLLM without speculation and each pair's time ratio, with their 95%
    intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, axes = plt.subplots(4, len(runs), figsize=(6 * len(runs), 15), squeeze=False)
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
        kinds = (("all", "all steps"), ("first", "first visits"), ("revisit", "revisits"))
        _error_bars(
            axes[2][column],
            {name: row for name, row in run["summary"].items() if name != BASELINE},
            [(f"speedup_{k}", text) for k, text in kinds] + [("token_speedup_all", "per token")],
            f"batch {run['batch']}: speed-up over {BASELINE} (95% intervals)",
        )
        _error_bars(
            axes[3][column],
            run.get("pairs") or {},
            [(f"time_ratio_{k}", text) for k, text in kinds] + [("token_time_ratio_all", "per token")],
            f"batch {run['batch']}: first's time / second's (below 1: first faster)",
        )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _error_bars(ax, rows: dict[str, dict], keys: Sequence[tuple[str, str]], title: str) -> None:
    """One group of points per row (its ratios under `keys`), each with its interval as an error bar."""
    width = 0.8 / max(len(keys), 1)
    for k, (key, label) in enumerate(keys):
        xs, ys, low, high = [], [], [], []
        for i, row in enumerate(rows.values()):
            if row.get(key) is None:
                continue
            bounds = row.get("intervals", {}).get(key) or [row[key], row[key]]
            xs.append(i - 0.4 + width * (k + 0.5))
            ys.append(row[key])
            low.append(max(row[key] - bounds[0], 0.0))
            high.append(max(bounds[1] - row[key], 0.0))
        ax.errorbar(xs, ys, yerr=[low, high], fmt="o", capsize=3, label=label)
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(list(rows), rotation=20, fontsize=8)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=8)
