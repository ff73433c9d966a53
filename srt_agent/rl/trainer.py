"""The RL trainer: ReTool's cold start, then GRPO / DAPO / PPO steps whose rollouts come from the SRT engine.

Each step: take the next prompts → multi-turn rollouts (n per prompt) with the training drafter →
rewards (DAPO: overlong shaping, dynamic sampling that refills the batch) → advantages → policy update
(packed micro-batches, gradient accumulation) → the engines receive the new weights in memory →
``end_step``. The per-prompt trees persist across steps. ``compare`` drafters regenerate every step from
the same weights and seeds (their tokens must be identical; only their time differs).

The Trainer is one run's lifecycle (cold start, steps, Ctrl-C, resume, report; its checkpoints, resume and
report in record.py); what a step computes lives in samples.py, update.py, metrics.py, checkpoint.py,
evaluate.py and report.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from ..agent.rollout import write_jsonl
from ..agent.toolconfig import load_tools, require_sandbox_runtime
from ..agent.trajectory import Trajectory
from ..config import ConfigError, EnvConfig, load_env_config
from ..console import Progress, phase_bar
from ..drafting import drafter_capabilities
from ..models import LoadedModel, load_model
from ..runner.device_info import resolve_engine_dtype
from .batch import Sample
from .checkpoint import (
    SavedStep,
    claim_out_dir,
    find_checkpoint,
    folder_bytes,
    load_checkpoint,
)
from .coldstart import ColdStartResult, cold_start_line, finish_report, run_cold_start
from .comparison import Comparison
from .correction import RolloutCorrection
from .data import PromptSampler
from .evaluate import HELD_OUT_FIGURES, ToolUseReport, evaluate_policy, held_out_tasks
from .interrupt import cooperative_interrupt, deferred_interrupt
from .memory import MemoryMeter, check_plan, memory_line, plan_memory, planned_engines
from .metrics import merged_summary, rollout_metrics, run_ahead_metrics, speculation_metrics, tail_metrics
from .policy import SamplerNumerics, build_policy, master_copy, require_peft
from .record import RunParts, RunRecord
from .report import step_table, step_warnings, story_lines, write_report
from .rollout_trace import TraceBook
from .rollouts import PolicyRollouts, RolloutRun, RolloutVariant, stats_delta
from .samples import informative_groups, step_samples
from .trackers import Tracker, make_trackers
from .update import trained_tokens, update_step


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


class Trainer(RunRecord):
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
        resume: str | Path | None = None,
        model: str | None = None,
        loaded: LoadedModel | None = None,
        console: Console | None = None,
        variants: Sequence[RolloutVariant] | None = None,
        on_step: Callable[[int, dict[str, float], dict[str, list[RolloutRun]]], None] | None = None,
        replace_run: bool = False,
    ):
        self.config = config.model_copy(deep=True)
        train = self.config.train
        main = self.config.engine.drafter
        train.compare = [d for d in dict.fromkeys(train.compare) if d != main]
        if self.config.sampling.temperature <= 0:
            raise ConfigError("sampling.temperature: RL needs temperature > 0 (a greedy policy has no log-probs)")
        if self.config.sampling.seed is None:
            raise ConfigError("sampling.seed: RL runs need a seed (steps derive theirs from it; null is not allowed)")
        require_peft(train.lora)  # before a model loads or a cold start runs
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
        self._check_interrupt: Callable[[], None] = lambda: None  # raises once a held Ctrl-C is due
        self.replace_run = replace_run
        self.variants = list(variants) if variants is not None else self._variants()
        self.on_step = on_step
        self.backend = self.config.engine.backend  # the one that runs, once the run starts
        self._step_runs: dict[str, list[RolloutRun]] = {}
        self.memory: dict = {}  # peak and plan (GB), once the run has ended
        self.engine_dtype = torch.float32  # what the engines compute in, and so receive weights in (once loaded)
        self.correction = RolloutCorrection(self.config.train, self.engine_dtype)  # set again once the run starts
        self.comparison = Comparison(self.variants[1:], self.config.sampling)
        self.traces = TraceBook(self.config, self.variants)  # every variant's rollouts, for the projection
        self.projection: dict = {}

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
        """Cold start, then the RL steps; returns the report (also written to the out dir).

        Refuses to start (ConfigError, one line) when the memory the run plans for exceeds what the machine
        has available or ``train.max_memory_gb``; the report's ``memory`` holds the peak and the plan."""
        with MemoryMeter() as meter:
            return self._run(meter)

    def _run(self, meter: MemoryMeter) -> dict:
        claim_out_dir(self.out_dir, self.resume, self.replace_run)
        cfg, train = self.config, self.config.train
        tools = load_tools(cfg.tools, cfg.interpreter) if cfg.tools is not None else {}
        require_sandbox_runtime(tools)  # before the model loads: one line, not a run that scores numpy as wrong
        if self.loaded is None:
            with self.console.status(f"loading {self.model_spec or cfg.model}"):
                self.loaded = load_model(self.model_spec or cfg.model, device=cfg.engine.device)
        tasks = cfg.dataset.tasks()
        if not tasks:
            raise ConfigError("dataset: no tasks")
        self.engine_dtype = resolve_engine_dtype(cfg.engine.dtype, self.loaded.device, self.loaded.dtype)
        own_copies, on_module = planned_engines(cfg, self.loaded, self.variants)
        tree_engines = sum(drafter_capabilities(v.drafter).trees for v in self.variants)
        engines = dict(vllm_engines=own_copies, policy_copies_model=on_module > 0, our_engines=on_module)
        plan = plan_memory(cfg, self.loaded.model, **engines, tree_engines=tree_engines)
        check_plan(plan, train.max_memory_gb)
        meter.mark("model loaded")
        # Our engine casts the module it runs on: the policy's float32 masters are taken before it does.
        masters = master_copy(self.loaded.model) if on_module and self.engine_dtype != self.loaded.dtype else None
        rollouts = PolicyRollouts(cfg, self.loaded, tools, self.variants, log=self._log)
        meter.mark("engines started")
        main = rollouts.backend(rollouts.main)
        self.backend = main.name
        sampler = SamplerNumerics(self.engine_dtype, main.capabilities.batch_invariant)
        self.correction = RolloutCorrection(train, self.engine_dtype)
        self.comparison.exact = {n: rollouts.backend(n).capabilities.exact_sampling for n in rollouts.drafters}
        trackers: list[Tracker] = []
        try:
            others = rollouts.drafters[1:]
            self._log(
                f"[bold]{self.loaded.name}[/bold] on {main.capabilities.device}: "
                f"{train.algorithm.upper()} ({train.dtype} updates, {str(self.engine_dtype)[6:]} rollouts), "
                f"{train.steps} steps × {train.prompts_per_step} prompts × "
                f"{cfg.n_samples} samples, rollouts with [bold]{rollouts.main}[/bold]"
                + (" and run-ahead" if self.variants[0].run_ahead is not None else "")
                + (f", compared with {', '.join(others)}" if others else "")
            )
            if tree_engines:
                self._log(cfg.tree_budget().line())
            self._announce_correction()
            state, saved_caches = load_checkpoint(self.resume) if self.resume is not None else (None, {})
            evaluate = self._evaluator(rollouts) if cfg.cold_start.eval_tasks else None
            if state is None:
                masters = self._cold_start(rollouts, tools, evaluate, sampler, masters)
            meter.mark("cold start done")
            own = not rollouts.serves_module  # vLLM serves the rollouts: the policy trains the loaded module itself
            policy = build_policy(cfg, self.loaded.model, copy=not own, sampler=sampler, masters=masters)
            masters = None  # the policy holds them now
            parts = RunParts(*policy, PromptSampler(tasks, seed=train.seed), rollouts)
            first = self._restore(state, saved_caches, parts) if state is not None else 0
            trackers = make_trackers(train.loggers, self.out_dir, cfg.model_dump(mode="json"), cfg.name)
            if evaluate is not None and "before RL" not in self.held_out:
                self._held_out("before RL", evaluate, trackers, first)
            self._warm_up(rollouts)
            self._loop(first, parts, trackers)
            if evaluate is not None and not self.interrupted and self.history:
                try:
                    self._held_out("after RL", evaluate, trackers, int(self.history[-1]["step"]))
                except KeyboardInterrupt:  # every step is saved: resuming runs only this evaluation
                    self.interrupted, self.checkpoint = True, find_checkpoint(self.out_dir)
        finally:
            for tracker in trackers:
                tracker.close()
            rollouts.close()
        self.memory = meter.report(plan, train.max_memory_gb)
        with deferred_interrupt():  # a Ctrl-C now waits for the report
            report = self._final_report()
            paths = write_report(self.out_dir, report)
        for line in story_lines(report):
            self._log(line)
        self._log(memory_line(self.memory))
        self._log(f"wrote {', '.join(str(p) for p in paths.values())} and rollouts/, checkpoints/")
        self._log(f"run folder {self.out_dir}: {folder_bytes(self.out_dir) / 1e9:.2f} GB")
        return report

    def _loop(self, first: int, parts: RunParts, trackers: list[Tracker]) -> None:
        """Steps `first + 1` … `train.steps`. Ctrl-C during a step's rollouts discards that step; during
        its update, recording or checkpoint it waits for them, then saves the finished step."""
        train, sampler = self.config.train, parts.sampler
        saved = first
        pending: SavedStep | None = None  # the last finished step that has no checkpoint yet
        steps = Progress(self.console, "train", train.steps - first, True, None)  # a line per step, after its row
        try:
            with cooperative_interrupt() as check:
                self._check_interrupt = check  # each rollout run starts with it
                for step in range(first + 1, train.steps + 1):
                    cursor = sampler.state_dict()
                    try:
                        metrics, gen = self._rollout_phase(step, parts)
                        check()
                    except (KeyboardInterrupt, asyncio.CancelledError):  # a Ctrl-C's cancellation leaves the
                        sampler.load_state_dict(cursor)  # `with` as KeyboardInterrupt; the step did not happen
                        raise
                    with deferred_interrupt() as interrupted:
                        self._train_phase(step, parts, metrics, gen)
                        self.correction.observe(metrics)
                        if self.on_step is not None:
                            self.on_step(step, metrics, self._step_runs)
                        self.history.append(metrics)
                        self.traces.add(step, self._step_runs)
                        write_jsonl(gen.trajectories, self.out_dir / "rollouts" / f"step-{step:06d}.jsonl")
                        for tracker in trackers:
                            tracker.log({k: v for k, v in metrics.items() if k != "step"}, step)
                        self.console.print(step_table(metrics, self.compared, header=len(self.history) == 1))
                        steps.done(f"step {step} of {train.steps}")
                        self._warn(metrics)
                        self._announce_correction()
                        if step % train.checkpoint_every == 0 or step == train.steps or interrupted:
                            self._save(step, parts, finished=step == train.steps and not interrupted)
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
        metrics.update(rollout_metrics(gen.trajectories, merged_summary(gen.runs)))
        metrics["timing_s/gen"] = gen.wall_s
        metrics["training/sampling_rounds"] = float(len(gen.runs))
        metrics.update(run_ahead_metrics(gen.runs, gen.wall_s))
        metrics.update(tail_metrics(gen.runs))
        metrics.update(speculation_metrics(gen.runs))
        compared = rollouts.drafters[1:]
        turn = step % len(compared) if compared else 0
        for name in (
            compared[turn:] + compared[:turn]
        ):  # each step starts with the next one: no drafter always runs first
            metrics.update(self._compare(name, gen, rollouts))
        metrics["timing_s/step"] = time.perf_counter() - t_step
        return metrics, gen

    def _train_phase(self, step: int, parts: RunParts, metrics: dict[str, float], gen: StepRollouts) -> None:
        """Rewards, advantages, the policy update and the engines' new weights (fills `metrics`)."""
        rollouts = parts.rollouts
        t_start = time.perf_counter()
        samples, filtered = step_samples(gen.runs, self.config)
        metrics["training/filtered_groups"] = float(filtered)
        if samples:
            with self._update_bubble(rollouts, parts.sampler) as bubble:
                metrics.update(self._update(samples, parts, step))
            metrics.update(bubble)
        else:
            metrics["training/skipped_updates"] = 1.0
            metrics["timing_s/update_actor"] = 0.0
            self._log(
                f"[yellow]step {step}: no group carries a learning signal (all rewards equal); update skipped[/yellow]"
            )
        t0 = time.perf_counter()
        rollouts.update_weights(
            parts.policy.engine_weights(self.engine_dtype), parts.policy.base is not self.loaded.model
        )
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
            run = self._run_with_progress(
                rollouts, rollouts.main, tasks, seed, f"step {step} rollouts", upcoming=upcoming
            )
            gen.rounds.append((tasks, seed, upcoming))
            gen.runs.append(run)
            if not train.dynamic_sampling:
                break
            kept = len(informative_groups(gen.runs, self.config))
            if kept >= train.prompts_per_step:
                break
        return gen

    def _run_with_progress(
        self, rollouts, drafter, tasks, seed, label, n: int | None = None, upcoming=None
    ) -> RolloutRun:
        n = n or self.config.n_samples
        self._check_interrupt()
        with self._phase(f"{label} ({drafter})", len(tasks) * n) as update:
            return rollouts.run(drafter, tasks, n, seed, on_done=lambda _: update(advance=1), upcoming=upcoming)

    def _phase(self, label: str, total: float | None = None, detail: str = "", lines: bool | None = False, **fields):
        """A transient progress bar on the run's console while a phase runs (`lines` None: a line per unit in
        a log, for the slow phases: cold start, held-out evaluation)."""
        return phase_bar(self.console, label, total, detail, lines, **fields)

    def _slow_phase(self, label: str, total: float | None = None, detail: str = "", **fields):
        """A phase whose units are few and slow: a bar on a terminal, a line per unit in a log."""
        return self._phase(label, total, detail, None, **fields)

    def _compare(self, name: str, gen: StepRollouts, rollouts: PolicyRollouts) -> dict[str, float]:
        """Regenerate the step's rounds with variant `name`: same weights, same seeds."""
        runs = [
            self._run_with_progress(rollouts, name, tasks, seed, "compare", upcoming=upcoming)
            for tasks, seed, upcoming in gen.rounds
        ]
        self._step_runs[name] = runs
        step = len(self.history) + 1
        return self.comparison.step_metrics(step, name, gen.runs, runs, self.loaded.model, self.engine_dtype)

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

    # ----- update ---------------------------------------------------------------------------------

    def _update(self, samples: list[Sample], parts: RunParts, step: int) -> dict[str, float]:
        seed = step_seed(self.config.train.seed, step, 99)
        with self._phase(f"step {step} update (trained tokens)", trained_tokens(samples, self.config.train)) as update:
            return update_step(
                parts.policy,
                parts.reference,
                parts.optimizer,
                parts.scheduler,
                samples,
                self.config.train,
                seed,
                on_tokens=lambda n: update(advance=n),
                correction=self.correction.mode,
            )

    def _announce_correction(self) -> None:
        line = self.correction.announcement()
        if line is not None:
            self._log(f"[yellow]{line}[/yellow]")

    def _warn(self, metrics: dict[str, float]) -> None:
        why = self.comparison.reasons()
        for line in step_warnings(metrics, self.config.train.logprob_mismatch_warn, self.config.engine.drafter, why):
            self._log(line)

    # ----- set-up, checkpoints, report --------------------------------------------------------------

    def _cold_start(
        self,
        rollouts: PolicyRollouts,
        tools: dict,
        evaluate: Callable[[str], ToolUseReport] | None,
        sampler: SamplerNumerics,
        masters: dict[str, torch.Tensor] | None,
    ) -> dict[str, torch.Tensor] | None:
        """Cold-start the policy (SFT from `masters` where given); returns the masters RL starts from."""
        cfg = self.config
        if not cfg.cold_start.enabled:
            return masters
        controller = rollouts.controllers[rollouts.main]
        args = dict(
            tokenizer=controller.tokenizer,
            config=cfg,
            env_class=controller.env_class,
            tools=tools,
            eos_token_ids=controller.eos_token_ids,
        )
        self.cold = run_cold_start(
            cfg, self.loaded, args, evaluate, self._slow_phase, self._log, rollouts.serves_module, sampler, masters
        )
        rollouts.update_weights(self.cold.weights)
        # The engines (and the module) hold them; a float32 copy only where the engines cast them.
        masters, self.cold.weights = (self.cold.weights if masters is not None else None), {}
        finish_report(self.cold, evaluate)
        self._log(cold_start_line(self.cold))
        return masters

    def _held_out(
        self, label: str, evaluate: Callable[[str], ToolUseReport], trackers: list[Tracker], step: int
    ) -> None:
        """The held-out report `label` (the cold start's "after" serves as "before RL"), logged as ``val/…``."""
        report = self.cold.after if label == "before RL" and self.cold and self.cold.after else evaluate(label)
        self.held_out[label] = report
        for tracker in trackers:
            tracker.log({f"val/{k}": getattr(report, k) for k in HELD_OUT_FIGURES}, step)
        self._log(
            f"held-out {label}: " + ", ".join(f"{k.replace('_', ' ')} {report.interval(k)}" for k in HELD_OUT_FIGURES)
        )

    def _warm_up(self, rollouts: PolicyRollouts) -> None:
        """Before the first compared step, an untimed rollout of one held-out task on every engine that has not
        generated yet, by a variant that drafts nothing where there is one: what is cold in an engine (kernels,
        allocations) is paid before either method is timed, not by whichever runs first."""
        if not self.compared:
            return
        tasks = held_out_tasks(self.config, 1) or self.config.dataset.tasks()[:1]
        plain = [n for n in rollouts.drafters if not drafter_capabilities(rollouts.variants[n].drafter).drafts]
        for name in plain + [n for n in rollouts.drafters if n not in plain]:
            if rollouts.engine_stats(name).get("tokens", 0) == 0:
                self._run_with_progress(rollouts, name, tasks, self.config.train.seed, "warm-up", n=1)

    def _evaluator(self, rollouts: PolicyRollouts) -> Callable[[str], ToolUseReport]:
        tasks, seed = held_out_tasks(self.config), self.config.cold_start.eval_seed

        def evaluate(label: str) -> ToolUseReport:
            self._check_interrupt()
            return evaluate_policy(rollouts, tasks, seed, phase=self._slow_phase, label=f"held-out tasks, {label}")[0]

        return evaluate

    def _log(self, message: str) -> None:
        self.console.print(message, highlight=False)


def step_seed(seed: int, step: int, round_index: int = 0) -> int:
    """The sampling seed of a step's rollout round (fresh samples every step, reproducible)."""
    return random.Random(f"{seed}/step/{step}/{round_index}").getrandbits(31)
