"""Headroom: how many tokens per forward a linear draft could have gained, per method and step, beside
what the run achieved, from a finished run's rollouts (``OUT/rollouts/step-N.jsonl``, or a rollout trace: a
file, or a shipped one by name) without the model.

Speculation is lossless, so the sampled tokens are known; at each generated position a method's structure
(``srt``, ``suffix``, ``srt+prompt``, ``srt+global``) is asked what the best path it holds (**oracle**) and
its most frequent path (**frequent**) would have had accepted, so that oracle − frequent is what path
choice leaves and frequent − achieved what draft sizing leaves. Definitions and figures:
docs/benchmarks/headroom.md.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..console import Progress
from ..drafting import RolloutCache
from ..drafting.trees.keys import prompt_key
from ..rl.rollout_trace import RolloutTrace, TracedTrajectory
from .cache import accepted_tokens
from .chain_choice import Choice, chain_choice, frequent
from .shipped_traces import recorded

GLOBAL = "responses"


@dataclass
class Traced:
    """A recorded trajectory: its prompt key, prompt, response, response mask (1: sampled) and the run's
    forwards and generated tokens for it."""

    key: str
    prompt: list[int]
    response: list[int]
    mask: list[int]
    forwards: int
    generated: int

    @classmethod
    def of_trace(cls, t: TracedTrajectory) -> Traced:
        """A trace's trajectory as rollouts hold it: a forced opening, then model turns and observations."""
        cut = len(t.prompt_ids) - t.prefix_len
        response, mask = list(t.prompt_ids[cut:]), [0] * t.prefix_len
        for i, turn in enumerate(t.turns):
            response += turn
            mask += [1] * len(turn)
            if i < len(t.observations):
                response += t.observations[i]
                mask += [0] * len(t.observations[i])
        return cls(t.prompt_key, list(t.prompt_ids[:cut]), response, mask, t.forwards, sum(map(len, t.turns)))

    @classmethod
    def of(cls, row: dict) -> Traced:
        prompt = list(row["prompt_ids"])
        mask = list(row["response_mask"])
        return cls(
            row.get("prompt_key") or prompt_key(prompt),
            prompt,
            list(row["response_ids"]),
            mask,
            int(row.get("forwards") or 0),
            int(row.get("model_tokens") or sum(mask)),
        )


def read_steps(run_dir: Path) -> list[list[Traced]]:
    """The run's rollouts, one list of trajectories per step, in step order: a run folder's, or a rollout
    trace's (a file, or a shipped trace's name)."""
    run_dir = recorded(run_dir)
    if run_dir.is_file():
        return [[Traced.of_trace(t) for t in step.trajectories] for step in RolloutTrace.load(run_dir).steps]
    files = sorted((Path(run_dir) / "rollouts").glob("step-*.jsonl"))
    if not files:
        raise ValueError(f"{run_dir}: no rollouts/step-*.jsonl (a run folder of srt-agent train)")
    return [[Traced.of(json.loads(line)) for line in f.read_text().splitlines() if line.strip()] for f in files]


def turns(mask: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of sampled tokens (mask 1) in a response: a turn's generated tokens."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


class Structure:
    """A method's trees for one trajectory: (cache, key) pairs; the request runs in each under the key's name."""

    def __init__(self, pairs: list[tuple[RolloutCache, str]], max_match: int):
        self.pairs = pairs
        self.max_match = max_match

    def feed(self, tokens: Sequence[int]) -> None:
        """The request's next tokens (sampled or forced) into every tree it runs in."""
        if len(tokens):
            for cache, key in self.pairs:
                cache.add_tokens(key, list(tokens))

    def oracle(self, context: Sequence[int], future: Sequence[int]) -> int:
        """The longest prefix of `future` some tree holds after some suffix of `context`."""
        best = 0
        for cache, key in self.pairs:
            for anchor in range(1, min(self.max_match, len(context)) + 1):
                tail = list(context[-anchor:])
                if cache.count(key, tail) == 0:
                    break  # a longer anchor occurs no more often than this one
                m = 0
                while m < len(future) and cache.count(key, tail + list(future[: m + 1])) > 0:
                    m += 1
                best = max(best, m)
                if best == len(future):
                    return best
        return best

    def chosen(self, context: Sequence[int], future: Sequence[int], choice: Choice = frequent) -> int:
        """How many tokens of the chain `choice` takes (from the tree whose draft expects most; the most frequent
        path by default) match `future`."""
        if not future:
            return 0
        drafts = [d for d in (choice(cache, key, context, len(future)) for cache, key in self.pairs) if len(d)]
        if not drafts:
            return 0
        return accepted_tokens(max(drafts, key=lambda d: d.expected_accepted), list(future))


REQUEST = "headroom"


class History:
    """What a method's trees hold as a step begins (earlier steps' trajectories), copied for each trajectory.
    A method named ``…-lastN`` (``srt+global-last2``) holds only the last N steps' (recency: the latest
    policy versions' samples instead of counts over every version)."""

    def __init__(self, method: str, folder: Path, max_match: int = 32):
        base, _, last = method.partition("-last")
        if base not in HEADROOM_METHODS or (last and not (last.isdigit() and int(last) > 0)):
            raise ValueError(
                f"unknown method {method!r}; choose one of {', '.join(HEADROOM_METHODS)}, "
                "each with -lastN to hold only the last N steps' rollouts"
            )
        self.method, self.name, self.folder, self.max_match = base, method, folder, max_match
        self.last = int(last) if last else None
        self.steps: list[list[Traced]] = [[]]  # with `last`: the kept steps' trajectories, the current one last
        self.trees = RolloutCache(max_match=max_match)  # per prompt (srt…), the global response tree (suffix…)
        self.saved = False

    def add(self, traj: Traced) -> None:
        """A finished trajectory of the step, into the trees (as the live drafter stores it)."""
        if self.last is not None:
            self.steps[-1].append(traj)
        self._store(traj)

    def end_step(self) -> None:
        """The step is over; with `last`, the trees start again from the last N steps' trajectories."""
        if self.last is None:
            return
        self.steps = self.steps[-self.last :] + [[]]
        self.trees = RolloutCache(max_match=self.max_match)
        for traj in (t for step in self.steps for t in step):
            self._store(traj)

    def _store(self, traj: Traced) -> None:
        if self.method != "suffix":
            self._start(self.trees, traj)
            self.trees.add_tokens(traj.key, traj.response)
            self.trees.stop_request(traj.key)
        if self.method in GLOBAL_METHODS:
            self.trees.start_request(GLOBAL, GLOBAL, [])
            self.trees.add_tokens(GLOBAL, traj.response)
            self.trees.stop_request(GLOBAL)
        self.saved = False

    def _start(self, trees: RolloutCache, traj: Traced) -> None:
        """Start `traj` in its prompt's tree, led by the prompt's last tokens, or (srt+global, as the proposer's
        ``whole_prompt``) by the whole prompt when the prompt has no tree yet."""
        whole = self.method == "srt+global" and traj.key not in trees
        trees.start_request(traj.key, traj.key, [] if whole else traj.prompt)
        if whole:
            trees.add_tokens(traj.key, traj.prompt)

    def structure(self, traj: Traced) -> Structure:
        """The trees as the step began, `traj`'s request started in them (its prompt streamed)."""
        path = self.folder / f"{self.name}.bin"
        if not self.saved:
            self.trees.save(path)
            self.saved = True
        trees = RolloutCache.load(path)
        pairs = []
        if self.method != "suffix":
            self._start(trees, traj)
            pairs.append((trees, traj.key))
        if self.method in ("suffix", "srt+prompt"):
            own = RolloutCache(max_match=self.max_match)  # the request's whole prompt and own output
            own.start_request(REQUEST, REQUEST, [])
            own.add_tokens(REQUEST, traj.prompt)
            pairs.append((own, REQUEST))
        if self.method in GLOBAL_METHODS:
            trees.start_request(GLOBAL, GLOBAL, [])
            pairs.append((trees, GLOBAL))
        return Structure(pairs, self.max_match)


HEADROOM_METHODS = ("srt", "suffix", "srt+prompt", "srt+global")
GLOBAL_METHODS = ("suffix", "srt+global")  # those with a global tree of earlier responses


def simulate(history: History, traj: Traced, k: int, choices: Sequence[str] = ()) -> dict[str, int]:
    """Forwards for `traj`'s sampled tokens with the oracle, the frequent path and each of `choices` (each on its
    own copy of the trees, which learn every token as it is emitted or forced), and its generated tokens."""
    out = {"generated": sum(end - start for start, end in turns(traj.mask))}
    full, offset = traj.prompt + traj.response, len(traj.prompt)
    for which in ("oracle", "frequent", *choices):
        structure = history.structure(traj)
        ask = structure.oracle if which == "oracle" else partial(structure.chosen, choice=chain_choice(which))
        pos = forwards = 0
        for start, end in turns(traj.mask):
            structure.feed(full[offset + pos : offset + start])  # the observation before this turn
            pos = start
            while pos < end:
                at = offset + pos
                m = ask(full[:at], full[at : at + min(k, end - pos - 1)])
                structure.feed(full[at : at + m + 1])
                pos += m + 1
                forwards += 1
        out[which] = forwards
    return out


def headroom(
    run_dir: str | Path,
    k: int = 8,
    methods: Sequence[str] = HEADROOM_METHODS,
    choices: Sequence[str] = (),
    work: Progress | None = None,
) -> dict:
    """Per step and method: generated tokens, tokens per forward with the oracle, the frequent path and each of
    `choices` (`chain_choice`), and the run's achieved figure (its trajectories' own forwards); totals over first
    visits and revisits. `work` hears of each step as it is done."""
    choices = [c for c in dict.fromkeys(choices) if c != "frequent"]
    for name in choices:
        chain_choice(name)  # an unknown name fails before the run is read
    steps = read_steps(Path(run_dir))
    work = work or Progress.unseen()
    work.update(total=len(steps))
    seen: set[str] = set()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        histories = {m: History(m, Path(folder)) for m in methods}
        for index, trajectories in enumerate(steps, start=1):
            keys = {t.key for t in trajectories}
            row: dict = {"step": index, "revisit": bool(keys) and keys <= seen, "methods": {}}
            seen |= keys
            generated = sum(t.generated for t in trajectories)
            achieved = sum(t.forwards for t in trajectories)
            row["achieved"] = {"generated": generated, "forwards": achieved}
            row["achieved_tokens_per_forward"] = generated / achieved if achieved else None
            for method, history in histories.items():
                sums = dict.fromkeys(("generated", "oracle", "frequent", *choices), 0)
                for traj in trajectories:
                    for name, value in simulate(history, traj, k, choices).items():
                        sums[name] += value
                row["methods"][method] = {
                    **{f"{name}_tokens_per_forward": sums["generated"] / max(sums[name], 1) for name in sums},
                    **sums,
                }
                del row["methods"][method]["generated_tokens_per_forward"]
            for history in histories.values():
                for traj in trajectories:
                    history.add(traj)
                history.end_step()
            rows.append(row)
            oracle = ", ".join(f"{m} {row['methods'][m]['oracle_tokens_per_forward']:.2f}" for m in methods)
            work.done(f"step {index}: oracle tokens per forward {oracle}")
    return {"run": str(run_dir), "k": k, "choices": choices, "steps": rows, "totals": totals(rows, methods, choices)}


def totals(rows: list[dict], methods: Sequence[str], choices: Sequence[str] = ()) -> dict:
    """Tokens per forward over all steps, first visits and revisits (the achieved one and each method's)."""
    out = {}
    for label, chosen in (
        ("all", rows),
        ("first", [r for r in rows if not r["revisit"]]),
        ("revisits", [r for r in rows if r["revisit"]]),
    ):
        if not chosen:
            continue
        forwards = sum(r["achieved"]["forwards"] for r in chosen)
        figures: dict = {"achieved": sum(r["achieved"]["generated"] for r in chosen) / forwards if forwards else None}
        for method in methods:
            g = sum(r["methods"][method]["generated"] for r in chosen)
            figures[method] = {
                name: g / max(sum(r["methods"][method][name] for r in chosen), 1)
                for name in ("oracle", "frequent", *choices)
            }
        out[label] = figures
    return out


def headroom_table(result: dict):
    """Tokens per forward per step: achieved, then oracle / frequent path per method."""
    from rich.table import Table

    methods = list(result["steps"][0]["methods"]) if result["steps"] else []
    table = Table(title=f"headroom of {result['run']} (linear drafts of {result['k']} tokens; tokens per forward)")
    table.add_column("step", justify="right")
    table.add_column("visit")
    table.add_column("achieved", justify="right")
    names = ("oracle", "frequent", *result.get("choices", ()))
    for method in methods:
        for name in names:
            table.add_column(f"{method} {name}", justify="right")
    for row in result["steps"]:
        achieved = row["achieved_tokens_per_forward"]
        cells = [str(row["step"]), "revisit" if row["revisit"] else "first", f"{achieved:.2f}" if achieved else "-"]
        for method in methods:
            cells += [f"{row['methods'][method][f'{name}_tokens_per_forward']:.2f}" for name in names]
        table.add_row(*cells)
    return table
