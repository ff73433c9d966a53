"""Trace replay: a recorded run's rollouts rerun through the rollout cache and the engine's draft choice,
without the model, to sweep draft budgets, tree limits and run-ahead settings in seconds.

Speculation is lossless, so every sampled token is known in advance: the trace's. What drafting
changes is how many of them each verification step accepts, and that is decided by the draft (the
drafter's tree at that moment), the cost model's choice of nodes and the true next tokens. The replay
runs the real drafter and the engine's own scheduler and draft choice (`Scheduler`, `Drafting`: budgets,
the cost model's choice, the acceptance calibration) on a simulated clock: every episode starts when the
step does, a batch step costs what the step's clock predicts for its shape (the recorded cost table, or
another device's, `rl/roofline_cost.py`), a finished turn waits
its recorded tool time before its observation is fed. Run-ahead content comes from the recorded
continuations (real samples of the policy, never the tokens they are judged on), fed into the bubbles the
simulated clock finds, sized by the same row-cost rule as the engine's.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..drafting import drafter_capabilities, make_drafter
from ..drafting.choice.cost_model import ForwardCostModel
from ..drafting.draft import Draft
from ..engine.drafting import Drafting
from ..engine.options import EngineOptions, RunAheadOptions
from ..engine.params import SamplingParams
from ..engine.run_ahead import RowCost
from ..engine.scheduler import Scheduler
from ..engine.sequence import Sequence
from ..engine.stats import EngineStats
from .rollout_trace import RolloutTrace, TracedRunAhead, TracedStep, TracedTrajectory, cost_model_of

ENGINE_DEFAULTS = {
    k: getattr(EngineOptions(), k)
    for k in ("max_batch", "max_context", "max_draft_tokens", "min_draft_gain", "adaptive_drafts")
}
ANY_TOKEN = sys.maxsize  # the vocabulary bound drafts are checked against: a trace's trees hold only its tokens


@dataclass
class ReplayOptions:
    """What to change from the recorded run (None keeps the trace's setting)."""

    drafter: str | None = None
    max_batch: int | None = None
    max_draft_tokens: int | None = None
    min_draft_gain: float | None = None
    adaptive_drafts: bool | None = None
    max_depth: int | None = None
    max_match: int | None = None
    max_bytes: int | None = None
    run_ahead: RunAheadOptions | None = None  # feed recorded run-ahead content into the simulated bubbles
    # (default: the trace's own run-ahead options, if it ran ahead)


@dataclass
class TableCost:
    """A recorded step-cost table as the replay's clock: the draft choice reads it, and a step costs what it
    predicts for the step's shape (sequences, tokens fed)."""

    choice: ForwardCostModel
    host_s_per_row: float = 0.0  # the engine's host work per row and step beside the forward pass

    def seconds(self, rows: list[tuple[int, int]]) -> float:
        """Seconds of a step whose rows feed ``rows[i] = (tokens, cached context)``."""
        return self.choice.predict(sum(tokens for tokens, _ in rows), len(rows)) + self.host_s_per_row * len(rows)


def recorded_costs(step: TracedStep) -> TableCost:
    """The step's own recorded cost table (the forward pass only)."""
    return TableCost(cost_model_of(step.cost))


@dataclass
class ReplayedStep:
    """One RL step as replayed, beside what the real run measured."""

    step: int
    accepted_per_forward: float
    recorded_accepted_per_forward: float
    forwards: int
    accepted: int
    simulated_s: float
    recorded_s: float
    run_ahead_tokens: int = 0
    busy_s: float = 0.0  # of simulated_s, the seconds batch steps ran (the rest: every sequence waits on a tool)

    @property
    def error(self) -> float:
        """Relative error of the replay's accepted tokens per verification step."""
        real = self.recorded_accepted_per_forward
        return abs(self.accepted_per_forward - real) / real if real > 0 else float(self.accepted_per_forward > 0)


@dataclass
class _Episode:
    """A trajectory replayed: the engine's sequence of it, and where it stands in the recorded turns."""

    seq: Sequence
    traj: TracedTrajectory
    turn: int = 0
    pos: int = 0  # tokens of the current turn already produced
    resume_at: float = 0.0

    @property
    def truth(self) -> list[int]:
        return self.traj.turns[self.turn][self.pos :]


def call_params(traj: TracedTrajectory, tokens: list[int], limits: dict) -> SamplingParams:
    """The limits of a call that continues `tokens`: a turn's tokens, and what is left of the response's."""
    response = len(tokens) - (len(traj.prompt_ids) - traj.prefix_len)
    left = limits["max_response_tokens"] - response
    return SamplingParams(max_tokens=max(1, min(limits["max_tokens_per_turn"], left)))


@dataclass
class _Ahead:
    seq: Sequence
    item: TracedRunAhead
    prefill: int
    pos: int = 0


@dataclass
class _Clock:
    """A replayed step's simulated time and counts, its run-ahead content and sequences, and the engine's
    scheduler, whose slots the real sequences and the run-ahead ones share."""

    scheduler: Scheduler
    cost: TableCost
    time: float = 0.0
    busy: float = 0.0  # seconds in batch steps
    forwards: int = 0
    accepted: int = 0
    run_ahead_tokens: int = 0
    spent: int = 0
    pool: deque = field(default_factory=deque)
    ahead: list[_Ahead] = field(default_factory=list)
    parked: list[_Episode] = field(default_factory=list)  # waiting for their tool's output


class Replay:
    """Replays the steps of a trace in order; the drafter's trees and the acceptance calibration carry
    over from step to step as in the real engine."""

    def __init__(
        self,
        trace: RolloutTrace,
        options: ReplayOptions | None = None,
        pool: RolloutTrace | None = None,
        costs: Callable[[TracedStep], TableCost] = recorded_costs,
    ):
        o = options or ReplayOptions()
        self.costs = costs  # a step's clock: its `choice` sizes drafts, its `seconds(rows)` prices a step
        e = {**ENGINE_DEFAULTS, **trace.engine}  # a backend records only what it has (vLLM: batch, context)
        self.trace = trace
        self.drafter_name = o.drafter or trace.drafter
        self.max_batch = o.max_batch or e["max_batch"]
        self.limits = trace.limits
        self.run_ahead = o.run_ahead or (RunAheadOptions(**trace.run_ahead) if trace.run_ahead else None)
        if self.run_ahead is not None and not drafter_capabilities(self.drafter_name).run_ahead:
            raise ValueError(f"run-ahead content needs a drafter that takes it (srt), not {self.drafter_name!r}")
        self.pool = pool or trace
        cache = {k: v for k, v in trace.cache.items() if v is not None}
        cache.update(
            {
                k: v
                for k, v in (("max_depth", o.max_depth), ("max_match", o.max_match), ("max_bytes", o.max_bytes))
                if v is not None
            }
        )
        self.drafter = make_drafter(
            self.drafter_name, **(cache if drafter_capabilities(self.drafter_name).trees else {})
        )
        self.drafting = Drafting(
            self.drafter,
            ForwardCostModel(),
            EngineStats(),
            ANY_TOKEN,
            e["max_draft_tokens"] if o.max_draft_tokens is None else o.max_draft_tokens,
            e["max_context"],
            e["adaptive_drafts"] if o.adaptive_drafts is None else o.adaptive_drafts,
            e["min_draft_gain"] if o.min_draft_gain is None else o.min_draft_gain,
            guarded=False,
        )
        self.episodes: dict[str, _Episode] = {}
        self._ids = 0

    def run(self) -> list[ReplayedStep]:
        return [
            self.step(s, self.pool.steps[i] if i < len(self.pool.steps) else None)
            for i, s in enumerate(self.trace.steps)
        ]

    def step(self, step: TracedStep, pool_step: TracedStep | None = None) -> ReplayedStep:
        clock = _Clock(Scheduler(self.max_batch), self.costs(step))
        self.drafting.cost_model = clock.cost.choice
        if self.run_ahead is not None and pool_step is not None:
            n = self.run_ahead.tokens_per_sequence
            clock.pool = deque(replace(r, tokens=r.tokens[:n]) for r in pool_step.run_ahead if r.tokens)
        for traj in step.trajectories:
            tokens = list(traj.prompt_ids)
            seq = Sequence(
                self._id("real"), traj.prompt_key, tokens, call_params(traj, tokens, self.limits), 0, len(tokens)
            )
            self.episodes[seq.request_id] = _Episode(seq, traj)
            seq.drafting = True
            self.drafter.start_request(seq.request_id, traj.prompt_key, seq.tokens)
            clock.scheduler.add(seq)
        sched = clock.scheduler
        while sched.waiting or sched.running or clock.parked:
            for ep in sorted((p for p in clock.parked if p.resume_at <= clock.time), key=lambda p: p.resume_at):
                clock.parked.remove(ep)
                self._resume(ep, sched)
            self._make_room(clock)
            seqs = sched.schedule()
            if seqs:
                self._batch_step(seqs, clock)
            elif clock.parked:
                self._idle_until(min(p.resume_at for p in clock.parked), clock)
        for a in list(clock.ahead):
            self._end_ahead(a, clock)
        self.drafter.end_step()
        return ReplayedStep(
            step.step,
            clock.accepted / clock.forwards if clock.forwards else 0.0,
            step.accepted_per_forward,
            clock.forwards,
            clock.accepted,
            clock.time,
            step.wall_s,
            clock.run_ahead_tokens,
            clock.busy,
        )

    # ----- the engine's schedule and draft choice on a simulated clock -----------------------------

    def _id(self, kind: str) -> str:
        self._ids += 1
        return f"{kind}-{self._ids}"

    def _make_room(self, clock: _Clock) -> None:
        """Run-ahead yields the slots that waiting real sequences need, as the engine's does."""
        sched = clock.scheduler
        need = len(sched.waiting) - len(sched.free_slots)
        while need > 0 and clock.ahead:
            self._end_ahead(clock.ahead[-1], clock)
            need -= 1

    def _resume(self, ep: _Episode, sched: Scheduler) -> None:
        """Feed a finished turn's observation and continue (held: in its slot; evicted: prefills again),
        or end the episode when no turn follows."""
        seq, obs = ep.seq, ep.traj.observations[ep.turn]
        seq.tokens += obs
        self.drafter.add_tokens(seq.request_id, obs)
        ep.turn, ep.pos = ep.turn + 1, 0
        if ep.turn >= len(ep.traj.turns):
            self._finish(ep, sched)
            return
        seq.begin_call(seq.tokens, call_params(ep.traj, seq.tokens, self.limits), 0)
        if sched.take_held(seq.request_id) is not None:
            sched.resume(seq)
        else:
            sched.add(seq)

    def _finish(self, ep: _Episode, sched: Scheduler) -> None:
        sched.take_held(ep.seq.request_id)
        sched.release(ep.seq)
        self.drafter.stop_request(ep.seq.request_id)
        del self.episodes[ep.seq.request_id]

    def _batch_step(self, seqs: list[Sequence], clock: _Clock) -> None:
        """The engine's drafts and choice for the batch; each draft accepted as far as the recorded tokens
        follow it; the step costs what the recorded cost table predicts for its shape."""
        makespan = not clock.scheduler.waiting
        drafts, _ = self.drafting.draft(seqs, makespan)
        drafts = self.drafting.choose(seqs, drafts, makespan)
        fed = sum(len(s.pending()) + len(d) for s, d in zip(seqs, drafts))
        added = self._run_ahead_rows("tail", fed, len(seqs), clock) if makespan else 0.0
        rows = [(len(s.pending()) + len(d), s.num_cached) for s, d in zip(seqs, drafts)]
        accepted_nodes = []
        for seq, draft in zip(seqs, drafts):
            ep = self.episodes[seq.request_id]
            truth, path = ep.truth, accepted_path(draft, ep.truth)
            accepted_nodes.append(path)
            kept = min(len(path) + 1, len(truth))
            clock.forwards += 1
            clock.accepted += min(len(path), kept)
            seq.tokens += truth[:kept]
            seq.num_cached = len(seq.tokens) - 1
            ep.pos += kept
            self.drafter.add_tokens(seq.request_id, truth[:kept])
        self.drafting.observe(drafts, accepted_nodes)
        step_s = clock.cost.seconds(rows) + added
        clock.time += step_s
        clock.busy += step_s
        for seq in seqs:
            ep = self.episodes[seq.request_id]
            if ep.pos < len(ep.traj.turns[ep.turn]):
                continue
            clock.scheduler.finish(seq)
            if ep.turn < len(ep.traj.observations):
                ep.resume_at = clock.time + ep.traj.waits_s[ep.turn]
                clock.parked.append(ep)
            else:
                self._finish(ep, clock.scheduler)

    # ----- run-ahead in the simulated bubbles -----------------------------------------------------

    def _idle_until(self, until: float, clock: _Clock) -> None:
        """Nothing real runs until `until`: run-ahead passes alone (the tools bubble), or just wait."""
        while clock.time < until:
            added = self._run_ahead_rows("tools", 0, 0, clock)
            if added <= 0:
                clock.time = until
                return
            clock.time += added
            clock.busy += added

    def _run_ahead_rows(self, bubble: str, tokens: int, seqs: int, clock: _Clock) -> float:
        """Advance run-ahead as the engine's row-cost rule allows; returns the seconds it adds."""
        o = self.run_ahead
        if o is None or bubble not in o.bubbles or clock.spent >= o.budget_tokens:
            return 0.0
        rows = RowCost(self.drafting.cost_model, bubble, o, tokens, seqs)
        for a in list(clock.ahead):
            k = rows.fit(a.prefill or 1)
            if k == 0:
                break
            self._advance(a, k, clock)
        sched, limit = clock.scheduler, o.max_sequences or self.max_batch
        live = {s.prompt_key for s in sched.running} | {ep.traj.prompt_key for ep in clock.parked}
        while clock.pool and len(clock.ahead) < limit and sched.free_slots:
            item = clock.pool[0]
            # A prompt with a live sequence starts from a copy of its KV; others prefill their context.
            seq = Sequence(self._id("ahead"), item.prompt_key, list(item.context), SamplingParams(), 0, 0)
            a = _Ahead(seq, item, 0 if item.prompt_key in live else len(item.context) - 1)
            k = rows.fit(a.prefill or 1)
            if k == 0:
                break
            clock.pool.popleft()
            seq.slot = sched.free_slots.pop()
            self.drafter.start_run_ahead(seq.request_id, item.prompt_key, item.context)
            clock.ahead.append(a)
            self._advance(a, k, clock)
        return rows.added()

    def _advance(self, a: _Ahead, rows: int, clock: _Clock) -> None:
        """Feed `rows` rows to a run-ahead sequence: prefill first; a row past it writes one token."""
        if a.prefill:
            a.prefill -= min(rows, a.prefill)
            return
        self.drafter.add_tokens(a.seq.request_id, [a.item.tokens[a.pos]])
        a.pos += 1
        clock.spent += 1
        clock.run_ahead_tokens += 1
        if a.pos >= len(a.item.tokens) or clock.spent >= self.run_ahead.budget_tokens:
            self._end_ahead(a, clock)

    def _end_ahead(self, a: _Ahead, clock: _Clock) -> None:
        clock.ahead.remove(a)
        clock.scheduler.release(a.seq)
        self.drafter.stop_request(a.seq.request_id)


def accepted_path(draft: Draft, truth: list[int]) -> list[int]:
    """The draft's nodes the recorded tokens follow from its root: what lossless verification accepts
    when the sampled tokens are `truth`."""
    children = {(p, t): i for i, (p, t) in enumerate(zip(draft.parents, draft.token_ids))}
    node, path = -1, []
    for token in truth:
        node = children.get((node, token))
        if node is None:
            break
        path.append(node)
    return path


def replay(
    trace: RolloutTrace,
    options: ReplayOptions | None = None,
    pool: RolloutTrace | None = None,
    costs: Callable[[TracedStep], TableCost] = recorded_costs,
) -> list[ReplayedStep]:
    """Replay every step of `trace` (run-ahead content from `pool`, default the trace itself) on the clock
    `costs` gives each step (default: the step's recorded cost table)."""
    return Replay(trace, options, pool, costs).run()
