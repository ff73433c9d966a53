"""Trace replay: a recorded run's rollouts rerun through the rollout cache and the engine's draft choice,
without the model, to sweep draft budgets, tree limits and run-ahead settings in seconds.

Speculation is lossless, so every sampled token is known in advance: the trace's. What drafting
changes is how many of them each verification step accepts, and that is decided by the draft (the
drafter's tree at that moment), the cost model's choice of nodes and the true next tokens. The replay
runs the real drafter, `choose_drafts` and `AcceptanceModel` on a simulated clock: every episode
starts when the step does, a batch step costs what the recorded cost table predicts for its shape, a
finished turn waits its recorded tool time before its observation is fed, slots are shared as the
scheduler shares them. Run-ahead content comes from the recorded continuations (real samples of the
policy, never the tokens they are judged on), fed into the bubbles the simulated clock finds, sized by
the same row-cost rule as the engine's.

(Just over 400 lines: the replayed scheduler, drafting and sweep share one simulated clock.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from ..cache import make_drafter
from ..cache.draft import Draft
from ..engine.acceptance import AcceptanceModel
from ..engine.cost_model import choose_drafts
from ..engine.run_ahead import RowCost, RunAheadOptions
from .rollout_trace import RolloutTrace, TracedRunAhead, TracedStep, TracedTrajectory, cost_model_of

TREE_DRAFTERS = ("srt", "history")


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

    @property
    def error(self) -> float:
        """Relative error of the replay's accepted tokens per verification step."""
        real = self.recorded_accepted_per_forward
        return abs(self.accepted_per_forward - real) / real if real > 0 else float(self.accepted_per_forward > 0)


@dataclass
class _Episode:
    rid: str
    traj: TracedTrajectory
    tokens: list[int]
    turn: int = 0
    pos: int = 0  # tokens of the current turn already produced
    cached: int = 0
    has_slot: bool = False
    resume_at: float = 0.0
    call_max: int = 0
    call_generated: int = 0

    @property
    def truth(self) -> list[int]:
        return self.traj.turns[self.turn][self.pos :]

    @property
    def response_len(self) -> int:
        return len(self.tokens) - (len(self.traj.prompt_ids) - self.traj.prefix_len)


@dataclass
class _Ahead:
    rid: str
    item: TracedRunAhead
    prefill: int
    pos: int = 0


@dataclass
class _Clock:
    time: float = 0.0
    forwards: int = 0
    accepted: int = 0
    run_ahead_tokens: int = 0
    spent: int = 0
    pool: deque = field(default_factory=deque)
    ahead: list[_Ahead] = field(default_factory=list)


class Replay:
    """Replays the steps of a trace in order; the drafter's trees and the acceptance calibration carry
    over from step to step as in the real engine."""

    def __init__(self, trace: RolloutTrace, options: ReplayOptions | None = None, pool: RolloutTrace | None = None):
        o = options or ReplayOptions()
        e = trace.engine
        self.trace = trace
        self.drafter_name = o.drafter or trace.drafter
        self.max_batch = o.max_batch or e["max_batch"]
        self.max_context = e["max_context"]
        self.max_draft_tokens = e["max_draft_tokens"] if o.max_draft_tokens is None else o.max_draft_tokens
        self.min_gain = e["min_draft_gain"] if o.min_draft_gain is None else o.min_draft_gain
        self.adaptive = e["adaptive_drafts"] if o.adaptive_drafts is None else o.adaptive_drafts
        self.limits = trace.limits
        self.run_ahead = o.run_ahead or (RunAheadOptions(**trace.run_ahead) if trace.run_ahead else None)
        if self.run_ahead is not None and self.drafter_name != "srt":
            raise ValueError(f"run-ahead content needs the srt drafter, not {self.drafter_name!r}")
        self.pool = pool or trace
        cache = {k: v for k, v in trace.cache.items() if v is not None}
        cache.update(
            {
                k: v
                for k, v in (("max_depth", o.max_depth), ("max_match", o.max_match), ("max_bytes", o.max_bytes))
                if v is not None
            }
        )
        self.drafter = make_drafter(self.drafter_name, **(cache if self.drafter_name in TREE_DRAFTERS else {}))
        self.acceptance = AcceptanceModel()
        self._ids = 0

    def run(self) -> list[ReplayedStep]:
        return [
            self.step(s, self.pool.steps[i] if i < len(self.pool.steps) else None)
            for i, s in enumerate(self.trace.steps)
        ]

    def step(self, step: TracedStep, pool_step: TracedStep | None = None) -> ReplayedStep:
        cost = cost_model_of(step.cost)
        clock = _Clock()
        if self.run_ahead is not None and pool_step is not None:
            n = self.run_ahead.tokens_per_sequence
            clock.pool = deque(replace(r, tokens=r.tokens[:n]) for r in pool_step.run_ahead if r.tokens)
        waiting: deque[_Episode] = deque()
        for traj in step.trajectories:
            ep = _Episode(self._id("real"), traj, list(traj.prompt_ids))
            self._begin_call(ep)
            self.drafter.start_request(ep.rid, traj.prompt_key, ep.tokens)
            waiting.append(ep)
        running: list[_Episode] = []
        parked: list[_Episode] = []
        while waiting or running or parked:
            for ep in sorted((p for p in parked if p.resume_at <= clock.time), key=lambda p: p.resume_at):
                parked.remove(ep)
                if self._resume(ep):
                    (running if ep.has_slot else waiting).append(ep)
            self._admit(waiting, running, parked, clock)
            if not running:
                if parked:
                    self._idle_until(min(p.resume_at for p in parked), running, parked, clock, cost)
                continue
            self._batch_step(running, waiting, parked, clock, cost)
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
        )

    # ----- the simulated engine -------------------------------------------------------------------

    def _id(self, kind: str) -> str:
        self._ids += 1
        return f"{kind}-{self._ids}"

    def _begin_call(self, ep: _Episode) -> None:
        ep.call_max = max(
            1, min(self.limits["max_tokens_per_turn"], self.limits["max_response_tokens"] - ep.response_len)
        )
        ep.call_generated = 0

    def _slots_used(self, running: list[_Episode], parked: list[_Episode], clock: _Clock) -> int:
        return len(running) + sum(p.has_slot for p in parked) + len(clock.ahead)

    def _admit(self, waiting: deque, running: list, parked: list, clock: _Clock) -> None:
        while waiting:
            if self._slots_used(running, parked, clock) >= self.max_batch:
                if clock.ahead:  # run-ahead yields first
                    self._end_ahead(clock.ahead[-1], clock)
                    continue
                held = [p for p in parked if p.has_slot]
                if not held:
                    return
                held[0].has_slot, held[0].cached = False, 0  # evicted: prefills again
                continue
            ep = waiting.popleft()
            ep.has_slot, ep.cached = True, 0
            running.append(ep)

    def _resume(self, ep: _Episode) -> bool:
        """Feed a finished turn's observation; False when the episode ends instead."""
        obs = ep.traj.observations[ep.turn]
        ep.tokens += obs
        self.drafter.add_tokens(ep.rid, obs)
        ep.turn, ep.pos = ep.turn + 1, 0
        if ep.turn >= len(ep.traj.turns):
            self._finish(ep)
            return False
        self._begin_call(ep)
        return True

    def _finish(self, ep: _Episode) -> None:
        self.drafter.stop_request(ep.rid)
        ep.has_slot = False

    def _batch_step(self, running: list, waiting: deque, parked: list, clock: _Clock, cost) -> None:
        drafts = [self._draft(ep) for ep in running]
        base = sum(len(ep.tokens) - ep.cached for ep in running)
        if self.adaptive and any(len(d) for d in drafts):
            drafts = choose_drafts(drafts, base, cost, self.min_gain, not waiting, self.acceptance.calibrate)
        fed = base + sum(len(d) for d in drafts)
        added = self._run_ahead_rows("tail", fed, len(running), running, parked, clock, cost) if not waiting else 0.0
        accepted_nodes = []
        for ep, draft in zip(running, drafts):
            children = {(p, t): i for i, (p, t) in enumerate(zip(draft.parents, draft.token_ids))}
            truth, node, path = ep.truth, -1, []
            for token in truth:
                child = children.get((node, token))
                if child is None:
                    break
                path.append(child)
                node = child
            accepted_nodes.append(path)
            kept = min(len(path) + 1, len(truth))
            clock.forwards += 1
            clock.accepted += min(len(path), kept)
            new = truth[:kept]
            ep.tokens += new
            ep.pos += kept
            ep.call_generated += kept
            ep.cached = len(ep.tokens) - 1
            self.drafter.add_tokens(ep.rid, new)
        self.acceptance.observe(drafts, accepted_nodes)
        clock.time += cost.predict(fed, len(running)) + added
        for ep in list(running):
            if ep.pos < len(ep.traj.turns[ep.turn]):
                continue
            running.remove(ep)
            if ep.turn < len(ep.traj.observations):
                ep.resume_at = clock.time + ep.traj.waits_s[ep.turn]
                parked.append(ep)
            else:
                self._finish(ep)

    def _draft(self, ep: _Episode) -> Draft:
        budget = min(self.max_draft_tokens, ep.call_max - ep.call_generated - 1, self.max_context - len(ep.tokens) - 1)
        if budget <= 0 or self.drafter_name == "none":
            return Draft()
        draft = self.drafter.draft(ep.rid, ep.tokens, budget).truncated(budget)
        if not draft.scores:
            draft.scores = [1.0] * len(draft)
        return draft

    # ----- run-ahead in the simulated bubbles -----------------------------------------------------

    def _idle_until(self, until: float, running: list, parked: list, clock: _Clock, cost) -> None:
        """Nothing real runs until `until`: run-ahead passes alone (the tools bubble), or just wait."""
        while clock.time < until:
            added = self._run_ahead_rows("tools", 0, 0, running, parked, clock, cost)
            if added <= 0:
                clock.time = until
                return
            clock.time += added

    def _run_ahead_rows(
        self, bubble: str, tokens: int, seqs: int, running: list, parked: list, clock: _Clock, cost
    ) -> float:
        """Advance run-ahead as the engine's row-cost rule allows; returns the seconds it adds."""
        o = self.run_ahead
        if o is None or bubble not in o.bubbles or clock.spent >= o.budget_tokens:
            return 0.0
        rows = RowCost(cost, bubble, o, tokens, seqs)
        for a in list(clock.ahead):
            k = rows.fit(a.prefill or 1)
            if k == 0:
                break
            self._advance(a, k, clock)
        limit = o.max_sequences or self.max_batch
        live = {ep.traj.prompt_key for ep in running + parked}
        while clock.pool and len(clock.ahead) < limit and self._slots_used(running, parked, clock) < self.max_batch:
            item = clock.pool[0]
            # A prompt with a live sequence starts from a copy of its KV; others prefill their context.
            a = _Ahead(self._id("ahead"), item, 0 if item.prompt_key in live else len(item.context) - 1)
            k = rows.fit(a.prefill or 1)
            if k == 0:
                break
            clock.pool.popleft()
            self.drafter.start_run_ahead(a.rid, item.prompt_key, item.context)
            clock.ahead.append(a)
            self._advance(a, k, clock)
        return rows.added()

    def _advance(self, a: _Ahead, rows: int, clock: _Clock) -> None:
        """Feed `rows` rows to a run-ahead sequence: prefill first; a row past it writes one token."""
        if a.prefill:
            a.prefill -= min(rows, a.prefill)
            return
        self.drafter.add_tokens(a.rid, [a.item.tokens[a.pos]])
        a.pos += 1
        clock.spent += 1
        clock.run_ahead_tokens += 1
        if a.pos >= len(a.item.tokens) or clock.spent >= self.run_ahead.budget_tokens:
            self._end_ahead(a, clock)

    def _end_ahead(self, a: _Ahead, clock: _Clock) -> None:
        clock.ahead.remove(a)
        self.drafter.stop_request(a.rid)


def replay(
    trace: RolloutTrace, options: ReplayOptions | None = None, pool: RolloutTrace | None = None
) -> list[ReplayedStep]:
    """Replay every step of `trace` (run-ahead content from `pool`, default the trace itself)."""
    return Replay(trace, options, pool).run()


def replay_sweep(trace: RolloutTrace, pool: RolloutTrace | None = None, **values: list) -> dict:
    """Replay `trace` once per combination of the given option values (empty lists keep the trace's
    setting): drafter, max_draft_tokens, max_depth, max_bytes, and with run-ahead content (the trace's
    own or `pool`'s) slack and tokens_per_sequence."""
    import itertools
    import time

    names = [k for k, v in values.items() if v]
    rows = []
    for combo in itertools.product(*(values[k] for k in names)) if names else [()]:
        setting = dict(zip(names, combo))
        ahead = {k: setting.pop(k) for k in ("slack", "tokens_per_sequence") if k in setting}
        options = ReplayOptions(**setting)
        if ahead:
            recorded = trace.run_ahead or (pool.run_ahead if pool is not None else None) or {}
            options.run_ahead = replace(RunAheadOptions(**recorded), **ahead)
        start = time.perf_counter()
        steps = replay(trace, options, pool)
        forwards = sum(s.forwards for s in steps)
        rows.append(
            dict(
                setting={**setting, **ahead},
                accepted_per_forward=sum(s.accepted for s in steps) / forwards if forwards else 0.0,
                simulated_s=sum(s.simulated_s for s in steps),
                run_ahead_tokens=sum(s.run_ahead_tokens for s in steps),
                steps=[
                    dict(
                        step=s.step,
                        accepted_per_forward=s.accepted_per_forward,
                        measured=s.recorded_accepted_per_forward,
                    )
                    for s in steps
                ],
                wall_s=time.perf_counter() - start,
            )
        )
    forwards = sum(t.forwards for s in trace.steps for t in s.trajectories)
    measured = sum(t.draft_accepted for s in trace.steps for t in s.trajectories) / forwards if forwards else 0.0
    return {"trace": trace.variant, "measured_accepted_per_forward": measured, "rows": rows}


def sweep_table(result: dict):
    """The sweep as a rich table."""
    from rich.table import Table

    table = Table(
        "setting",
        "accepted / step",
        "simulated s",
        "run-ahead tokens",
        "replay s",
        title=f"{result['trace']}: measured {result['measured_accepted_per_forward']:.3f} accepted tokens per step",
    )
    for row in result["rows"]:
        setting = ", ".join(f"{k}={v}" for k, v in row["setting"].items()) or "as recorded"
        table.add_row(
            setting,
            f"{row['accepted_per_forward']:.3f}",
            f"{row['simulated_s']:.1f}",
            str(row["run_ahead_tokens"]),
            f"{row['wall_s']:.2f}",
        )
    return table
