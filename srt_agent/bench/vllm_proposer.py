"""Measurements of speculation inside vLLM on this machine, as functions (beside ``srt-agent bench vllm``;
nothing here is a script).

* :func:`verification_cost`: the time of a decode step with exactly k drafted tokens per sequence (drafts of
  token 0, practically never accepted), at several batch sizes: what a drafted token costs to verify.
  :func:`cost_model` fits SRTProposer's policy knobs (``step_fixed_ms``, ``step_row_ms``,
  ``draft_token_ms``) to those rows.
* :func:`workload`: an RL-like workload (the same chat prompts, several samples each, several epochs so the
  trees are warm) under none / ngram / suffix / srt: tokens per second and acceptance per epoch.

Engines run in this process (``cpu_env``); set ``LD_PRELOAD`` with ``preload_env`` before
the process starts for vLLM's best CPU speed.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from ..backends.vllm import configure_speculation, cpu_env, vllm_model_dir
from ..drafting import runs_as_proposer

FORCED_CLASS = "srt_agent.bench.vllm_proposer.ForcedDraftProposer"
QUESTIONS = [
    "What is 17 * 23? Compute it with Python.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "How many primes are there below 100? Use code to check.",
    "Sort the list [5, 3, 9, 1] and explain each step.",
    "What is the sum of the digits of 2**20?",
    "Convert 255 to binary and hexadecimal.",
    "Explain what a Python list comprehension is, with an example.",
    "Find the greatest common divisor of 84 and 126.",
]


class ForcedDraftProposer:
    """A ``custom_class`` proposer that drafts ``k`` copies of token 0 for every decoding sequence."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        return [[0] * self.k if sampled else [] for sampled in sampled_token_ids]


def _engine(model: str, spec: dict | None, max_num_seqs: int, max_model_len: int, kv_cache_gib: int = 1):
    from vllm import LLM

    os.environ.update(cpu_env(kv_cache_gib=kv_cache_gib))
    return LLM(
        model=str(vllm_model_dir(model)),
        enforce_eager=True,
        dtype="float32",
        seed=0,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        speculative_config=spec,
    )


def _close(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _timed(llm, prompts: list[list[int]], max_tokens: int, temperature: float) -> tuple[float, int]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outs)


def chat_prompts(llm, questions: list[str] = QUESTIONS) -> list[list[int]]:
    tokenizer = llm.get_tokenizer()
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def verification_cost(
    model: str = "smollm2",
    batches: tuple[int, ...] = (1, 16),
    ks: tuple[int, ...] = (0, 2, 4, 8),
    max_tokens: int = 32,
    repeats: int = 2,
) -> list[dict]:
    """Per batch size and k: milliseconds per decode step (best of `repeats`) with k forced draft tokens per
    sequence, and the extra milliseconds per drafted token over k = 0."""
    from ..backends.vllm.workers import _drafter

    llm = _engine(
        model, {"method": "custom_class", "model": FORCED_CLASS, "num_speculative_tokens": max(ks)}, max(batches), 512
    )
    drafter = llm.collective_rpc(_drafter)[0]
    prompts = chat_prompts(llm)
    rows = []
    try:
        for batch in batches:
            batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
            base = None
            for k in ks:
                drafter.k = k
                _timed(llm, batch_prompts, 4, 1.0)  # warm-up
                step_ms = 1e3 * min(_timed(llm, batch_prompts, max_tokens, 1.0)[0] for _ in range(repeats)) / max_tokens
                base = step_ms if k == 0 else base
                per_token = (step_ms - base) / (batch * k) if k and base is not None else 0.0
                rows.append(dict(batch=batch, k=k, step_ms=step_ms, ms_per_draft_token=per_token))
    finally:
        _close(llm)
    return rows


def cost_model(rows: list[dict]) -> dict[str, float]:
    """SRTProposer's knobs from :func:`verification_cost` rows (at least two batch sizes): a step costs
    ``step_fixed_ms + step_row_ms * B`` at k = 0, and each drafted token adds ``draft_token_ms``."""
    base = sorted((r["batch"], r["step_ms"]) for r in rows if r["k"] == 0)
    (b0, t0), (b1, t1) = base[0], base[-1]
    row_ms = (t1 - t0) / (b1 - b0)
    drafted = [r["ms_per_draft_token"] for r in rows if r["k"] and r["batch"] == b1]
    return dict(step_fixed_ms=t0 - row_ms * b0, step_row_ms=row_ms, draft_token_ms=sum(drafted) / len(drafted))


class DraftCounter:
    """Counts a live proposer's drafted tokens and, from the next step's sampled tokens, the accepted ones
    (vLLM's own counters are per process, not per engine). Works for every proposer whose ``propose``
    takes the step's sampled token ids (a list of lists) among its arguments."""

    def __init__(self, drafter) -> None:
        self.drafted = self.accepted = 0
        propose = drafter.propose

        def counted(*args, **kwargs):
            sampled = next(a for a in args if isinstance(a, list))
            self.accepted += sum(len(s) - 1 for s in sampled if s)
            drafts = propose(*args, **kwargs)
            self.drafted += sum(len(d) for d in drafts)
            return drafts

        drafter.propose = counted


def _counter(llm, method: str) -> DraftCounter | None:
    from ..backends.vllm.workers import _drafter

    return None if method == "none" else DraftCounter(llm.collective_rpc(_drafter)[0])


def workload(
    model: str = "smollm2",
    methods: tuple[str, ...] = ("none", "ngram", "suffix", "srt"),
    batch: int = 16,
    samples: int = 4,
    epochs: int = 3,
    max_tokens: int = 64,
    k: int = 8,
    temperature: float = 1.0,
    questions: list[str] = QUESTIONS,
    srt_options: dict | None = None,
    kv_cache_gib: int = 1,
) -> list[dict]:
    """Per method and epoch: tokens/s and acceptance on `questions` × `samples`, `batch` sequences at once.

    All methods' engines live in this process together, and each epoch runs every method once, in a rotating
    order, so load drift on the machine falls on all of them alike; the epochs repeat the same requests, as RL
    steps do (srt calls ``end_step`` after each). With ngram among the methods, call it once per process:
    vLLM 0.31 cannot build another engine in a process after an ngram one (see below).
    """
    from . import srt_proposer

    engines, counters = {}, {}
    try:
        # ngram's engine last: vLLM 0.31's kernel registration of any engine built after it in the same
        # process fails (its scan of sys.modules trips over llvmlite, which the ngram proposer imports)
        for method in sorted(methods, key=lambda m: m == "ngram"):
            options = (srt_options or {}) if runs_as_proposer(method) else {}
            engines[method] = _engine(model, configure_speculation(method, k, **options), batch, 1024, kv_cache_gib)
            counters[method] = _counter(engines[method], method)
        prompts = [p for p in chat_prompts(engines[methods[0]], questions) for _ in range(samples)]
        for llm in engines.values():
            _timed(llm, prompts[:1], 4, temperature)  # warm-up
        rows = []
        for epoch in range(epochs):
            for method in methods[epoch % len(methods) :] + methods[: epoch % len(methods)]:
                llm, counter = engines[method], counters[method]
                d0, a0 = (counter.drafted, counter.accepted) if counter else (0, 0)
                seconds, tokens = _timed(llm, prompts, max_tokens, temperature)
                d1, a1 = (counter.drafted, counter.accepted) if counter else (0, 0)
                if runs_as_proposer(method):
                    srt_proposer(llm).end_step()
                rows.append(
                    dict(
                        method=method,
                        batch=batch,
                        epoch=epoch,
                        tok_s=tokens / seconds,
                        drafted=d1 - d0,
                        accepted=a1 - a0,
                        acceptance=(a1 - a0) / (d1 - d0) if d1 > d0 else 0.0,
                    )
                )
    finally:
        for llm in engines.values():
            _close(llm)
    return rows
