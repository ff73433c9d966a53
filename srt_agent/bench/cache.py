"""`srt-agent bench cache`: drafters side by side on a synthetic RL-like rollout workload.

The workload imitates GRPO rollouts: each prompt gets ``rollouts`` samples per step for ``steps``
steps; a sample mixes spans copied (with mutations) from earlier samples of the same prompt,
repeats of its own earlier text, and fresh Zipf-distributed tokens. Every drafter sees the same
token stream through the Drafter API, in two modes: ``sequential`` (one rollout at a time) and
``lockstep`` (all rollouts of a step interleaved, one decoding step each per round, as a batched
engine runs them). Each round every live rollout drafts, then each draft is verified greedily against the
true next tokens and the accepted tokens plus one more are stored, as after a batched verification pass.
Mean times are the thread's CPU time over each round's block of calls (what other processes take of a
loaded machine is not counted); percentiles are per call, in wall time.
"""

from __future__ import annotations

import ctypes
import gc
import os
import random
import time
from dataclasses import asdict, dataclass, field

from ..console import Progress
from ..drafting.draft import Draft
from ..drafting.drafter import Drafter
from ..drafting.drafters.arctic import ArcticDrafter
from ..drafting.registry import drafter_unavailable, exact_drafters, make_drafter

MODES = ("sequential", "lockstep")
METRICS = ("accepted_per_draft", "draft_us_mean", "draft_us_p99", "insert_us_per_token", "bytes_per_token")


@dataclass
class Rollout:
    """One sample of the workload: the prompt it answers and its full response."""

    prompt_key: str
    prompt_ids: list[int]
    response: list[int]


@dataclass
class WorkloadSpec:
    """Sizes and mixing probabilities of the synthetic workload."""

    prompts: int = 32
    rollouts: int = 8
    steps: int = 2
    tokens: int = 1000
    prompt_tokens: int = 64
    vocab: int = 32000
    copy_prob: float = 0.55
    self_repeat_prob: float = 0.1
    mutation_rate: float = 0.03
    seed: int = 0


def make_workload(spec: WorkloadSpec) -> list[list[Rollout]]:
    """Rollouts per step: later samples of a prompt copy spans of earlier ones, with mutations."""
    rng = random.Random(spec.seed)

    def fresh() -> int:
        return min(int(rng.paretovariate(1.2)) - 1, spec.vocab - 1)

    prompts = [[rng.randrange(spec.vocab) for _ in range(spec.prompt_tokens)] for _ in range(spec.prompts)]
    earlier: list[list[list[int]]] = [[] for _ in range(spec.prompts)]
    steps = []
    for _ in range(spec.steps):
        step = []
        for p in range(spec.prompts):
            for _ in range(spec.rollouts):
                out: list[int] = []
                while len(out) < spec.tokens:
                    r = rng.random()
                    if earlier[p] and r < spec.copy_prob:
                        src = rng.choice(earlier[p])
                        at = min(max(0, len(out) + rng.randint(-60, 60)), len(src) - 1)
                        span = src[at : at + int(rng.expovariate(1 / 48)) + 1]
                        out.extend(fresh() if rng.random() < spec.mutation_rate else t for t in span)
                    elif len(out) > 16 and r < spec.copy_prob + spec.self_repeat_prob:
                        at = rng.randrange(len(out) - 8)
                        out.extend(out[at : at + int(rng.expovariate(1 / 12)) + 2])
                    else:
                        out.extend(fresh() for _ in range(int(rng.expovariate(1 / 16)) + 1))
                del out[spec.tokens :]
                step.append(Rollout(f"prompt-{p}", prompts[p], out))
                earlier[p].append(out)
        steps.append(step)
    return steps


def accepted_tokens(draft: Draft, truth: list[int]) -> int:
    """How many draft tokens greedy verification against the true continuation keeps."""
    children: dict[tuple[int, int], int] = {}
    for i, (tok, parent) in enumerate(zip(draft.token_ids, draft.parents)):
        children.setdefault((parent, tok), i)
    node, n = -1, 0
    while n < len(truth):
        node = children.get((node, truth[n]), -2)
        if node == -2:
            break
        n += 1
    return n


@dataclass
class DrafterResult:
    """One drafter's figures for one mode (times in µs, wall clock per API call)."""

    accepted_per_draft: float
    draft_us_mean: float
    draft_us_p99: float
    insert_us_per_token: float
    bytes_per_token: float | None
    rss_bytes_per_token: float | None
    drafts: int
    tokens: int


@dataclass
class _Live:
    """A rollout being generated: its request id, context so far and response tokens done."""

    rollout: Rollout
    request_id: str
    context: list[int]
    done: int = 0


@dataclass
class StepTimes:
    """What one step's rollouts cost a drafter: CPU time of its drafts and inserts (blocks of calls timed by the
    thread's CPU clock, so time the machine gives other processes is not counted), each call's wall time (for
    percentiles), tokens, accepted draft tokens and each lockstep round's insert µs per token."""

    draft_cpu_ns: int = 0
    insert_cpu_ns: int = 0
    draft_ns: list[int] = field(default_factory=list)
    insert_ns: list[int] = field(default_factory=list)
    tokens: int = 0
    accepted: int = 0
    round_insert_us: list[float] = field(default_factory=list)
    finished: bool = True


def run_step(
    drafter: Drafter,
    step: list[Rollout],
    name: str,
    mode: str,
    budget: int,
    time_limit_s: float = float("inf"),
) -> StepTimes:
    """Generate one step's rollouts through `drafter` (`name` prefixes request ids): rounds in which every live
    rollout drafts, then every one stores what greedy verification kept (plus the next token), as a batched
    engine does; `lockstep` runs all rollouts at once, `sequential` one after another."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    times, start = StepTimes(), time.monotonic()
    for w, wave in enumerate([step] if mode == "lockstep" else [[r] for r in step]):
        live = [_Live(r, f"{name}/{w}/{i}/{r.prompt_key}", list(r.prompt_ids)) for i, r in enumerate(wave)]
        for req in live:
            drafter.start_request(req.request_id, req.rollout.prompt_key, req.rollout.prompt_ids)
        while live and time.monotonic() - start < time_limit_s:
            live = _round(drafter, live, budget, times)
        times.finished = not live
        for req in live:  # cut short by the time limit: they end where they got to
            drafter.stop_request(req.request_id)
    drafter.end_step()
    return times


def _round(drafter: Drafter, live: list[_Live], budget: int, times: StepTimes) -> list[_Live]:
    """One decoding round of the live rollouts; those still running."""
    clock = time.perf_counter_ns
    drafts = []
    cpu = time.thread_time_ns()
    for req in live:
        t0 = clock()
        drafts.append(drafter.draft(req.request_id, req.context, budget))
        times.draft_ns.append(clock() - t0)
    times.draft_cpu_ns += time.thread_time_ns() - cpu
    news = []
    for req, draft in zip(live, drafts):
        truth = req.rollout.response[req.done : req.done + budget + 1]
        n = accepted_tokens(draft, truth)
        times.accepted += n
        news.append(truth[: n + 1])
    cpu = time.thread_time_ns()
    for req, new in zip(live, news):
        t0 = clock()
        drafter.add_tokens(req.request_id, new)
        times.insert_ns.append(clock() - t0)
    spent = time.thread_time_ns() - cpu
    times.insert_cpu_ns += spent
    tokens = 0
    for req, new in zip(live, news):
        req.context.extend(new)
        req.done += len(new)
        tokens += len(new)
    times.tokens += tokens
    times.round_insert_us.append(spent / 1e3 / max(1, tokens))
    for req in live:
        if req.done >= len(req.rollout.response):
            drafter.stop_request(req.request_id)
    return [req for req in live if req.done < len(req.rollout.response)]


def percentile_us(values: list[int], q: float = 0.99) -> float:
    """The `q` quantile of wall times in ns, in µs (0 for none)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] / 1e3 if values else 0.0


def run_drafter(
    drafter: Drafter,
    workload: list[list[Rollout]],
    mode: str,
    budget: int,
) -> DrafterResult:
    """Generate the workload's rollouts through `drafter` and measure it."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    _release_free_memory()
    rss_before = _rss_bytes()
    steps = [run_step(drafter, step, str(s), mode, budget) for s, step in enumerate(workload)]
    _release_free_memory()
    rss = _rss_bytes() - rss_before if rss_before is not None else None
    kept = _kept_bytes(drafter, rss)
    tokens = sum(t.tokens for t in steps)
    draft_ns = [ns for t in steps for ns in t.draft_ns]
    return DrafterResult(
        accepted_per_draft=sum(t.accepted for t in steps) / max(1, len(draft_ns)),
        draft_us_mean=sum(t.draft_cpu_ns for t in steps) / max(1, len(draft_ns)) / 1e3,
        draft_us_p99=percentile_us(draft_ns),
        insert_us_per_token=sum(t.insert_cpu_ns for t in steps) / max(1, tokens) / 1e3,
        bytes_per_token=kept / tokens if kept is not None and tokens else None,
        rss_bytes_per_token=rss / tokens if rss is not None and tokens else None,
        drafts=len(draft_ns),
        tokens=tokens,
    )


def cache_drafters() -> tuple[str, ...]:
    """The benchmark's drafters: the registry's exact ones that draft without a model."""
    return exact_drafters(model=False, baseline=False)


def available_drafters() -> list[str]:
    """The benchmark's drafters that can run here (arctic only when arctic-inference imports)."""
    return [name for name in cache_drafters() if drafter_unavailable(name) is None]


def skipped_drafters() -> list[str]:
    """Why each of the benchmark's drafters that cannot run here is left out."""
    return [f"skipped {name}: {why}" for name in cache_drafters() if (why := drafter_unavailable(name)) is not None]


def cache_benchmark(
    spec: WorkloadSpec,
    budget: int = 16,
    modes: tuple[str, ...] = MODES,
    drafters: list[str] | None = None,
    work: Progress | None = None,
) -> dict:
    """Run every drafter in every mode on one workload; the JSON-ready result, with ratios vs arctic. `work`
    hears of each run (mode and drafter) as it starts and ends."""
    work = work or Progress.unseen()
    names = drafters if drafters is not None else available_drafters()
    workload = make_workload(spec)
    total = sum(len(r.response) for step in workload for r in step)
    skipped = skipped_drafters() if drafters is None else []
    result: dict = {
        "workload": asdict(spec),
        "budget": budget,
        "tokens_per_run": total,
        "skipped": skipped,
        "modes": {},
    }
    work.update(total=len(modes) * len(names))
    for mode in modes:
        result["modes"][mode] = {}
        for name in names:
            work.now(f"{mode} {name}")
            drafter = make_drafter(name)
            run = run_drafter(drafter, workload, mode, budget)
            result["modes"][mode][name] = asdict(run)
            work.done(f"{mode} {name}: {run.accepted_per_draft:.2f} accepted/draft, {run.draft_us_mean:.1f} µs/draft")
            del drafter
            gc.collect()
    if "arctic" in names:
        result["ratios"] = {
            mode: {
                f"{name}/arctic": {
                    m: (per[name][m] / per["arctic"][m]) if per[name][m] is not None and per["arctic"][m] else None
                    for m in METRICS
                }
                for name in names
                if name != "arctic"
            }
            for mode, per in result["modes"].items()
        }
    return result


def result_table(result: dict):
    """A rich table of the result: one row per mode and drafter."""
    from rich.table import Table

    table = Table("mode", "drafter", "accepted/draft", "draft µs", "draft p99 µs", "insert µs/tok", "bytes/tok")
    for mode, per in result["modes"].items():
        for name, r in per.items():
            bpt = r["bytes_per_token"]
            table.add_row(
                mode,
                name,
                f"{r['accepted_per_draft']:.2f}",
                f"{r['draft_us_mean']:.1f}",
                f"{r['draft_us_p99']:.1f}",
                f"{r['insert_us_per_token']:.2f}",
                "-" if bpt is None else f"{bpt:.0f}",
            )
    return table


def _kept_bytes(drafter: Drafter, rss: int | None) -> int | None:
    """Bytes a drafter keeps across requests: its caches' own accounting, else the RSS growth
    (arctic's C++ trees), None for drafters that keep nothing (n-gram)."""
    caches = [getattr(drafter, attr, None) for attr in ("cache", "local", "responses")]
    caches = [c for c in caches if c is not None]
    if caches:
        return sum(c.stats().bytes for c in caches)
    return rss if isinstance(drafter, ArcticDrafter) else None


def _release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS, so RSS growth measures a run."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


__all__ = ["WorkloadSpec", "accepted_tokens", "cache_benchmark", "make_workload", "result_table", "run_drafter"]
