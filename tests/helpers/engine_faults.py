"""Requests and injected faults for the engine's fault tests: GRPO-like request mixes, a fault-free
reference run, a drafter that raises on schedule and a model or sampler that fails on a poison token."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import srt_agent.engine.verification as verification_module
from helpers.fault_injection import InjectedFault
from srt_agent.engine import Engine, EngineOptions, RequestOutput, SamplingParams

PROMPTS = ([1, 2, 3, 4], [10, 11, 12, 13, 14, 15, 16, 17], [30, 30, 30, 31, 32], list(range(40, 60)))


@dataclass(frozen=True)
class Req:
    rid: str
    prompt: tuple[int, ...]
    max_tokens: int
    seed: int
    greedy: bool

    def params(self) -> SamplingParams:
        if self.greedy:
            return SamplingParams(temperature=0.0, max_tokens=self.max_tokens, seed=self.seed)
        return SamplingParams(temperature=1.0, top_p=0.9, max_tokens=self.max_tokens, seed=self.seed)


def drive(engine: Engine, reqs, suffix: str = "", on_output=None) -> dict[str, RequestOutput]:
    """Submit `reqs` (ids + `suffix`), step until all are done, release them; `on_output(out)` may submit more."""
    for r in reqs:
        engine.add_request(list(r.prompt), r.params(), r.rid + suffix)
    outs: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] = out
            if on_output is not None:
                on_output(out)
    for rid in outs:
        engine.release(rid)
    return outs


_references: dict[tuple, dict[str, RequestOutput]] = {}


def reference(model, reqs) -> dict[str, RequestOutput]:
    """Fault-free plain decoding of `reqs`, alone."""
    key = (id(model), reqs)
    if key not in _references:
        _references[key] = drive(
            Engine(model, EngineOptions(drafter=None, max_batch=4, max_context=128, calibrate=False)), reqs
        )
    return _references[key]


class FaultyDrafter:
    """Wraps a drafter; raises InjectedFault at the scheduled (request, method, n-th call).

    start, add and draft faults raise before the inner drafter sees the call; a stop fault after it (a
    drafter that refused to forget a request would leak, and no engine could help that).
    """

    def __init__(self, inner, faults: dict[str, tuple[str, int]], end_step_fault: bool = False):
        self.inner, self.name, self.faults, self.end_step_fault = inner, inner.name, faults, end_step_fault
        self.calls: Counter = Counter()
        self.fired: list[tuple[str | None, str]] = []

    @property
    def cache(self):
        return self.inner.cache

    def _maybe_fail(self, method: str, request_id: str | None) -> None:
        self.calls[request_id, method] += 1
        due = (
            self.end_step_fault
            if method == "end_step"
            else self.faults.get(request_id) == (method, self.calls[request_id, method])
        )
        if due:
            self.fired.append((request_id, method))
            raise InjectedFault(f"{method} fault for {request_id}")

    def start_request(self, request_id, prompt_key, prompt_ids):
        self._maybe_fail("start_request", request_id)
        self.inner.start_request(request_id, prompt_key, prompt_ids)

    def add_tokens(self, request_id, token_ids):
        self._maybe_fail("add_tokens", request_id)
        self.inner.add_tokens(request_id, token_ids)

    def draft(self, request_id, context, budget):
        self._maybe_fail("draft", request_id)
        return self.inner.draft(request_id, context, budget)

    def stop_request(self, request_id):
        self.inner.stop_request(request_id)
        self._maybe_fail("stop_request", request_id)

    def end_step(self):
        self.inner.end_step()
        self._maybe_fail("end_step", None)


class ModelFault:
    """Injects a fault into whatever pass carries the `poison` token (or samples for `seed` past `position`)."""

    def __init__(self, kind: str, model, poison: int, seed: int, position: int):
        self.kind, self.poison, self.seed, self.position = kind, poison, seed, position
        self.embeddings = model.model.get_input_embeddings()
        self.real_sample_rows = verification_module.draw
        self.fired = 0

    def __enter__(self):
        if self.kind == "forward raises":
            self.handle = self.embeddings.register_forward_pre_hook(self._raise)
        elif self.kind == "NaN logits":
            self.handle = self.embeddings.register_forward_hook(self._nan)
        else:
            verification_module.draw = self._sample_rows
        return self

    def __exit__(self, *exc):
        if self.kind == "sampler raises":
            verification_module.draw = self.real_sample_rows
        else:
            self.handle.remove()

    def _raise(self, module, args):
        if bool((args[0] == self.poison).any()):
            self.fired += 1
            raise InjectedFault("the forward pass met the poison token")

    def _nan(self, module, args, output):
        hit = (args[0] == self.poison).unsqueeze(-1)
        if bool(hit.any()):
            self.fired += 1
            return output.masked_fill(hit, float("nan"))
        return output

    def _sample_rows(self, logits, rows, **options):
        if any(r.seed == self.seed and r.position >= self.position for r in rows):
            self.fired += 1
            raise InjectedFault("sampling a row of the faulty request")
        return self.real_sample_rows(logits, rows, **options)
