"""`srt-agent bench update`: the trainer's update throughput against a plain Hugging Face forward+backward.

The workload is shaped like a GRPO step of the ReTool env: P prompts × n samples, each a shared
prompt and a response with a masked tool-output span. The trainer's update (padding-free packed
micro-batches, LM head only on trained tokens, AdamW) and the plain HF baseline (right-padded batches
of the same samples, ``model(input_ids, attention_mask, labels)``, AdamW) run alternately in one process
on the same tokens, so the ratio holds even on a busy machine. Full fine-tuning and LoRA are both measured.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ..config import LoraConfig
from ..rl.batch import Sample, pack
from ..rl.policy import Policy


@dataclass
class UpdateBenchConfig:
    model: str = "smollm2"
    prompts: int = 4
    samples: int = 4
    prompt_tokens: int = 130
    response_tokens: int = 110
    tool_tokens: int = 20
    micro_batch_tokens: int = 768
    hf_batch_size: int = 8  # sequences per forward/backward of the plain HF baseline
    lora_rank: int = 16
    repeats: int = 3
    seed: int = 0

    @classmethod
    def quick(cls) -> UpdateBenchConfig:
        return cls(
            model="tiny-llama", prompts=2, samples=2, prompt_tokens=24, response_tokens=16, tool_tokens=4, repeats=2
        )


def workload(cfg: UpdateBenchConfig, vocab: int) -> list[Sample]:
    """GRPO-shaped samples: siblings share their prompt; a tool span in the middle of each response is masked."""
    rng = random.Random(cfg.seed)
    samples = []
    for _ in range(cfg.prompts):
        prompt = [rng.randrange(vocab) for _ in range(cfg.prompt_tokens)]
        for _ in range(cfg.samples):
            response = [rng.randrange(vocab) for _ in range(cfg.response_tokens)]
            mask = [1] * cfg.response_tokens
            start = cfg.response_tokens // 2
            mask[start : start + cfg.tool_tokens] = [0] * cfg.tool_tokens
            samples.append(Sample(prompt, response, mask, [0.0] * cfg.response_tokens, rng.random()))
    return samples


def packed_update(policy: Policy, optimizer, samples: list[Sample], micro_batch_tokens: int) -> None:
    """The trainer's path: packed micro-batches, log-probs of trained tokens only, one optimizer step."""
    n = sum(s.trained_tokens for s in samples)
    for batch in pack(samples, micro_batch_tokens):
        (-policy.score(batch).logprobs.sum() / n).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def hf_update(model: torch.nn.Module, optimizer, samples: list[Sample], per_batch: int) -> None:
    """The plain baseline: right-padded batches of `per_batch` samples through the HF model with labels."""
    for lo in range(0, len(samples), per_batch):
        chunk = samples[lo : lo + per_batch]
        width = max(len(s) for s in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attention = torch.zeros(len(chunk), width, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        for i, s in enumerate(chunk):
            tokens = s.prompt_ids + s.response_ids
            ids[i, : len(tokens)] = torch.tensor(tokens)
            attention[i, : len(tokens)] = 1
            for j, (t, m) in enumerate(zip(s.response_ids, s.response_mask)):
                if m:
                    labels[i, len(s.prompt_ids) + j] = t
        model(input_ids=ids, attention_mask=attention, labels=labels, use_cache=False).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _time(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_update_bench(cfg: UpdateBenchConfig, report: Callable[[str, float], None] | None = None) -> dict:
    """Time every method `repeats` times, interleaved; the best time of each gives its tokens/s."""
    from ..models import load_model

    loaded = load_model(cfg.model, device="cpu")
    samples = workload(cfg, loaded.model.get_input_embeddings().weight.shape[0])
    tokens = sum(len(s) for s in samples)
    trained = sum(s.trained_tokens for s in samples)
    full = Policy(loaded.model)
    lora = Policy(loaded.model, lora=LoraConfig(rank=cfg.lora_rank))
    hf = Policy(loaded.model).base  # a plain trainable copy for the baseline
    methods = {
        "hf-forward-backward": (
            lambda o: hf_update(hf, o, samples, cfg.hf_batch_size),
            torch.optim.AdamW(hf.parameters(), lr=1e-7),
        ),
        "srt-full": (
            lambda o: packed_update(full, o, samples, cfg.micro_batch_tokens),
            torch.optim.AdamW(full.parameters(), lr=1e-7),
        ),
        f"srt-lora-r{cfg.lora_rank}": (
            lambda o: packed_update(lora, o, samples, cfg.micro_batch_tokens),
            torch.optim.AdamW(lora.parameters(), lr=1e-7),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(cfg.repeats):
        for name, (fn, optimizer) in methods.items():
            seconds = _time(lambda fn=fn, optimizer=optimizer: fn(optimizer))
            times[name].append(seconds)
            if report is not None:
                report(name, seconds)
    best = {name: min(ts) for name, ts in times.items()}
    base = best["hf-forward-backward"]
    rows = {
        name: {
            "best_s": best[name],
            "times_s": times[name],
            "tokens_per_s": tokens / best[name],
            "trained_tokens_per_s": trained / best[name],
            "vs_hf": base / best[name],
        }
        for name in methods
    }
    return {
        "config": asdict(cfg),
        "tokens": tokens,
        "trained_tokens": trained,
        "threads": torch.get_num_threads(),
        "methods": rows,
    }
