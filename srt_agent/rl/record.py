"""What a training run holds, records and takes back: its parts, each step's checkpoint, the resume from one,
and the run's report (a mix-in of :class:`~.trainer.Trainer`, whose state it reads)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..backends import VLLM_IDENTICAL_NOTE
from ..config import ConfigError
from ..drafting import RolloutCache
from .checkpoint import save_checkpoint, set_rng_state
from .coldstart import ColdStartResult
from .data import PromptSampler
from .evaluate import ToolUseReport
from .metrics import speed_totals
from .policy import Policy
from .projection import run_projection
from .rollouts import PolicyRollouts


@dataclass
class RunParts:
    """What an RL run holds while it runs."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    reference: Policy | None
    sampler: PromptSampler
    rollouts: PolicyRollouts


class RunRecord:
    """Checkpoints, resume and report of a :class:`~.trainer.Trainer`."""

    def _save(
        self,
        step: int,
        parts: RunParts,
        caches: dict[str, RolloutCache] | None = None,
        rng: dict | None = None,
        finished: bool = False,
    ) -> None:
        """Step `step`'s checkpoint; a `finished` run's leaves AdamW's moments out unless ``train.keep_optimizer``."""
        keep_optimizer = not finished or self.config.train.keep_optimizer
        state = {
            "reference": parts.reference.state_dict() if parts.reference is not None else None,
            "policy": parts.policy.state_dict(),
            "optimizer": parts.optimizer.state_dict() if keep_optimizer else None,
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
            raise ConfigError(
                f"checkpoint was trained with {saved['algorithm']!r}, this config says {self.config.train.algorithm!r}"
            )
        parts.policy.load_state_dict(state["policy"])
        if parts.reference is not None:
            if state.get("reference") is None:
                raise ConfigError(
                    "the checkpoint has no reference policy; it was saved by a run that used none (no KL loss, train.kl_coef, "
                    "nor an estimator that reads reference log-probs)"
                )
            parts.reference.load_state_dict(state["reference"])
        if state["optimizer"] is not None:
            parts.optimizer.load_state_dict(state["optimizer"])
        else:
            self._log("the checkpoint is a finished run's, without AdamW's moments: they start afresh")
        parts.scheduler.load_state_dict(state["scheduler"])
        parts.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.history = list(state["history"])
        if state.get("cold_start"):
            self.cold = ColdStartResult.from_report(state["cold_start"])
        self.held_out = {label: ToolUseReport(**r) for label, r in state.get("held_out", {}).items()}
        for name, path in caches.items():
            if name in parts.rollouts.controllers:
                parts.rollouts.restore_cache(name, RolloutCache.load(path))
        parts.rollouts.update_weights(
            parts.policy.engine_weights(self.engine_dtype), parts.policy.base is not self.loaded.model
        )
        self._log(f"resumed from step {state['step']} ({self.resume})")
        return int(state["step"])

    def _final_report(self) -> dict:
        """The report of the finished (or interrupted) run, with its projection."""
        self.projection = self._project()
        return self.report()

    def _project(self) -> dict:
        """The run's rollouts projected onto a GPU and validated on this machine (never raises: an ``error`` says
        why not); the traces it read are written to OUT/traces/ for ``srt-agent bench project``."""
        with self.console.status("projecting the rollouts onto a GPU"):
            projection = run_projection(self.traces.traces, self.variants[0].name)
        try:
            for name, trace in self.traces.traces.items():
                trace.save(self.out_dir / "traces" / f"{name.replace('/', '_')}.json")
        except OSError as exc:
            projection["traces_error"] = str(exc)
        return projection

    def report(self) -> dict:
        cfg, train = self.config, self.config.train
        totals = speed_totals(self.history, self.compared)
        if not self.comparison.exact.get(self.variants[0].name, True):
            totals.update({f"identical_vs_{name}_note": VLLM_IDENTICAL_NOTE for name in self.compared})
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
            "identity": self.comparison.differences,
            "totals": totals,
            "config": cfg.model_dump(mode="json"),
            "memory": self.memory,
            "projection": self.projection,
        }
