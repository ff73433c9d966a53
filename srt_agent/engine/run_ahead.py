"""Run-ahead generation: capacity a rollout step leaves idle is spent on continuations of prompts that
come soon; their tokens enter the prompts' trees and nothing else.

The window of prompts, the per-step row plan and the row-cost rule (`RowCost`: how many rows a bubble
admits, reused by the replay benchmark) are one policy. Run-ahead sequences are not requests: nothing that
counts real work sees them, they sample with seeds of their own and give way to real requests. Bubbles,
what fills them and what it was measured to do: docs/run-ahead.md.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence as Seq
from dataclasses import dataclass, field, replace

from ..drafting.choice.cost_model import ForwardCostModel
from ..drafting.drafter import Drafter, capabilities
from ..runner.model_runner import Chunk, ModelRunner
from .options import RUN_AHEAD_BUBBLES as BUBBLES, RunAheadOptions
from .params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence, Status, common_prefix
from .stops import StopChecker

PHASES = ("rollout", "update")


@dataclass
class WindowPrompt:
    """A prompt run-ahead may continue: its tree key, its opening tokens and how it is sampled.

    `upcoming`: a prompt of a later step (look-ahead); otherwise one of the current step, served only
    while the engine holds a live request of it.
    """

    prompt_key: Hashable
    prompt_ids: list[int]
    params: SamplingParams
    upcoming: bool = True


@dataclass
class RunAheadStats:
    """What run-ahead did; ``tokens`` went into the trees and nowhere else."""

    windows: int = 0
    sequences: int = 0
    tokens: int = 0
    rows: int = 0  # token rows fed to forward passes (prefill included)
    prefill_tokens: int = 0
    copied_tokens: int = 0  # KV entries copied from a live sequence instead of prefilled
    preempted: int = 0  # sequences dropped because a real request needed the slot
    dropped: int = 0  # sequences dropped by a weight update or a closed window
    steps: int = 0  # forward passes that carried run-ahead rows
    alone_steps: int = 0  # of them, passes without real rows
    shared_rows: int = 0  # rows that rode along with real rows
    real_rows: int = 0  # rows real sequences fed while a window was open
    added_s: float = 0.0  # predicted seconds added to real steps + measured seconds of passes alone
    tokens_by_bubble: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUBBLES, 0))
    tokens_upcoming: int = 0  # tokens continuing look-ahead prompts (the rest: the current step's)
    starts_from_branch: int = 0

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["tokens_by_bubble"] = dict(self.tokens_by_bubble)
        return out


@dataclass
class RunAheadRunner:
    """One run-ahead sequence and what it was started for: the window prompt it continues and the bubble it
    last ran in. Our engine's run-ahead holds one per sequence in a slot, vLLM's one per run-ahead request
    (its `seq` follows the request's tokens for the stop rule)."""

    seq: Sequence
    prompt: WindowPrompt
    bubble: str = "tail"


class RunAheadWindow:
    """The window of prompts run-ahead serves and its token accounting, shared by our engine's run-ahead and
    vLLM's (``srt_agent.backends.vllm.run_ahead``); a subclass ends its running sequences in `close`."""

    phases = PHASES

    def __init__(self, options: RunAheadOptions | None, seed_name: str):
        self.options = options or RunAheadOptions()
        self.window: list[WindowPrompt] = []
        self.phase: str | None = None
        self.spent = 0  # tokens generated in the open window
        self.budget = self.options.budget_tokens
        self.per_prompt: dict[Hashable, int] = {}  # run-ahead tokens per prompt in the window
        self.stats = RunAheadStats()
        self.written: list[tuple[Hashable, list[int], list[int]]] = []  # (prompt key, context, tokens) of the window
        self._rng = random.Random(f"{seed_name}/{self.options.seed}")
        self._ids = 0

    def open(self, prompts: Seq[WindowPrompt], phase: str = "rollout", budget_tokens: int | None = None) -> None:
        """Serve `prompts` from now on (phase "rollout": during a step's rollouts; "update": while the
        trainer updates). `budget_tokens` overrides the options' budget for this window."""
        if phase not in self.phases:
            raise ValueError(f"unknown run-ahead phase {phase!r} here; choose one of {list(self.phases)}")
        self.close()
        self.window = list(prompts)
        self.phase = phase
        self.spent = 0
        self.budget = self.options.budget_tokens if budget_tokens is None else budget_tokens
        self.per_prompt = {p.prompt_key: 0 for p in self.window}
        self.written = []
        self.stats.windows += 1

    def close(self) -> None:
        raise NotImplementedError

    def _ranked(
        self, live_keys: set[Hashable], running: Iterable[WindowPrompt], prefill: Callable[[WindowPrompt], int]
    ) -> list[WindowPrompt]:
        """Window prompts that may get a new sequence now, fewest run-ahead tokens (done, `running` and to
        `prefill`) first; the current step's only while `live_keys` holds theirs."""
        counts = Counter(p.prompt_key for p in running)
        ranked = []
        for index, prompt in enumerate(self.window):
            key = prompt.prompt_key
            if not prompt.upcoming and key not in live_keys:
                continue
            load = self.per_prompt.get(key, 0) + counts[key] * self.options.tokens_per_sequence + prefill(prompt)
            ranked.append((load, index, prompt))
        ranked.sort(key=lambda r: r[:2])
        return [prompt for *_, prompt in ranked]

    def _count(self, prompt: WindowPrompt, bubble: str, n: int) -> None:
        """`n` more run-ahead tokens of `prompt`, generated in `bubble`."""
        self.spent += n
        self.per_prompt[prompt.prompt_key] = self.per_prompt.get(prompt.prompt_key, 0) + n
        st = self.stats
        st.tokens += n
        st.tokens_by_bubble[bubble] += n
        st.tokens_upcoming += n if prompt.upcoming else 0


class RunAhead(RunAheadWindow):
    """The engine's run-ahead: picks rows for each step, absorbs their tokens, yields to real work.

    It works with the engine's parts, which it is given: the `drafter` whose trees it fills, the
    `scheduler` whose free slots it borrows, the `runner` that holds the KV, the `cost_model` that prices
    its rows, the `stops` that end its sequences, and the engine's real `sequences` (by request id, read
    only: run-ahead sequences are never among them).
    """

    def __init__(
        self,
        options: RunAheadOptions | None,
        *,
        drafter: Drafter | None,
        scheduler: Scheduler,
        runner: ModelRunner,
        cost_model: ForwardCostModel,
        stops: StopChecker,
        sequences: Mapping[str, Sequence],
    ):
        if not capabilities(drafter).run_ahead:
            name = drafter.name if drafter is not None else "none"
            raise ValueError(f"run-ahead needs a drafter that keeps per-prompt trees (srt); {name!r} has none")
        super().__init__(options, "run-ahead")
        self.drafter, self.scheduler, self.runner, self.stops = drafter, scheduler, runner, stops
        self.cost_model = cost_model
        self.sequences = sequences
        self.active: list[RunAheadRunner] = []

    # ----- the window -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving the window; running run-ahead sequences end (their tokens stay in the trees)."""
        for runner in list(self.active):
            self._end(runner)
            self.stats.dropped += 1
        self.window, self.phase = [], None

    def drop_all(self) -> None:
        """End every run-ahead sequence (new weights: their KV is stale); the window stays open."""
        for runner in list(self.active):
            self._end(runner)
            self.stats.dropped += 1

    def abandon(self) -> None:
        """A pass carrying run-ahead rows raised: end them and leave their prompts out of this window
        (the real rows retry without them; a prompt that breaks the model is not risked again)."""
        failed = {r.prompt.prompt_key for r in self.active}
        self.drop_all()
        self.window = [p for p in self.window if p.prompt_key not in failed]

    # ----- scheduling -----------------------------------------------------------------------------

    def make_room(self) -> None:
        """Give up the slots that waiting real requests need (before the scheduler admits them)."""
        sched = self.scheduler
        need = len(sched.waiting) - len(sched.free_slots)
        while need > 0 and self.active:
            self._end(self.active[-1])
            self.stats.preempted += 1
            need -= 1

    def _bubble(self, real: list[Sequence]) -> str | None:
        sched = self.scheduler
        if self.phase is None or self.spent >= self.budget or sched.waiting:
            return None
        if real:
            return "tail" if "tail" in self.options.bubbles and self.phase == "rollout" else None
        if self.phase == "update":
            return "update" if "update" in self.options.bubbles else None
        parked = any(s.status is Status.HELD for s in self.sequences.values())
        return "tools" if parked and "tools" in self.options.bubbles else None

    def ready(self) -> bool:
        """Whether a step with no real work would run run-ahead rows (the engine loop should step)."""
        if self._bubble([]) is None:
            return False
        return bool(self.active) or (self._may_start() and bool(self._eligible()))

    def plan(self, real: list[Sequence], real_chunks: list[Chunk]) -> list[tuple[Sequence, Chunk]]:
        """The run-ahead rows that ride along this step (or run alone when `real` is empty)."""
        if self.phase is not None:
            self.stats.real_rows += sum(len(c) for c in real_chunks)
        bubble = self._bubble(real)
        if bubble is None:
            return []
        cost = RowCost(self.cost_model, bubble, self.options, sum(len(c) for c in real_chunks), len(real))
        planned: list[tuple[Sequence, Chunk]] = []
        for runner in list(self.active):
            k = cost.fit(len(runner.seq.tokens) - runner.seq.num_cached)
            if k == 0:
                break
            planned.append((runner.seq, self._chunk(runner.seq, k)))
            runner.bubble = bubble
        while self._may_start():
            eligible = self._eligible()
            if not eligible:
                break
            prompt = eligible[0]
            context = self._context(prompt)
            source, shared = self._kv_source(context)
            k = cost.fit(len(context) - shared)
            if k == 0:
                break
            runner = self._start(prompt, context, source, shared, bubble)
            planned.append((runner.seq, self._chunk(runner.seq, k)))
        if planned:
            st = self.stats
            st.steps += 1
            st.rows += cost.tokens
            if real:
                st.shared_rows += cost.tokens
                st.added_s += cost.added()
            else:
                st.alone_steps += 1
        return planned

    def absorb(
        self,
        planned: list[tuple[Sequence, Chunk]],
        emitted: list[list[tuple[int, float]]],
        alone_s: float = 0.0,
        broken: set[int] = frozenset(),
    ) -> None:
        """Take the tokens the planned rows produced (a row that only prefilled part of its context
        produced none); finished sequences end. `alone_s`: the measured time of a pass without real rows;
        `broken`: planned rows whose logits were not finite (their sequences end, tokens unkept)."""
        self.stats.added_s += alone_s
        runners = {id(r.seq): r for r in self.active}
        for i, ((seq, chunk), out) in enumerate(zip(planned, emitted)):
            runner = runners.get(id(seq))
            if runner is None:
                continue
            if i in broken:
                self.runner.clear_slot(seq.slot)  # NaN KV: attention masks do not hide it
                self._end(runner)
                self.stats.dropped += 1
                continue
            fed_to = chunk.start + len(chunk)
            self.stats.prefill_tokens += max(0, min(fed_to, seq.call_start) - chunk.start)
            seq.num_cached = fed_to
            if fed_to < len(seq.tokens) or not out:
                continue  # still prefilling: this row's sample is not a continuation
            if self.spent >= self.budget:
                self._end(runner)
                continue
            seq.tokens.append(out[0][0])
            self._store(runner, seq.tokens[-1:])
            if self.stops.check(seq) is not None or self.spent >= self.budget:
                self._end(runner)

    # ----- internals ------------------------------------------------------------------------------

    def _may_start(self) -> bool:
        limit = self.options.max_sequences or self.scheduler.num_slots
        return len(self.active) < limit and bool(self.scheduler.free_slots)

    def _live(self) -> list[Sequence]:
        """Sequences with KV in a slot: real ones (running or parked) and run-ahead ones."""
        real = [s for s in self.sequences.values() if s.slot is not None and s.status is not Status.WAITING]
        return real + [r.seq for r in self.active]

    def _eligible(self) -> list[WindowPrompt]:
        """Window prompts that may get a new sequence now (see `_ranked`; the prefill counts what no live
        sequence's KV covers)."""
        return self._ranked(
            {s.prompt_key for s in self.sequences.values()},
            (r.prompt for r in self.active),
            lambda p: len(p.prompt_ids) - self._kv_source(p.prompt_ids)[1],
        )

    def _context(self, prompt: WindowPrompt) -> list[int]:
        """Where a new sequence of `prompt` starts: the prompt, or a branch point of its rollouts."""
        if self.options.start == "prompt":
            return list(prompt.prompt_ids)
        rollouts = self._rollouts(prompt)
        points = branch_points(rollouts)
        if not points:
            return list(prompt.prompt_ids)
        which, depth = self._rng.choice(points)
        return list(prompt.prompt_ids) + rollouts[which][:depth]

    def _rollouts(self, prompt: WindowPrompt) -> list[list[int]]:
        """Responses of the prompt's real rollouts: live ones from the engine, finished ones from its tree."""
        n = len(prompt.prompt_ids)
        live = [
            s.tokens[n:]
            for s in self.sequences.values()
            if s.prompt_key == prompt.prompt_key and s.tokens[:n] == prompt.prompt_ids
        ]
        cache = self.drafter.cache
        lead = len(cache.prompt_tail(prompt.prompt_ids))
        stored = [s[lead:] for s in cache.sequences(prompt.prompt_key, run_ahead=False)]
        return live + [s for s in stored if s not in live]

    def _kv_source(self, context: list[int]) -> tuple[Sequence | None, int]:
        """The live sequence whose cached KV covers the longest prefix of `context`, and that length (at
        most all but the context's last token, which is fed to get the next position's logits)."""
        best, shared = None, 0
        for seq in self._live():
            n = common_prefix(seq.tokens, context, min(seq.num_cached, len(context) - 1))
            if n > shared:
                best, shared = seq, n
        return best, shared

    def _start(
        self, prompt: WindowPrompt, context: list[int], source: Sequence | None, shared: int, bubble: str
    ) -> RunAheadRunner:
        self._ids += 1
        params = replace(prompt.params, max_tokens=self.options.tokens_per_sequence, seed=None)
        seq = Sequence(
            f"run-ahead-{self._ids}",
            prompt.prompt_key,
            list(context),
            params,
            self._rng.getrandbits(63),
            call_start=len(context),
            status=Status.RUNNING,
        )
        seq.slot = self.scheduler.free_slots.pop()
        if source is not None and shared > 0:
            self.runner.copy_prefix(source.slot, seq.slot, shared)
            self.stats.copied_tokens += shared
        seq.num_cached = shared
        self.drafter.start_run_ahead(seq.request_id, prompt.prompt_key, context)
        runner = RunAheadRunner(seq, prompt, bubble)
        self.active.append(runner)
        self.stats.sequences += 1
        self.stats.starts_from_branch += len(context) > len(prompt.prompt_ids)
        return runner

    @staticmethod
    def _chunk(seq: Sequence, k: int) -> Chunk:
        tokens = seq.tokens[seq.num_cached : seq.num_cached + k]
        return Chunk(seq.slot, seq.num_cached, tokens, len(tokens))

    def _store(self, runner: RunAheadRunner, tokens: list[int]) -> None:
        self.drafter.add_tokens(runner.seq.request_id, tokens)
        self._count(runner.prompt, runner.bubble, len(tokens))

    def _end(self, runner: RunAheadRunner) -> None:
        seq = runner.seq
        if seq.num_generated:
            self.written.append((runner.prompt.prompt_key, seq.tokens[: seq.call_start], seq.output_ids))
        self.active.remove(runner)
        self.drafter.stop_request(runner.seq.request_id)
        self.scheduler.release(runner.seq)


class RowCost:
    """What the run-ahead rows of one step may cost, in the cost model's terms.

    With real rows (``tail``) the rows may add ``slack`` of the real step's predicted time, priced at
    the linear fit's marginal cost; alone (``tools``) the pass may cost ``1 + slack`` one-sequence
    decode steps, and always carries at least one row; in the ``update`` bubble only
    ``max_prefill_tokens`` bound a pass.
    """

    def __init__(
        self, model: ForwardCostModel, bubble: str, options: RunAheadOptions, real_tokens: int, real_seqs: int
    ):
        self.model, self.bubble, self.options = model, bubble, options
        self.real_tokens, self.real_seqs = real_tokens, real_seqs
        self.tokens = self.seqs = 0
        if bubble == "tail":
            self.allowance = options.slack * model.predict(real_tokens, real_seqs)
        elif bubble == "tools":
            self.allowance = (1.0 + options.slack) * model.predict(1, 1)
        else:
            self.allowance = float("inf")

    def added(self, tokens: int | None = None, seqs: int | None = None) -> float:
        """Predicted seconds of `tokens` run-ahead tokens over `seqs` sequences (default: those taken)."""
        m = self.model
        tokens = self.tokens if tokens is None else tokens
        seqs = self.seqs if seqs is None else seqs
        if seqs == 0:
            return 0.0
        if self.real_seqs:
            return m.per_token_s * tokens + m.per_sequence_s * seqs
        return m.fixed_s + m.per_token_s * tokens + m.per_sequence_s * (seqs - 1)

    def fit(self, n: int) -> int:
        """Take up to `n` tokens of one more sequence: how many fit (0: none, and no more rows this step)."""
        if self.bubble == "update":
            k = min(n, self.options.max_prefill_tokens - self.tokens)
        else:
            room = self.allowance - self.added(self.tokens, self.seqs + 1)
            k = min(n, int(room // self.model.per_token_s)) if room >= 0 else 0
            if not self.real_seqs and self.seqs == 0:
                k = max(k, min(n, 1))
        k = max(k, 0)
        if k:
            self.tokens += k
            self.seqs += 1
        return k


def branch_points(rollouts: Seq[Seq[int]]) -> list[tuple[int, int]]:
    """Where two rollouts of a prompt disagreed: (rollout index, depth) for each distinct point at which
    a rollout and another one that shares all its tokens before it continue differently."""
    points: dict[tuple[int, ...], tuple[int, int]] = {}
    for i, a in enumerate(rollouts):
        for b in rollouts[i + 1 :]:
            d = common_prefix(a, b)
            if d < len(a) and d < len(b):
                points.setdefault(tuple(a[:d]), (i, d))
    return sorted(points.values())
