"""`srt-agent bench cache --scale`: SRT's trees at the batch and length a GPU step runs, step by step.

Each setting is ``ROLLOUTSxTOKENS`` rollouts in flight at once (GRPO groups of ``rollouts_per_prompt``) of
``TOKENS`` response tokens each, in lockstep as a batched engine runs them, for ``steps`` RL steps over the same
prompts. SRT (its default options: prompt trees, the global tree of responses, held turns) drafts and stores
through the Drafter API, verified greedily against the workload (`cache.make_workload`). Per step: insert and
draft µs (mean and p99 per call), the worst stretch of 10 consecutive rounds in µs per inserted token (a bound
that costs a rebuild per token shows there at once), rebuilds, trimmed sequences, evictions, the work of keeping
the bounds (tokens put through a tree per token stored) and the trees' bytes. Means are CPU time (see
`cache.run_step`), so a loaded machine shows in the step's seconds, not in them. A step over ``step_limit_s``
stops the setting there (reported as unfinished).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..console import Progress
from ..drafting.drafters.srt import SRTDrafter
from .cache import StepTimes, WorkloadSpec, make_workload, percentile_us, run_step

WINDOW = 10  # consecutive rounds whose slowest-kept insert cost the benchmark reports


@dataclass(frozen=True)
class ScaleSetting:
    """Rollouts in flight and response tokens per rollout."""

    rollouts: int
    tokens: int

    @classmethod
    def parse(cls, text: str) -> ScaleSetting:
        """``"256x1000"`` -> 256 rollouts in flight of 1,000 tokens."""
        try:
            rollouts, tokens = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"a scale setting is ROLLOUTSxTOKENS (e.g. 256x1000), got {text!r}") from None
        if rollouts < 1 or tokens < 1:
            raise ValueError(f"a scale setting needs positive sizes, got {text!r}")
        return cls(rollouts, tokens)


@dataclass
class StepFigures:
    """One RL step of a scale run: means in CPU µs (per call, or per inserted token), p99 in wall µs per call."""

    step: int
    seconds: float
    finished: bool
    rounds: int
    tokens: int
    insert_us_per_token: float
    insert_us_p99: float
    draft_us_mean: float
    draft_us_p99: float
    worst_window_insert_us_per_token: float  # max over 10 consecutive rounds of their least µs/token
    accepted_per_draft: float
    rebuilds: int
    trimmed_sequences: int
    evicted_prompts: int
    evicted_run_ahead: int
    work_per_token: float  # tokens put through a tree per token stored, this step (1 = no bound's work)
    bytes: int  # prompt trees + global tree + held turns after the step


def worst_window(per_round: list[float], window: int = WINDOW) -> float:
    """The largest value that `window` consecutive rounds all reached (0 with fewer rounds)."""
    if len(per_round) < window:
        return 0.0
    return max(min(per_round[i : i + window]) for i in range(len(per_round) - window + 1))


def _work(srt: SRTDrafter) -> tuple[int, int, int, int, int, int]:
    """Summed over SRT's trees: inserted, rebuilt tokens, rebuilds, trimmed, evicted prompts, evicted run-ahead."""
    stats = [srt.cache.stats()] + ([srt.responses.stats()] if srt.responses is not None else [])
    return tuple(
        sum(getattr(s, name, 0) for s in stats)
        for name in (
            "inserted_tokens",
            "rebuilt_tokens",
            "rebuilds",
            "trimmed_sequences",
            "evicted_prompts",
            "evicted_run_ahead",
        )
    )


def _step_figures(times: StepTimes, seconds: float) -> dict:
    drafts = len(times.draft_ns)
    return dict(
        seconds=seconds,
        finished=times.finished,
        rounds=len(times.round_insert_us),
        tokens=times.tokens,
        insert_us_per_token=times.insert_cpu_ns / 1e3 / max(1, times.tokens),
        insert_us_p99=percentile_us(times.insert_ns),
        draft_us_mean=times.draft_cpu_ns / 1e3 / max(1, drafts),
        draft_us_p99=percentile_us(times.draft_ns),
        worst_window_insert_us_per_token=worst_window(times.round_insert_us),
        accepted_per_draft=times.accepted / max(1, drafts),
    )


def scale_run(
    setting: ScaleSetting,
    steps: int = 3,
    rollouts_per_prompt: int = 8,
    budget: int = 16,
    seed: int = 0,
    step_limit_s: float = 600.0,
    on_step: Callable[[StepFigures], None] = lambda figures: None,
    **srt_options,
) -> dict:
    """One setting, `steps` steps with SRT's default options (or `srt_options`); the JSON-ready result.
    `on_step` sees each step's figures as it ends."""
    group = min(rollouts_per_prompt, setting.rollouts)
    spec = WorkloadSpec(
        prompts=max(1, setting.rollouts // group), rollouts=group, steps=steps, tokens=setting.tokens, seed=seed
    )
    workload = make_workload(spec)
    gc.collect()
    gc.freeze()  # the workload's objects: collections need not walk them
    try:
        srt = SRTDrafter(**srt_options)
        figures = []
        for step, step_rollouts in enumerate(workload, start=1):
            before, started = _work(srt), time.monotonic()
            times = run_step(srt, step_rollouts, str(step), "lockstep", budget, step_limit_s)
            raw = _step_figures(times, time.monotonic() - started)
            after = [b - a for a, b in zip(before, _work(srt))]
            inserted, rebuilt = after[0], after[1]
            sizes = srt.stats()
            held = srt.turns.nbytes
            figures.append(
                StepFigures(
                    step=step,
                    rebuilds=after[2],
                    trimmed_sequences=after[3],
                    evicted_prompts=after[4],
                    evicted_run_ahead=after[5],
                    work_per_token=(inserted + rebuilt) / max(1, inserted),
                    bytes=sizes.cache.bytes + (sizes.responses.bytes if sizes.responses else 0) + held,
                    **raw,
                )
            )
            on_step(figures[-1])
            if not raw["finished"]:
                break
    finally:
        gc.unfreeze()
    return {
        "setting": asdict(setting),
        "workload": asdict(spec),
        "budget": budget,
        "steps": [asdict(f) for f in figures],
    }


def scale_benchmark(settings: list[ScaleSetting], steps: int = 3, work: Progress | None = None, **options) -> dict:
    """Every setting in turn; the JSON-ready result. `work` hears of each step of each setting as it ends."""
    work = work or Progress.unseen()
    work.update(total=len(settings) * steps)
    runs = []
    for setting in settings:
        name = f"srt {setting.rollouts}x{setting.tokens}"
        work.now(name)

        def step_done(figures: StepFigures, name: str = name) -> None:
            cut = "" if figures.finished else " (cut)"
            work.done(
                f"{name} step {figures.step}{cut}: {figures.seconds:.1f} s, {figures.insert_us_per_token:.2f} µs/token"
            )

        runs.append(scale_run(setting, steps, on_step=step_done, **options))
        work.add_total(len(runs[-1]["steps"]) - steps)  # a step cut short by the time limit ends the setting
    return {"scale": runs}


def scale_table(result: dict):
    """A rich table: one row per setting and step."""
    from rich.table import Table

    table = Table(
        "in flight × tokens",
        "step",
        "s",
        "insert µs/tok",
        "insert p99 µs",
        "worst 10 rounds µs/tok",
        "draft µs",
        "draft p99 µs",
        "accepted/draft",
        "rebuilds",
        "trimmed",
        "evicted",
        "work/tok",
        "MB",
    )
    for run in result["scale"]:
        name = f"{run['setting']['rollouts']} × {run['setting']['tokens']}"
        for s in run["steps"]:
            table.add_row(
                name,
                f"{s['step']}" + ("" if s["finished"] else " (cut)"),
                f"{s['seconds']:.1f}",
                f"{s['insert_us_per_token']:.2f}",
                f"{s['insert_us_p99']:.0f}",
                f"{s['worst_window_insert_us_per_token']:.1f}",
                f"{s['draft_us_mean']:.1f}",
                f"{s['draft_us_p99']:.0f}",
                f"{s['accepted_per_draft']:.2f}",
                str(s["rebuilds"]),
                str(s["trimmed_sequences"]),
                str(s["evicted_prompts"] + s["evicted_run_ahead"]),
                f"{s['work_per_token']:.2f}",
                f"{s['bytes'] / 1e6:.0f}",
            )
    return table


__all__ = ["ScaleSetting", "scale_benchmark", "scale_run", "scale_table", "worst_window"]
