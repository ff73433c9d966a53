"""`srt-agent bench gap`: how far the log-prob a token was sampled with is from the trainer's, and from what.

A model samples chat prompts with a backend (our engine or vLLM) in `dtype`, float32 masters taken before the
engine casts the module; the trainer scores the tokens as a run would (``train.dtype: auto``: the engine's
numerics, with exact attention where the engine has it) and with one thing changed at a time, so each
source shows as the gap it adds:

- ``trainer``: what a run measures (``training/rollout_logprob_diff_mean``);
- ``trainer, attention not exact``: the order of the attention's sums (what batch-invariant numerics remove);
- ``trainer, float32``: the whole narrow body (a float32 trainer scoring narrow rollouts);
- ``float64``: the engine's weights in float64, the truth both sides approximate (the sampler's own error).

`sampler_gap_rows` is shared with the GPU check (`gpu_train.py`), which runs it at Qwen2.5-1.5B's shape.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..config import TrainConfig
from ..console import Progress
from ..engine import Engine, EngineOptions, SamplingParams
from ..models import cast_weights, load_model
from ..rl.batch import Sample
from ..rl.policy import Policy, SamplerNumerics, master_copy
from ..rl.update import logprob_mismatch, score_samples
from ..runner.numerics import NARROW

QUESTIONS = (
    "Write a python function that sums a list.",
    "What is 17*23? Use code.",
    "Explain recursion briefly.",
    "Compute the 10th Fibonacci number with python.",
    "Name three prime numbers and say why.",
    "How do I reverse a string in python?",
    "Write a haiku about a compiler.",
    "What does a hash table do?",
)


@dataclass
class GapConfig:
    model: str = "smollm2"
    backend: str = "engine"  # or "vllm"
    dtype: str = "bfloat16"
    batch_invariant: bool | str = "auto"
    prompts: int = 8
    max_tokens: int = 64
    seed: int = 0


def sampler_gap_rows(
    model: torch.nn.Module,
    masters: dict[str, torch.Tensor],
    samples: Sequence[Sample],
    sampler: SamplerNumerics,
    exact_reference: bool = True,
) -> dict[str, dict[str, float]]:
    """Per trainer variant (module docstring), the gap to the samples' log-probs: mean, max and verl's
    probability differences. `model`: the engine's module (its weights as the engine holds them)."""
    narrow = sampler.dtype in NARROW
    options = sampler.policy_options(TrainConfig(dtype="auto"))
    variants = {"trainer": options}
    if options["exact_attention"]:
        variants["trainer, attention not exact"] = {**options, "exact_attention": False}
    if narrow:
        variants["trainer, float32"] = {}
    rows = {}
    for name, kwargs in variants.items():
        policy = Policy(model, masters=masters, **kwargs)
        logprobs, _ = score_samples(policy, samples, 2048)
        rows[name] = _short(logprob_mismatch(samples, logprobs))
        del policy
    if exact_reference:
        truth = copy.deepcopy(model).double()  # the engine's weights (rounded as it holds them), in float64
        logprobs, _ = score_samples(Policy(truth, dtype=torch.float64, copy=False), samples, 2048)
        rows["float64"] = _short(logprob_mismatch(samples, logprobs))
    return rows


def _short(gap: dict[str, float]) -> dict[str, float]:
    return {k.removeprefix("training/rollout_"): v for k, v in gap.items()}


def run_gap(config: GapConfig, work: Progress | None = None) -> dict:
    """Sample the chat prompts with the configured backend, then score them (`sampler_gap_rows`); `work` hears
    of the three stages (load, sample, score) as they end."""
    work = work or Progress.unseen()
    work.now(f"loading {config.model}")
    loaded = load_model(config.model)
    work.done(f"loaded {config.model}")
    work.now(f"sampling {config.prompts} prompts × {config.max_tokens} tokens with {config.backend}")
    masters = master_copy(loaded.model)
    dtype = getattr(torch, config.dtype)
    prompts = [_chat(loaded.tokenizer, QUESTIONS[i % len(QUESTIONS)]) for i in range(config.prompts)]
    params = [
        SamplingParams(temperature=1.0, max_tokens=config.max_tokens, seed=config.seed + i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    if config.backend == "vllm":
        outs, exact = _vllm_samples(loaded, config, prompts, params), False
        weights = cast_weights(copy.deepcopy(loaded.model), dtype)  # what vLLM holds: the weights rounded
    else:
        engine = Engine(
            loaded,
            EngineOptions(
                drafter="none",
                max_batch=len(prompts),
                max_context=max(map(len, prompts)) + config.max_tokens + 8,
                calibrate=False,
                dtype=dtype,
                batch_invariant=config.batch_invariant,
            ),
        )
        outs, exact, weights = engine.generate(prompts, params), engine.runner.exact_attention, loaded.model
    samples = [Sample(p, o.token_ids, [1] * len(o.token_ids), o.logprobs) for p, o in zip(prompts, outs)]
    work.done(f"sampled {sum(len(s.response_ids) for s in samples)} tokens with {config.backend}")
    work.now("scoring with the trainer, one source changed at a time")
    rows = sampler_gap_rows(weights, masters, samples, SamplerNumerics(dtype, exact))
    work.done(f"scored {len(rows)} ways")
    return dict(config=vars(config), exact_attention=exact, tokens=sum(len(s.response_ids) for s in samples), rows=rows)


def _chat(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def _vllm_samples(loaded, config: GapConfig, prompts, params):
    """The prompts sampled by vLLM in the configured dtype, exact sampling on (its LM head in float32)."""
    from ..backends.vllm.models import vllm_model_dir
    from ..backends.vllm.vllm_engine import VLLMEngine, VLLMEngineOptions

    options = VLLMEngineOptions(
        max_batch=len(prompts),
        max_context=max(map(len, prompts)) + config.max_tokens + 8,
        dtype=config.dtype,
        kv_cache_gib=0.5,
    )
    engine = VLLMEngine(vllm_model_dir(config.model), loaded.tokenizer, loaded.eos_token_ids, options)
    try:
        ids = [engine.add_request(p, s) for p, s in zip(prompts, params)]
        done = {}
        while engine.has_work():
            done.update({o.request_id: o for o in engine.step()})
        return [done[i] for i in ids]
    finally:
        engine.close()
