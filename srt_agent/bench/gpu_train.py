"""The GPU check's train stage: one GRPO step of the trainer on the device, for each `train.dtype`.

A small random-weight Qwen2 (float32 weights) gives the policy (`build_policy`: the float32 policy, AdamW
and the reference as `train:` configures them), then our engine, cast to `engine.dtype` as the trainer
casts it, generates a GRPO batch with SRT (`prompts` × `group` samples), every sample gets a seeded random
reward, and the trainer's own pieces take the step: `update_step` (old log-probs, GRPO advantages, the
clipped policy loss, one optimizer step) and `Engine.update_weights(policy.engine_weights(engine dtype))`
(the weight sync). Reported per dtype: the seconds of rollouts, update and sync, the peak device memory of
the update (CUDA's allocator peak; on a CPU the process's RSS; the weights' copy taken to measure the
change lives on the host), the largest weight change the step made (0: the update rounded away), and the
gap between the engine's and the trainer's log-probs of the sampled tokens (`training/rollout_logprob_diff_*`)
with the rollout correction's figures.

Then the gap where users run (`sampler_gap`): a random-weight model of `gap_shape` (Qwen2.5-1.5B's; its
head sharpened to `target_entropy`, as real models' are), our engine in bfloat16 sampling a GRPO batch, and
the trainer scoring it from float32 masters as a run does and with one source changed at a time
(`bench/gap.py`: attention not exact, a float32 trainer, float64).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from ..config import EnvConfig, TrainConfig
from ..engine import Engine, EngineOptions, SamplingParams
from ..rl.batch import Sample
from ..rl.policy import SamplerNumerics, build_policy, master_copy
from ..rl.update import update_step
from ..runner.device_info import resolve_engine_dtype
from ..runner.numerics import choose_exact_attention
from .gap import sampler_gap_rows
from .gpu_setup import (
    Deadline,
    GpuCheckConfig,
    check_outputs,
    memory_figures,
    random_model,
    reset_peak_memory,
    sharpen_head,
    synchronize,
)

DTYPES = ("float32", "bfloat16")
PROMPTS = 4


def rollouts(engine: Engine, config: GpuCheckConfig, vocab: int) -> list[Sample]:
    """A GRPO batch: PROMPTS prompts x `group` samples with seeded random rewards."""
    rng = random.Random(config.seed)
    prompts = [[rng.randrange(vocab) for _ in range(config.prompt_tokens)] for _ in range(PROMPTS)]
    batch = [(i, p) for i, p in enumerate(prompts) for _ in range(config.group)]
    params = [SamplingParams(max_tokens=config.max_tokens, seed=config.seed + j) for j in range(len(batch))]
    outs = engine.generate([p for _, p in batch], params, prompt_keys=[i for i, _ in batch])
    check_outputs(outs)
    engine.end_step()
    return [
        Sample(p, o.token_ids, [1] * len(o.token_ids), o.logprobs, reward=rng.random(), group=i)
        for (i, p), o in zip(batch, outs)
    ]


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


def grpo_step(config: GpuCheckConfig, device: torch.device, dtype: str) -> dict:
    """One step at `train.dtype` = `dtype`, set up as the trainer does: the policy copied from the float32
    model, the engine on the model cast to `engine.dtype` (auto: bf16 on a GPU); rollouts, update, weight
    sync in the engine's dtype. Times, memory and the largest weight change."""
    loaded = random_model(config.train_shape, torch.float32, device, config.seed)
    env = EnvConfig(train=TrainConfig(dtype=dtype))
    engine_dtype = resolve_engine_dtype(env.engine.dtype, device, loaded.dtype)
    sampler = SamplerNumerics(engine_dtype, choose_exact_attention(env.engine.batch_invariant, loaded.model, device))
    policy, optimizer, scheduler, reference = build_policy(env, loaded.model, sampler=sampler)
    engine = _engine(config, loaded, device, engine_dtype, sampler.exact_attention)
    samples, rollout_s = timed(lambda: rollouts(engine, config, config.train_shape.vocab_size), device)
    before = {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in policy.base.state_dict().items()}
    reset_peak_memory(device)
    metrics, update_s = timed(
        lambda: update_step(policy, reference, optimizer, scheduler, samples, env.train, config.seed), device
    )
    memory = memory_figures(device)
    change = max(float((v.detach().cpu().float() - before[k]).abs().max()) for k, v in policy.base.state_dict().items())
    _, sync_s = timed(lambda: engine.update_weights(policy.engine_weights(engine_dtype)), device)
    return dict(
        dtype=dtype,
        engine_dtype=str(engine_dtype).removeprefix("torch."),
        samples=len(samples),
        tokens=sum(len(s.response_ids) for s in samples),
        rollout_s=rollout_s,
        update_s=update_s,
        weight_sync_s=sync_s,
        update_memory=memory,
        max_weight_change=change,
        lr=env.train.lr,
        grad_norm=metrics.get("actor/grad_norm"),
        pg_loss=metrics.get("actor/pg_loss"),
        **{k: v for k, v in metrics.items() if k.startswith(("training/rollout_", "rollout_corr/"))},
    )


def sampler_gap(config: GpuCheckConfig, device: torch.device) -> dict:
    """The bfloat16 sampler-trainer gap at `gap_shape` (module docstring), per trainer variant
    (`bench/gap.py`'s rows), and whether the engine's attention was exact."""
    shape = config.gap_shape
    loaded = random_model(shape, torch.float32, device, config.seed)
    rng = random.Random(config.seed)
    probe = [[rng.randrange(shape.vocab_size) for _ in range(config.prompt_tokens)] for _ in range(PROMPTS)]
    sharpened = sharpen_head(loaded.model, probe, config.target_entropy)
    masters = master_copy(loaded.model)  # before the engine casts the module, as the trainer takes them
    engine = _engine(config, loaded, device, torch.bfloat16)
    sampler = SamplerNumerics(torch.bfloat16, engine.runner.exact_attention)
    samples = rollouts(engine, config, shape.vocab_size)
    rows = sampler_gap_rows(loaded.model, masters, samples, sampler)
    return dict(
        model=shape.name, exact_attention=sampler.exact_attention, entropy=sharpened["entropy_after_nats"], rows=rows
    )


def _engine(config: GpuCheckConfig, loaded, device: torch.device, dtype: torch.dtype, batch_invariant="auto") -> Engine:
    """An SRT engine for one GRPO group per prompt at the check's lengths."""
    return Engine(
        loaded,
        EngineOptions(
            drafter="srt",
            device=device,
            max_batch=PROMPTS * config.group,
            max_context=config.prompt_tokens + config.max_tokens + 8,
            calibrate=False,
            dtype=dtype,
            batch_invariant=batch_invariant,
        ),
    )


def run_train(
    config: GpuCheckConfig,
    device: torch.device,
    deadline: Deadline,
    save: Callable[[dict], None],
    log: Callable[[str], None],
) -> dict:
    """The stage: one GRPO step per train dtype, then the bfloat16 sampler-trainer gap at `gap_shape`."""
    result: dict = dict(model=vars(config.train_shape), steps=[], skipped=[])
    for dtype in DTYPES:
        if deadline.expired():
            result["skipped"].append(f"{dtype}: time budget")
            continue
        step = grpo_step(config, device, dtype)
        log(f"GRPO step {dtype}: update {step['update_s']:.2f} s, weight change {step['max_weight_change']:.2e}")
        result["steps"].append(step)
        save(result)
    if deadline.expired():
        result["skipped"].append(f"sampler gap at {config.gap_shape.name}: time budget")
    else:
        result["gap"] = sampler_gap(config, device)
        log(f"bfloat16 sampler-trainer gap at {config.gap_shape.name}: {result['gap']['rows']['trainer']}")
        save(result)
    result["headline"] = {
        s["dtype"]: dict(
            update_s=round(s["update_s"], 3),
            max_weight_change=s["max_weight_change"],
            logprob_diff_mean=s.get("training/rollout_logprob_diff_mean"),
            **s["update_memory"],
        )
        for s in result["steps"]
    }
    if "gap" in result:
        result["headline"]["bf16_gap"] = {k: row["logprob_diff_mean"] for k, row in result["gap"]["rows"].items()}
    return result
