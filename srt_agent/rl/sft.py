"""Supervised fine-tuning on token-level samples: next-token loss on trained tokens only.

Tool output (``response_mask = 0``) and prompts are context, never targets, exactly as in RL.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence

import torch

from .algorithms import agg_loss
from .batch import Sample, pack
from .policy import Policy, adamw


def sft_epochs(
    policy: Policy,
    samples: Sequence[Sample],
    epochs: int,
    lr: float,
    batch_size: int,
    micro_batch_tokens: int,
    seed: int = 0,
    grad_clip: float = 1.0,
    on_step: Callable[[int, int, float], None] | None = None,
) -> list[dict[str, float]]:
    """Train `epochs` passes over `samples` (shuffled, seeded) with AdamW; one dict of figures per optimizer step.

    `on_step(step, total, loss)` is called after every optimizer step (e.g. a progress bar).
    """
    if not samples:
        raise ValueError("no cold-start samples to train on")
    optimizer = adamw(policy.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    total = epochs * math.ceil(len(samples) / batch_size)
    history: list[dict[str, float]] = []
    for _ in range(epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        for lo in range(0, len(order), batch_size):
            chosen = order[lo : lo + batch_size]
            num_tokens = sum(samples[i].trained_tokens for i in chosen)
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            tokens = 0
            for batch in pack(samples, micro_batch_tokens, chosen):
                logprobs = policy.score(batch).logprobs
                loss = agg_loss(-logprobs, torch.ones_like(logprobs), "token-mean", num_tokens=num_tokens)
                loss.backward()
                loss_sum += float(loss.detach())
                tokens += batch.num_tokens
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
            if math.isfinite(loss_sum) and torch.isfinite(grad_norm):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - start
            history.append({"loss": loss_sum, "grad_norm": float(grad_norm), "tokens": tokens, "seconds": seconds})
            if on_step is not None:
                on_step(len(history), total, loss_sum)
    return history
