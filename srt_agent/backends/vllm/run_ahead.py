"""Run-ahead inside vLLM: capacity a rollout step leaves idle runs extra requests for prompts that come
soon; SRT's proposer stores their tokens in the prompts' trees, and nothing else sees them.

The same window, bubbles and options as our engine's run-ahead (``srt_agent.engine.run_ahead``), on the
lever vLLM offers: whole requests, not rows of a forward pass. Before each vLLM step
(:meth:`VLLMRunAhead.before_step`, on the engine thread):

* **Real requests first.** Run-ahead requests give up their slots whenever real turns and run-ahead
  together would exceed the batch cap (``max_num_seqs``), so vLLM never queues a real turn behind one, and
  a new weight version (or the window's close) aborts them all.
* **Bubbles.** ``tail``: real turns run but fewer than the cap; run-ahead requests ride along while the
  proposer's learned step cost predicts the step grows by at most ``slack`` of its cost. ``tools``: no
  real turn runs and a trajectory waits on its environment; run-ahead steps may cost ``1 + slack``
  one-sequence steps plus at most ``max_prefill_tokens`` of prefill (a returning turn waits one such
  step at most). The ``update`` bubble runs in our engine only (vLLM's engine is idle while the trainer
  holds the CPUs).
* **What fills them.** The window's prompt with the fewest run-ahead tokens so far goes next; the current
  step's prompts only while one of their turns is live (their KV blocks are then in vLLM's prefix cache:
  only the last partial block is prefilled), upcoming ones whenever their whole prefill fits.

Run-ahead requests are of kind ``run_ahead`` (:class:`~srt_agent.drafting.RequestKind`), with seeds of their own and ``tokens_per_sequence`` as
their length; the proposer stores their tokens (as run-ahead sequences, evicted first) and never drafts
for them. Their outputs stop here: no caller, trajectory, log-prob or training batch sees them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence as Seq
from dataclasses import replace
from typing import Any, Protocol

from ...drafting.choice.cost_model import ForwardCostModel
from ...engine.options import RunAheadOptions
from ...engine.params import SamplingParams
from ...engine.run_ahead import RunAheadRunner, RunAheadWindow, WindowPrompt
from ...engine.sequence import Sequence
from ...engine.stops import StopChecker
from .speculative import run_ahead_problem


class RunAheadHost(Protocol):
    """What run-ahead needs of the engine it runs in (:class:`~.engine.VLLMEngine`)."""

    max_batch: int
    calls: Mapping[str, Sequence]  # the real turns running, by request id
    held: Mapping[str, list[int]]  # finished turns of trajectories that are not over
    stops: StopChecker

    def add_run_ahead(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None: ...

    def abort_run_ahead(self, request_id: str) -> None: ...


def check_run_ahead(options: RunAheadOptions, drafter: str) -> None:
    """ValueError (one line) for run-ahead this backend cannot run."""
    problem = run_ahead_problem(drafter)
    if problem:
        raise ValueError(problem)
    if "update" in options.bubbles:
        raise ValueError("run-ahead's update bubble runs in our engine only; leave it out for the vLLM backend")
    if options.start != "prompt":
        raise ValueError(f"the vLLM backend runs ahead from the prompt only, not from {options.start!r}")


class VLLMRunAhead(RunAheadWindow):
    """A vLLM engine's run-ahead (see the module): opened on a window of prompts, stepped by the engine."""

    phases = ("rollout",)

    def __init__(self, options: RunAheadOptions, engine: RunAheadHost, block_size: int, proposer: Any = None):
        super().__init__(options, "vllm-run-ahead")
        self.engine = engine
        self.block_size = max(1, block_size)  # vLLM's KV block: its prefix cache shares whole blocks
        self.proposer = proposer  # SRT's proposer in this process: its learned step cost prices the rows
        self.active: dict[str, RunAheadRunner] = {}  # vLLM request id -> runner

    def close(self) -> None:
        """Stop serving the window; running run-ahead requests end (their tokens stay in the trees)."""
        self.drop_all()
        self.window, self.phase = [], None

    def drop_all(self) -> None:
        """Abort every run-ahead request (new weights, or the window closes)."""
        for rid in list(self.active):
            self._end(rid, abort=True)
            self.stats.dropped += 1

    # ----- scheduling (engine thread) -------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the engine should step with no real turn running (the tools bubble has work)."""
        return self._bubble(0) == "tools" and (bool(self.active) or bool(self._eligible()))

    def before_step(self) -> None:
        """Make room for real turns, then start what the step's bubble affords."""
        real = len(self.engine.calls)
        if self.phase is not None:
            self.stats.real_rows += real
        bubble = self._bubble(real)
        cost = self._cost() if bubble is not None else None
        allowed = 0 if cost is None else self._rows_allowed(cost, real)
        while len(self.active) > allowed:  # real turns came (or the bubble closed): they go first
            self._end(next(reversed(self.active)), abort=True)
            if real:
                self.stats.preempted += 1
            else:
                self.stats.dropped += 1
        if cost is None:
            return
        limit = (1 + self.options.slack) * cost.predict(real, real) if real else 0.0
        extra = 0  # prefill tokens this step beyond one row per started request
        while len(self.active) < allowed and self.spent < self.budget:
            eligible = self._eligible()
            if not eligible:
                break
            prefill = self._prefill(eligible[0])
            rows = real + len(self.active) + 1
            if real and cost.predict(rows + extra + prefill - 1, rows) > limit:
                break
            if not real and extra and extra + prefill > self.options.max_prefill_tokens:
                break
            self._start(eligible[0], bubble, prefill)
            extra += prefill - 1
        if self.active:
            rows = real + len(self.active)
            st = self.stats
            st.steps += 1
            st.rows += len(self.active) + extra
            if real:
                st.shared_rows += len(self.active)
                st.added_s += cost.predict(rows + extra, rows) - cost.predict(real, real)
            else:
                st.alone_steps += 1
                st.added_s += cost.predict(rows + extra, rows)

    def _rows_allowed(self, cost: Any, real: int) -> int:
        """Run-ahead requests this step may carry: beside `real` turns while the step grows by at most
        ``slack`` of its cost, alone as many as cost ``1 + slack`` one-sequence steps (at least one)."""
        cap = self.engine.max_batch - real
        if self.options.max_sequences:
            cap = min(cap, self.options.max_sequences)
        limit = (1 + self.options.slack) * cost.predict(max(real, 1), max(real, 1))
        rows = 0 if real else 1
        while rows < cap and cost.predict(real + rows + 1, real + rows + 1) <= limit:
            rows += 1
        return min(rows, cap)

    def absorb(self, request_id: str, token_ids: Seq[int], finished: bool) -> None:
        """A step's delta of one run-ahead request (its tokens are in the trees already: the proposer
        stored them from vLLM's token table)."""
        runner = self.active.get(request_id)
        if runner is None:
            return
        seq, stopped, n = runner.seq, False, 0
        for token in token_ids:
            if stopped or self.spent + n >= self.budget:
                break
            seq.tokens.append(token)
            n += 1
            stopped = self.engine.stops.check(seq) is not None
        self._count(runner.prompt, runner.bubble, n)
        if finished or stopped or self.spent >= self.budget or seq.num_generated >= self.options.tokens_per_sequence:
            self._end(request_id, abort=not finished)

    # ----- internals ------------------------------------------------------------------------------

    def _bubble(self, real: int) -> str | None:
        if self.phase is None or self.spent >= self.budget:
            return None
        if real:
            return "tail" if "tail" in self.options.bubbles and real < self.engine.max_batch else None
        parked = bool(self.engine.held)  # finished turns of trajectories that are not over: tools run
        return "tools" if parked and "tools" in self.options.bubbles else None

    def _cost(self) -> Any:
        """The proposer's learned step cost (vLLM's own steps), else its prior."""
        cost = getattr(self.proposer, "cost", None)
        return cost if cost is not None else ForwardCostModel()

    def _live_keys(self) -> set[Hashable]:
        return {seq.prompt_key for seq in self.engine.calls.values()}

    def _eligible(self) -> list[WindowPrompt]:
        """Window prompts that may get a new request now (see `_ranked`)."""
        return self._ranked(self._live_keys(), (r.prompt for r in self.active.values()), lambda p: 0)

    def _prefill(self, prompt: WindowPrompt) -> int:
        """Tokens vLLM would prefill for `prompt`: the last partial block when a live turn shares it (the
        prefix cache holds whole blocks), else the whole prompt."""
        n = len(prompt.prompt_ids)
        shared = prompt.prompt_key in self._live_keys() or any(
            r.prompt.prompt_key == prompt.prompt_key for r in self.active.values()
        )
        return (n % self.block_size or self.block_size) if shared else n

    def _start(self, prompt: WindowPrompt, bubble: str, prefill: int) -> None:
        self._ids += 1
        rid = f"run-ahead/{self._ids}"  # the kind travels with the request
        params = replace(prompt.params, max_tokens=self.options.tokens_per_sequence, seed=self._rng.getrandbits(31))
        self.engine.add_run_ahead(rid, prompt.prompt_ids, params)
        seq = Sequence(
            rid, prompt.prompt_key, list(prompt.prompt_ids), params, params.seed, call_start=len(prompt.prompt_ids)
        )
        self.active[rid] = RunAheadRunner(seq, prompt, bubble)
        self.stats.sequences += 1
        self.stats.prefill_tokens += prefill

    def _end(self, request_id: str, abort: bool) -> None:
        runner = self.active.pop(request_id)
        if abort:
            self.engine.abort_run_ahead(request_id)
        if runner.seq.num_generated:
            self.written.append((runner.prompt.prompt_key, list(runner.prompt.prompt_ids), runner.seq.output_ids))
