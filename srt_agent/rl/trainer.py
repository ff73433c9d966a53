"""The RL trainer: ReTool's cold start, then GRPO / DAPO / PPO steps whose rollouts come from the SRT engine.

Each step: take the next prompts → multi-turn rollouts (n per prompt) with the training drafter →
rewards (DAPO: overlong shaping, dynamic sampling that refills the batch) → advantages → policy update
(packed micro-batches, gradient accumulation) → the engines receive the new weights in memory →
``end_step``. The per-prompt trees persist across steps. ``compare`` drafters regenerate every step from
the same weights and seeds (their tokens must be identical; only their time differs).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from ..agent.rollout import summarize, write_jsonl
from ..agent.toolconfig import load_tools
from ..agent.trajectory import Trajectory
from ..backends.vllm import VLLM_IDENTICAL_NOTE
from ..cache import DRAFTERS, LENIENT_DRAFTERS, RolloutCache
from ..config import ConfigError, EnvConfig, load_env_config
from ..datasets import arithmetic_tasks
from ..models import LoadedModel, load_model
from . import algorithms
from .batch import Sample
from .checkpoint import (
    find_checkpoint,
    holds_run,
    load_checkpoint,
    rng_state,
    run_folder,
    save_checkpoint,
    set_rng_state,
)
from .coldstart import ColdStartResult, finish_report, run_cold_start
from .data import PromptSampler
from .evaluate import ToolUseReport, tool_use_report
from .metrics import identical_share, rollout_metrics, sample_metrics
from .policy import Policy
from .progress import phase_bar
from .report import step_table, story_lines, write_report
from .rollouts import PolicyRollouts, RolloutRun, RolloutVariant, stats_delta
from .traces import trajectory_sample
from .trackers import Tracker, make_trackers
from .update import logprob_mismatch, needs_old_pass, score_samples, update_policy


@dataclass
class RunParts:
    """What an RL run holds while it runs."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    reference: Policy | None
    sampler: PromptSampler
    rollouts: PolicyRollouts


@dataclass
class SavedStep:
    """A finished step's trees and RNG state, kept until its checkpoint is written (or an interrupt
    writes it: the interrupted step's rollouts have changed both since)."""

    step: int
    rng: dict
    trees: dict[str, bytes]

    @classmethod
    def now(cls, step: int, caches: dict[str, RolloutCache]) -> SavedStep:
        return cls(step, rng_state(), {name: cache.to_bytes() for name, cache in caches.items()})

    def caches(self) -> dict[str, RolloutCache]:
        return {name: RolloutCache.from_bytes(data) for name, data in self.trees.items()}


@dataclass
class StepRollouts:
    """A step's rollout rounds (dynamic sampling may need several) with the training drafter."""

    rounds: list[tuple[list, int, list]]  # (tasks, seed, upcoming tasks) per round
    runs: list[RolloutRun]

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for run in self.runs for t in run.trajectories]

    @property
    def wall_s(self) -> float:
        return sum(run.wall_s for run in self.runs)


class Trainer:
    """An RL run of one env config (see the ``train:`` and ``cold_start:`` sections).

    ``Trainer(config, out_dir).run()`` runs the cold start (or takes it from the cache) and the RL
    steps, writing checkpoints, rollouts, tracker logs, report.json, plots.png and summary.md to
    `out_dir`. `resume` continues from a checkpoint (a step folder or a run's out dir); a new run never
    writes into a folder that holds another run unless `replace_run` says so. `variants`
    replaces the training drafter and the compared ones (the first trains); `on_step(step, metrics,
    runs)` sees every finished step with each variant's rollout runs.
    """

    def __init__(
        self,
        config: EnvConfig,
        out_dir: str | Path,
        *,
        steps: int | None = None,
        compare: Sequence[str] | None = None,
        resume: str | Path | None = None,
        model: str | None = None,
        loaded: LoadedModel | None = None,
        cold_start: bool | None = None,
        console: Console | None = None,
        variants: Sequence[RolloutVariant] | None = None,
        on_step: Callable[[int, dict[str, float], dict[str, list[RolloutRun]]], None] | None = None,
        replace_run: bool = False,
    ):
        self.config = config.model_copy(deep=True)
        train = self.config.train
        if steps is not None:
            train.steps = steps
        if compare is not None:
            train.compare = list(compare)
        if cold_start is not None:
            self.config.cold_start.enabled = cold_start
        main = self.config.engine.drafter
        unknown = [d for d in train.compare if d not in DRAFTERS]
        if unknown:
            raise ConfigError(f"unknown drafter(s) to compare {unknown}; choose from {sorted(DRAFTERS)}")
        train.compare = [d for d in dict.fromkeys(train.compare) if d != main]
        if self.config.sampling.temperature <= 0:
            raise ConfigError("sampling.temperature: RL needs temperature > 0 (a greedy policy has no log-probs)")
        if self.config.sampling.seed is None:
            raise ConfigError("sampling.seed: RL runs need a seed (steps derive theirs from it; null is not allowed)")
        self.out_dir = Path(out_dir)
        self.resume = Path(resume) if resume is not None else None
        self.model_spec = model
        self.loaded = loaded
        self.console = console or Console()
        self.history: list[dict[str, float]] = []
        self.cold: ColdStartResult | None = None
        self.interrupted = False
        self.held_out: dict[str, ToolUseReport] = {}  # "before RL", "after RL"
        self.checkpoint: Path | None = None  # the newest checkpoint when the run was interrupted
        self.replace_run = replace_run
        self.variants = list(variants) if variants is not None else self._variants()
        self.on_step = on_step
        self.backend = self.config.engine.backend  # the one that runs, once the run starts
        self._step_runs: dict[str, list[RolloutRun]] = {}

    @property
    def compared(self) -> list[str]:
        """Names of the variants that regenerate every step beside the training one."""
        return [v.name for v in self.variants[1:]]

    def _variants(self) -> list[RolloutVariant]:
        """The training drafter (with run-ahead if the config turns it on), then the compared drafters."""
        cfg, train = self.config, self.config.train
        main = RolloutVariant(cfg.engine.drafter, cfg.engine.drafter, cfg.engine.run_ahead.options(seed=train.seed))
        return [main] + [RolloutVariant(name, name) for name in train.compare]

    @classmethod
    def from_env_file(cls, path: str | Path, out_dir: str | Path, **options) -> Trainer:
        return cls(load_env_config(path), out_dir, **options)

    # ----- the run --------------------------------------------------------------------------------

    def run(self) -> dict:
        """Cold start, then the RL steps; returns the report (also written to the out dir)."""
        self._check_out_dir()
        check_writable(self.out_dir)
        cfg, train = self.config, self.config.train
        tools = load_tools(cfg.tools, cfg.interpreter) if cfg.tools is not None else {}
        if self.loaded is None:
            with self.console.status(f"loading {self.model_spec or cfg.model}"):
                self.loaded = load_model(self.model_spec or cfg.model, device=cfg.engine.device)
        tasks = cfg.dataset.tasks()
        if not tasks:
            raise ConfigError("dataset: no tasks")
        rollouts = PolicyRollouts(cfg, self.loaded, tools, self.variants, log=self._log)
        self.backend = rollouts.backend(rollouts.main).name
        trackers: list[Tracker] = []
        try:
            others = rollouts.drafters[1:]
            self._log(
                f"[bold]{self.loaded.name}[/bold] on {rollouts.controllers[rollouts.main].engine.engine.device}: "
                f"{train.algorithm.upper()}, {train.steps} steps × {train.prompts_per_step} prompts × "
                f"{cfg.n_samples} samples, rollouts with [bold]{rollouts.main}[/bold]"
                + (" and run-ahead" if self.variants[0].run_ahead is not None else "")
                + (f", compared with {', '.join(others)}" if others else "")
            )
            state, saved_caches = load_checkpoint(self.resume) if self.resume is not None else (None, {})
            evaluate = self._evaluator(rollouts) if cfg.cold_start.eval_tasks else None
            if state is None:
                self._cold_start(rollouts, tools, evaluate)
            parts = RunParts(*self._build_policy(), PromptSampler(tasks, seed=train.seed), rollouts)
            first = self._restore(state, saved_caches, parts) if state is not None else 0
            trackers = make_trackers(train.loggers, self.out_dir, cfg.model_dump(mode="json"), cfg.name)
            if evaluate is not None and "before RL" not in self.held_out:
                self._held_out("before RL", evaluate, trackers, first)
            self._loop(first, parts, trackers)
            if evaluate is not None and not self.interrupted and self.history:
                self._held_out("after RL", evaluate, trackers, int(self.history[-1]["step"]))
        finally:
            for tracker in trackers:
                tracker.close()
            rollouts.close()
        report = self.report()
        paths = write_report(self.out_dir, report)
        for line in story_lines(report):
            self._log(line)
        self._log(f"wrote {', '.join(str(p) for p in paths.values())} and rollouts/, checkpoints/")
        return report

    def _loop(self, first: int, parts: RunParts, trackers: list[Tracker]) -> None:
        """Steps `first + 1` … `train.steps`. Ctrl-C during a step's rollouts discards that step; during
        its update, recording or checkpoint it waits for them, then saves the finished step."""
        train, sampler = self.config.train, parts.sampler
        saved = first
        pending: SavedStep | None = None  # the last finished step that has no checkpoint yet
        try:
            for step in range(first + 1, train.steps + 1):
                cursor = sampler.state_dict()
                try:
                    metrics, gen = self._rollout_phase(step, parts)
                except KeyboardInterrupt:
                    sampler.load_state_dict(cursor)  # the interrupted step did not happen
                    raise
                with deferred_interrupt() as interrupted:
                    self._train_phase(step, parts, metrics, gen)
                    if self.on_step is not None:
                        self.on_step(step, metrics, self._step_runs)
                    self.history.append(metrics)
                    write_jsonl(gen.trajectories, self.out_dir / "rollouts" / f"step-{step:06d}.jsonl")
                    for tracker in trackers:
                        tracker.log({k: v for k, v in metrics.items() if k != "step"}, step)
                    self.console.print(step_table(metrics, self.compared, header=len(self.history) == 1))
                    self._warn(metrics)
                    if step % train.checkpoint_every == 0 or step == train.steps or interrupted:
                        self._save(step, parts)
                        saved, pending = step, None
                    else:
                        pending = SavedStep.now(step, parts.rollouts.caches())
        except KeyboardInterrupt:
            self.interrupted = True
            if pending is not None and pending.step > saved:
                # The trees and RNG as the step left them: the interrupted rollouts changed both since.
                self._save(pending.step, parts, caches=pending.caches(), rng=pending.rng)
                saved = pending.step
            self.checkpoint = find_checkpoint(self.out_dir) if saved > 0 else None

    def _rollout_phase(self, step: int, parts: RunParts) -> tuple[dict[str, float], StepRollouts]:
        """The step's rollouts with the training drafter and every compared one (interruptible)."""
        rollouts = parts.rollouts
        t_step = time.perf_counter()
        revisit = parts.sampler.cursor.epoch >= 1  # every prompt was rolled out in an earlier epoch
        gen = self._generate(step, rollouts, parts.sampler)
        self._step_runs = {rollouts.main: gen.runs}
        metrics: dict[str, float] = {"step": float(step), "training/revisit": float(revisit)}
        metrics.update(rollout_metrics(gen.trajectories, _merged_summary(gen.runs)))
        metrics["timing_s/gen"] = gen.wall_s
        metrics["training/sampling_rounds"] = float(len(gen.runs))
        metrics.update(run_ahead_metrics(gen.runs, gen.wall_s))
        compared = rollouts.drafters[1:]
        turn = step % len(compared) if compared else 0
        for name in compared[turn:] + compared[:turn]:  # each step starts with the next one: no drafter always runs first
            metrics.update(self._compare(name, gen, rollouts))
        metrics["timing_s/step"] = time.perf_counter() - t_step
        return metrics, gen

    def _train_phase(self, step: int, parts: RunParts, metrics: dict[str, float], gen: StepRollouts) -> None:
        """Rewards, advantages, the policy update and the engines' new weights (fills `metrics`)."""
        rollouts = parts.rollouts
        t_start = time.perf_counter()
        samples, filtered = self._samples(gen)
        metrics["training/filtered_groups"] = float(filtered)
        if samples:
            with self._update_bubble(rollouts, parts.sampler) as bubble:
                metrics.update(self._update(samples, parts, step))
            metrics.update(bubble)
        else:
            metrics["training/skipped_updates"] = 1.0
            metrics["timing_s/update_actor"] = 0.0
            self._log(f"[yellow]step {step}: no group carries a learning signal (all rewards equal); update skipped[/yellow]")
        t0 = time.perf_counter()
        rollouts.update_weights(parts.policy.engine_weights())
        rollouts.end_step()
        metrics["timing_s/update_weights"] = time.perf_counter() - t0
        metrics["timing_s/step"] += time.perf_counter() - t_start
        metrics["perf/throughput"] = metrics["srt/model_tokens"] / max(metrics["timing_s/step"], 1e-9)

    # ----- rollouts -------------------------------------------------------------------------------

    def _generate(self, step: int, rollouts: PolicyRollouts, sampler: PromptSampler) -> StepRollouts:
        train = self.config.train
        gen = StepRollouts([], [])
        kept = 0
        for round_index in range(train.max_sampling_rounds if train.dynamic_sampling else 1):
            tasks = sampler.next_batch(train.prompts_per_step - kept)
            upcoming = sampler.peek(self.config.engine.run_ahead.window or train.prompts_per_step)
            seed = step_seed(train.seed, step, round_index)
            run = self._run_with_progress(rollouts, rollouts.main, tasks, seed, f"step {step} rollouts", upcoming=upcoming)
            gen.rounds.append((tasks, seed, upcoming))
            gen.runs.append(run)
            if not train.dynamic_sampling:
                break
            kept = len(self._informative(gen))
            if kept >= train.prompts_per_step:
                break
        return gen

    def _run_with_progress(self, rollouts, drafter, tasks, seed, label, n: int | None = None, upcoming=None) -> RolloutRun:
        n = n or self.config.n_samples
        with self._phase(f"{label} ({drafter})", len(tasks) * n) as update:
            return rollouts.run(drafter, tasks, n, seed, on_done=lambda _: update(advance=1), upcoming=upcoming)

    def _phase(self, label: str, total: float | None = None, detail: str = "", **fields):
        """A transient progress bar on the run's console while a phase runs."""
        return phase_bar(self.console, label, total, detail, **fields)

    def _compare(self, name: str, gen: StepRollouts, rollouts: PolicyRollouts) -> dict[str, float]:
        """Regenerate the step's rounds with variant `name`: same weights, same seeds."""
        runs = [self._run_with_progress(rollouts, name, tasks, seed, "compare", upcoming=upcoming)
                for tasks, seed, upcoming in gen.rounds]
        self._step_runs[name] = runs
        trajectories = [t for run in runs for t in run.trajectories]
        wall = sum(run.wall_s for run in runs)
        summary = _merged_summary(runs)
        main_tokens = _merged_summary(gen.runs).model_tokens
        out = {
            f"compare/{name}/gen_s": wall,
            f"compare/{name}/speedup": wall / gen.wall_s if gen.wall_s > 0 else 0.0,
            # time per generated token, theirs over ours: what compares speed when the trajectories differ
            f"compare/{name}/token_speedup": (wall / max(summary.model_tokens, 1)) / (gen.wall_s / main_tokens)
            if gen.wall_s > 0 and main_tokens else 0.0,
            f"compare/{name}/tokens_per_forward": summary.tokens_per_forward,
            f"compare/{name}/accepted_per_forward": summary.draft_accepted / summary.forwards if summary.forwards else 0.0,
            f"compare/{name}/identical": identical_share(gen.trajectories, trajectories),
        }
        out.update({f"compare/{name}/{k}": v for k, v in run_ahead_metrics(runs, wall).items()})
        return out

    @contextlib.contextmanager
    def _update_bubble(self, rollouts: PolicyRollouts, sampler: PromptSampler) -> Iterator[dict[str, float]]:
        """Run ahead on the next step's prompts while the policy updates, if the config asks for it;
        yields the metrics dict it fills (tokens, and how long the update took beside it)."""
        main = self.variants[0]
        out: dict[str, float] = {}
        if main.run_ahead is None or "update" not in main.run_ahead.bubbles:
            yield out
            return
        window = sampler.peek(self.config.engine.run_ahead.window or self.config.train.prompts_per_step)
        before = rollouts.run_ahead_stats(main.name)
        rollouts.open_run_ahead(main.name, [], window, phase="update")
        try:
            yield out
        finally:
            rollouts.close_run_ahead(main.name)
            out["run_ahead/update_tokens"] = float(stats_delta(before, rollouts.run_ahead_stats(main.name))["tokens"])

    def _informative(self, gen: StepRollouts) -> set:
        rewards, groups = [], []
        for r, run in enumerate(gen.runs):
            for t in run.trajectories:
                if t.finish_reason != "error":
                    rewards.append(self._reward(t))
                    groups.append((r, t.task_index))
        return algorithms.informative_groups(rewards, groups)

    def _reward(self, traj: Trajectory) -> float:
        train = self.config.train
        shaping = algorithms.overlong_penalty(
            len(traj.response_ids), self.config.max_response_tokens, train.overlong_buffer, train.overlong_penalty
        )
        return traj.reward + shaping

    def _samples(self, gen: StepRollouts) -> tuple[list[Sample], int]:
        """Training samples of the step (errors dropped; DAPO: only informative groups, at most the batch)."""
        train = self.config.train
        samples = []
        for r, run in enumerate(gen.runs):
            for t in run.trajectories:
                if t.finish_reason != "error" and t.response_ids:
                    sample = trajectory_sample(t, group=(r, t.task_index))
                    sample.reward = self._reward(t)
                    samples.append(sample)
        groups = list(dict.fromkeys(s.group for s in samples))
        if not train.dynamic_sampling:
            return samples, 0
        keep = [g for g in groups if g in self._informative(gen)][: train.prompts_per_step]
        kept = [s for s in samples if s.group in set(keep)]
        return kept, len(groups) - len(keep)

    # ----- update ---------------------------------------------------------------------------------

    def _update(self, samples: list[Sample], parts: RunParts, step: int) -> dict[str, float]:
        train, policy, reference = self.config.train, parts.policy, parts.reference
        out: dict[str, float] = {}
        t0 = time.perf_counter()
        if needs_old_pass(train) or train.adv_estimator == "gae":
            logprobs, values = score_samples(policy, samples, train.micro_batch_tokens)
            for s, lp in zip(samples, logprobs):
                s.old_logprobs = lp
            if values is not None:
                for s, v in zip(samples, values):
                    s.values = v
        if train.kl_coef > 0:
            ref_logprobs, _ = score_samples(reference or policy, samples, train.micro_batch_tokens, reference=reference is None)
            for s, lp in zip(samples, ref_logprobs):
                s.ref_logprobs = lp
        out["timing_s/old_log_prob"] = time.perf_counter() - t0
        compute_advantages(samples, train)
        generator = torch.Generator().manual_seed(step_seed(train.seed, step, 99))
        t0 = time.perf_counter()
        trained = train.ppo_epochs * sum(s.trained_tokens for s in samples)
        with self._phase(f"step {step} update (trained tokens)", trained) as update:
            out.update(update_policy(policy, parts.optimizer, samples, train, generator, parts.scheduler,
                                     on_tokens=lambda n: update(advance=n)))
        out["timing_s/update_actor"] = time.perf_counter() - t0
        out.update(logprob_mismatch(samples, [s.old_logprobs or [] for s in samples]))
        out.update(sample_metrics(samples))
        out["perf/trained_tokens"] = float(sum(s.trained_tokens for s in samples))
        out["perf/update_tokens"] = float(sum(len(s) for s in samples))
        return out

    def _warn(self, metrics: dict[str, float]) -> None:
        train = self.config.train
        diff = metrics.get("training/rollout_logprob_diff_mean")
        if diff is not None and diff > train.logprob_mismatch_warn:
            self._log(
                f"[red]step {metrics['step']:.0f}: engine and trainer log-probs differ by {diff:.4f} on average "
                f"(max {metrics.get('training/rollout_logprob_diff_max', 0):.4f}) — the rollouts may not be on-policy[/red]"
            )
        if metrics.get("training/nonfinite_updates", 0):
            self._log(f"[red]step {metrics['step']:.0f}: non-finite loss or gradient; "
                      f"{metrics['training/nonfinite_updates']:.0f} optimizer step(s) skipped[/red]")
        for name in self.compared:
            share = metrics.get(f"compare/{name}/identical", 1.0)
            if share < 1.0:
                lenient = next(v.drafter for v in self.variants if v.name == name) in LENIENT_DRAFTERS
                why = "it accepts drafts leniently: not exactly on-policy" if lenient else "float32 near-ties can flip between batch shapes"
                if self.backend == "vllm" and not self.config.engine.vllm.exact_sampling:
                    why = VLLM_IDENTICAL_NOTE
                self._log(
                    f"[yellow]step {metrics['step']:.0f}: {name}'s rollouts match {share:.0%} of {self.config.engine.drafter}'s "
                    f"token for token ({why})[/yellow]"
                )

    # ----- set-up, checkpoints, report --------------------------------------------------------------

    def _cold_start(self, rollouts: PolicyRollouts, tools: dict, evaluate: Callable[[str], ToolUseReport] | None) -> None:
        cfg = self.config
        if not cfg.cold_start.enabled:
            return
        controller = rollouts.controllers[rollouts.main]
        args = dict(
            tokenizer=controller.tokenizer, config=cfg, env_class=controller.env_class, tools=tools,
            eos_token_ids=controller.eos_token_ids,
        )
        self.cold = run_cold_start(cfg, self.loaded, args, evaluate, self._phase, log=self._log)
        rollouts.update_weights(self.cold.weights)
        finish_report(self.cold, evaluate)
        self._log(cold_start_line(self.cold))

    def _held_out(self, label: str, evaluate: Callable[[str], ToolUseReport], trackers: list[Tracker], step: int) -> None:
        """The held-out report `label` (the cold start's "after" serves as "before RL"), logged as ``val/…``."""
        report = self.cold.after if label == "before RL" and self.cold and self.cold.after else evaluate(label)
        self.held_out[label] = report
        for tracker in trackers:
            tracker.log({f"val/{k}": getattr(report, k) for k in HELD_OUT_FIGURES}, step)
        self._log(f"held-out {label}: " + ", ".join(f"{k.replace('_', ' ')} {report.interval(k)}" for k in HELD_OUT_FIGURES))

    def _evaluator(self, rollouts: PolicyRollouts) -> Callable[[str], ToolUseReport]:
        cs, cfg = self.config.cold_start, self.config
        seen = {t.prompt[-1]["content"] for t in cfg.dataset.tasks()}
        seen |= {t.prompt[-1]["content"] for t in arithmetic_tasks(cs.n, cs.seed, few_shot=cfg.dataset.few_shot)}
        tasks = [t for t in arithmetic_tasks(cs.eval_tasks * 2, cs.eval_seed, few_shot=cfg.dataset.few_shot)
                 if t.prompt[-1]["content"] not in seen][: cs.eval_tasks]

        def evaluate(label: str) -> ToolUseReport:
            run = self._run_with_progress(rollouts, rollouts.main, tasks, cs.eval_seed, f"held-out tasks, {label}", n=1)
            return tool_use_report(run.trajectories)

        return evaluate

    def _build_policy(self):
        train, cfg = self.config.train, self.config
        dtype = getattr(torch, train.dtype)
        policy = Policy(self.loaded.model, cfg.sampling.temperature, train.lora, value_head=train.adv_estimator == "gae", dtype=dtype)
        reference = None
        if train.kl_coef > 0 and policy.lora is None:
            reference = Policy(self.loaded.model, cfg.sampling.temperature, dtype=dtype)
            for p in reference.parameters():
                p.requires_grad_(False)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=train.lr, weight_decay=train.weight_decay)
        warmup = train.warmup_steps * train.mini_batches * train.ppo_epochs
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
        return policy, optimizer, scheduler, reference

    def _check_out_dir(self) -> None:
        """Refuse to write a run into a folder that holds another one (resuming continues its own run);
        with `replace_run`, remove the other run's checkpoints, rollouts and report first."""
        if not holds_run(self.out_dir):
            return
        if self.replace_run:
            for name in ("checkpoints", "rollouts"):
                shutil.rmtree(self.out_dir / name, ignore_errors=True)
            (self.out_dir / "report.json").unlink(missing_ok=True)
            return
        if self.resume is not None and run_folder(self.resume).resolve() == self.out_dir.resolve():
            return
        raise ConfigError(
            f"{self.out_dir} already holds a run: continue it with --resume {self.out_dir}, "
            "or start a new one in another folder with --out"
        )

    def _save(self, step: int, parts: RunParts, caches: dict[str, RolloutCache] | None = None, rng: dict | None = None) -> None:
        state = {
            "reference": parts.reference.state_dict() if parts.reference is not None else None,
            "policy": parts.policy.state_dict(),
            "optimizer": parts.optimizer.state_dict(),
            "scheduler": parts.scheduler.state_dict(),
            "sampler": parts.sampler.state_dict(),
            "history": self.history,
            "cold_start": self.cold.report() if self.cold else None,
            "held_out": {label: r.as_dict() for label, r in self.held_out.items()},
            "config": self.config.model_dump(mode="json"),
        }
        caches = parts.rollouts.caches() if caches is None else caches
        save_checkpoint(self.out_dir, step, state, caches, keep=self.config.train.keep_checkpoints, rng=rng)

    def _restore(self, state: dict, caches: dict[str, Path], parts: RunParts) -> int:
        saved = state.get("config", {}).get("train", {})
        if saved.get("algorithm") not in (None, self.config.train.algorithm):
            raise ConfigError(f"checkpoint was trained with {saved['algorithm']!r}, this config says {self.config.train.algorithm!r}")
        parts.policy.load_state_dict(state["policy"])
        if parts.reference is not None:
            if state.get("reference") is None:
                raise ConfigError("the checkpoint has no reference policy; it was saved without a KL loss (train.kl_coef)")
            parts.reference.load_state_dict(state["reference"])
        parts.optimizer.load_state_dict(state["optimizer"])
        parts.scheduler.load_state_dict(state["scheduler"])
        parts.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.history = list(state["history"])
        if state.get("cold_start"):
            c = state["cold_start"]
            self.cold = ColdStartResult({}, c["traces"], c["trained_tokens"], c["sft"],
                                        ToolUseReport(**c["before"]) if c.get("before") else None,
                                        ToolUseReport(**c["after"]) if c.get("after") else None,
                                        c["seconds"], c["cached"], c["key"])
        self.held_out = {label: ToolUseReport(**r) for label, r in state.get("held_out", {}).items()}
        for name, path in caches.items():
            if name in parts.rollouts.controllers:
                parts.rollouts.restore_cache(name, RolloutCache.load(path))
        parts.rollouts.update_weights(parts.policy.engine_weights())
        self._log(f"resumed from step {state['step']} ({self.resume})")
        return int(state["step"])

    def report(self) -> dict:
        cfg, train = self.config, self.config.train
        totals: dict = {}
        gen = sum(m.get("timing_s/gen", 0.0) for m in self.history)
        for name in self.compared:
            other = sum(m.get(f"compare/{name}/gen_s", 0.0) for m in self.history)
            if gen > 0:
                totals[f"speedup_vs_{name}"] = other / gen
            for label, revisit in (("first", 0.0), ("revisit", 1.0)):
                chosen = [m for m in self.history if m.get("training/revisit") == revisit]
                mine = sum(m.get("timing_s/gen", 0.0) for m in chosen)
                if mine > 0:
                    totals[f"speedup_vs_{name}_{label}"] = sum(m.get(f"compare/{name}/gen_s", 0.0) for m in chosen) / mine
            shares = [m.get(f"compare/{name}/identical", 0.0) for m in self.history]
            totals[f"identical_vs_{name}"] = sum(shares) / len(shares) if shares else None
            if self.backend == "vllm" and not cfg.engine.vllm.exact_sampling:
                totals[f"identical_vs_{name}_note"] = VLLM_IDENTICAL_NOTE
        totals["gen_s"] = gen
        totals["update_s"] = sum(m.get("timing_s/update_actor", 0.0) for m in self.history)
        return {
            "name": cfg.name,
            "algorithm": train.algorithm,
            "drafter": self.variants[0].name,
            "backend": self.backend,
            "compare": self.compared,
            "model": self.loaded.name if self.loaded else cfg.model,
            "interrupted": self.interrupted,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "cold_start": self.cold.report() if self.cold else None,
            "held_out": {label: r.as_dict() for label, r in self.held_out.items()},
            "steps": self.history,
            "totals": totals,
            "config": cfg.model_dump(mode="json"),
        }

    def _log(self, message: str) -> None:
        self.console.print(message, highlight=False)


HELD_OUT_FIGURES = ("accuracy", "tool_call_rate", "code_ok_rate", "mean_reward")


def compute_advantages(samples: Sequence[Sample], train) -> None:
    """Fill every sample's per-token ``advantages`` (and ``returns`` for GAE) from its reward."""
    if train.adv_estimator == "grpo":
        scores = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        adv = algorithms.grpo_advantages(scores, [s.group for s in samples], train.norm_adv_by_std)
        for s, a in zip(samples, adv.tolist()):
            s.advantages = [a if m else 0.0 for m in s.response_mask]
        return
    length = max(len(s.response_ids) for s in samples)
    mask = torch.zeros(len(samples), length)
    rewards = torch.zeros(len(samples), length)
    values = torch.zeros(len(samples), length)
    for i, s in enumerate(samples):
        mask[i, : len(s.response_mask)] = torch.tensor(s.response_mask, dtype=torch.float32)
        values[i, : len(s.values)] = torch.tensor(s.values)
        last = max((j for j, m in enumerate(s.response_mask) if m), default=None)
        if last is not None:
            rewards[i, last] = s.reward
    adv, returns = algorithms.gae_advantages(rewards, values, mask, train.gamma, train.lam)
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        s.advantages = adv[i, :n].tolist()
        s.returns = returns[i, :n].tolist()


def run_ahead_metrics(runs: Sequence[RolloutRun], gen_s: float) -> dict[str, float]:
    """What run-ahead did during these rollout runs: tokens put into the trees (per bubble), the
    share of the forward passes' rows it fed, and its predicted share of the generation time."""
    stats = [run.run_ahead for run in runs if run.run_ahead is not None]
    if not stats:
        return {}
    total = {k: sum(s[k] for s in stats) for k in ("tokens", "rows", "real_rows", "sequences", "preempted", "added_s", "tokens_upcoming", "prefill_tokens", "copied_tokens")}
    out = {f"run_ahead/{k}": float(v) for k, v in total.items()}
    for bubble in stats[0]["tokens_by_bubble"]:
        out[f"run_ahead/tokens_{bubble}"] = float(sum(s["tokens_by_bubble"][bubble] for s in stats))
    out["run_ahead/row_share"] = total["rows"] / max(total["rows"] + total["real_rows"], 1)
    out["run_ahead/time_share"] = total["added_s"] / gen_s if gen_s > 0 else 0.0
    return out


def step_seed(seed: int, step: int, round_index: int = 0) -> int:
    """The sampling seed of a step's rollout round (fresh samples every step, reproducible)."""
    return random.Random(f"{seed}/step/{step}/{round_index}").getrandbits(31)


def _merged_summary(runs: Sequence[RolloutRun]):
    trajectories = [t for run in runs for t in run.trajectories]
    merged = summarize(trajectories, _NoWaits(), sum(run.wall_s for run in runs))
    merged.tool_wait_s = sum(run.summary.tool_wait_s for run in runs)
    merged.idle_slot_s_during_tool_waits = sum(run.summary.idle_slot_s_during_tool_waits for run in runs)
    return merged


@dataclass
class _NoWaits:
    waits: int = 0
    wait_s: float = 0.0
    idle_slot_s: float = 0.0


def cold_start_line(cold: ColdStartResult) -> str:
    """One line on the cold start: traces, time, held-out tool use before and after."""
    text = f"cold start: {cold.traces} traces, {cold.trained_tokens} trained tokens" + (
        " (cached)" if cold.cached else f", {cold.seconds:.0f} s"
    )
    if cold.before and cold.after:
        b, a = cold.before, cold.after
        text += (
            f"; held-out tool calls {b.tool_call_rate:.0%} → {a.tool_call_rate:.0%}, clean code runs "
            f"{b.code_ok_rate:.0%} → {a.code_ok_rate:.0%}, accuracy {b.accuracy:.0%} → {a.accuracy:.0%}"
        )
    return text


def check_writable(out_dir: Path) -> None:
    """Create `out_dir` and prove it is writable, or raise a clear error before any work starts."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output directory {out_dir} is not writable: {exc.strerror or exc}") from None


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[list]:
    """Hold Ctrl-C until the block ends (an update or a checkpoint is never left half done); yields a
    list that is non-empty once a Ctrl-C is held."""
    caught: list = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt

