"""Rollout traces: what a run's rollouts did, recorded once so the replay simulator can rerun it without
the model.

Per RL step: every trajectory as the engine saw it (the first call's prompt, then model-written turns
and forced observations, each observation with the seconds its tool calls took), the engine's step
costs as its cost model knew them when the step began, the run-ahead continuations the engine put into
the trees, and the figures the replay is checked against (forwards and accepted draft tokens).
"""

from __future__ import annotations

import json
import lzma
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..agent.trajectory import Trajectory
from ..config import EnvConfig
from ..drafting.choice.cost_model import ForwardCostModel
from .rollouts import RolloutRun, RolloutVariant


@dataclass
class TracedTrajectory:
    """One episode as engine calls: ``prompt_ids`` starts the first call (its last ``prefix_len`` tokens
    are a forced opening of the response); ``turns[i]`` are the tokens the model wrote in call i;
    ``observations[i]`` (forced) and ``waits_s[i]`` follow it, if any."""

    prompt_key: str
    prompt_ids: list[int]
    turns: list[list[int]]
    observations: list[list[int]]
    waits_s: list[float]
    prefix_len: int = 0
    forwards: int = 0
    draft_accepted: int = 0

    @classmethod
    def of(cls, traj: Trajectory, prompt_key: str) -> TracedTrajectory:
        """Split a trajectory at its mask changes: a forced prefix joins the prompt; model runs are turns."""
        runs: list[tuple[int, list[int]]] = []
        for token, mask in zip(traj.response_ids, traj.response_mask):
            if runs and runs[-1][0] == mask:
                runs[-1][1].append(token)
            else:
                runs.append((mask, [token]))
        prompt = list(traj.prompt_ids)
        prefix = runs.pop(0)[1] if runs and runs[0][0] == 0 else []
        turns = [tokens for mask, tokens in runs if mask == 1]
        observations = [tokens for mask, tokens in runs if mask == 0]
        waits = [sum(c.wall_s for c in traj.tool_calls if c.turn == i) for i in range(len(observations))]
        return cls(
            prompt_key, prompt + prefix, turns, observations, waits, len(prefix), traj.forwards, traj.draft_accepted
        )


@dataclass
class TracedRunAhead:
    """A run-ahead continuation: the prompt's key, the context it continued and the tokens it wrote."""

    prompt_key: str
    context: list[int]
    tokens: list[int]


@dataclass
class TracedStep:
    """One RL step of one engine: its trajectories, cost table and run-ahead content."""

    step: int
    trajectories: list[TracedTrajectory]
    cost: dict  # ForwardCostModel figures when the step began (see `srt_agent.engine.stats.cost_table`)
    run_ahead: list[TracedRunAhead] = field(default_factory=list)
    wall_s: float = 0.0
    draft_s: float = 0.0  # the backend's host seconds drafting (its speculation figures' host_s) …
    bookkeeping_s: float = 0.0  # … and on the rest of its steps beside the forward pass
    cost_after: dict = field(default_factory=dict)  # the cost table when the step ended (its steps measured)
    engine_s: float = 0.0  # of wall_s, the seconds the engine spent in steps that ran the step's sequences

    @property
    def forwards(self) -> int:
        """Rows the step's verification passes ran (one per trajectory and pass)."""
        return sum(t.forwards for t in self.trajectories)

    @property
    def accepted_per_forward(self) -> float:
        forwards = sum(t.forwards for t in self.trajectories)
        return sum(t.draft_accepted for t in self.trajectories) / forwards if forwards else 0.0


@dataclass
class RolloutTrace:
    """A run of one engine configuration (`variant`) over consecutive RL steps."""

    variant: str
    drafter: str
    limits: dict  # max_tokens_per_turn, max_response_tokens
    engine: dict  # max_batch, max_context, max_draft_tokens, min_draft_gain, adaptive_drafts
    cache: dict  # the drafter's RolloutCache options (max_depth, max_match, max_bytes)
    run_ahead: dict | None = None  # the engine's RunAheadOptions, if it ran ahead
    steps: list[TracedStep] = field(default_factory=list)

    def save(self, path: str | Path) -> Path:
        """Write the trace as JSON (xz-compressed where `path` ends in ``.xz``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(asdict(self)).encode()
        path.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME) if path.suffix == ".xz" else data)
        return path

    @classmethod
    def load(cls, path: str | Path) -> RolloutTrace:
        try:
            raw = Path(path).read_bytes()
            data = json.loads(lzma.decompress(raw) if Path(path).suffix == ".xz" else raw)
            steps = [
                TracedStep(
                    s["step"],
                    [TracedTrajectory(**t) for t in s["trajectories"]],
                    s["cost"],
                    [TracedRunAhead(**r) for r in s.get("run_ahead", [])],
                    s.get("wall_s", 0.0),
                    s.get("draft_s", 0.0),
                    s.get("bookkeeping_s", 0.0),
                    s.get("cost_after", {}),
                    s.get("engine_s", 0.0),
                )
                for s in data.pop("steps")
            ]
            return cls(**data, steps=steps)
        except (OSError, ValueError, KeyError, TypeError, lzma.LZMAError) as exc:
            raise ValueError(f"{path} is not a rollout trace: {exc}") from None


def cost_model_of(table: dict) -> ForwardCostModel:
    """A cost model with a recorded table's figures (the replay never updates it)."""
    model = ForwardCostModel()
    model.calibrate([(row["tokens"], row["seconds"], row["sequences"]) for row in table["shapes"]])
    model.fixed_s, model.per_token_s, model.per_sequence_s = (
        table["fixed_s"],
        table["per_token_s"],
        table["per_sequence_s"],
    )
    return model


class TraceBook:
    """Every variant's runs, step by step, as one rollout trace per variant (with its engine's settings, step
    costs and host time): what the trainer's projection and the benchmarks' replay read."""

    def __init__(self, config: EnvConfig, variants: list[RolloutVariant]):
        self.limits = dict(
            max_tokens_per_turn=config.max_tokens_per_turn, max_response_tokens=config.max_response_tokens
        )
        self.variants = {v.name: v for v in variants}
        self.traces: dict[str, RolloutTrace] = {}

    def add(self, step: int, runs: dict[str, list[RolloutRun]]) -> None:
        """A finished step's runs, per variant."""
        for name, rs in runs.items():
            if not rs:
                continue
            if name not in self.traces:
                variant = self.variants[name]
                ahead = asdict(variant.run_ahead) if variant.run_ahead is not None else None
                settings = {"engine": {}, "cache": {}, **rs[0].settings}
                self.traces[name] = RolloutTrace(
                    name, variant.drafter, limits=dict(self.limits), run_ahead=ahead, **settings
                )
            trajectories = [TracedTrajectory.of(t, t.prompt_key) for run in rs for t in run.trajectories]
            written = [TracedRunAhead(str(k), list(c), list(g)) for run in rs for k, c, g in run.run_ahead_written]
            draft_s = sum(run.speculation.get("host_s", 0.0) for run in rs)
            bookkeeping_s = sum(run.bookkeeping_s for run in rs)
            engine_s = sum(run.tail.get("step_s", 0.0) for run in rs)
            wall_s = sum(r.wall_s for r in rs)
            self.traces[name].steps.append(
                TracedStep(
                    step, trajectories, rs[0].cost, written, wall_s, draft_s, bookkeeping_s, rs[-1].cost_after, engine_s
                )
            )
