"""One policy update on a tiny model, and the samples it trains on (tool tokens masked)."""

from __future__ import annotations

import torch

from srt_agent.config import TrainConfig
from srt_agent.models import tiny_random_model
from srt_agent.rl.batch import Sample
from srt_agent.rl.policy import Policy
from srt_agent.rl.update import compute_advantages, update_policy


def samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for prompt in range(3):
        for k in range(3):
            n = 6 + k
            response = torch.randint(0, 256, (n,), generator=g).tolist()
            mask = [1] * n
            mask[2:4] = [0, 0]  # tool output
            out.append(Sample([prompt + 1, 7, 9], response, mask, [-1.0] * n, reward=float(k % 2), group=prompt))
    return out


def run(cfg: TrainConfig, data: list[Sample], seed: int = 0) -> Policy:
    policy = Policy(tiny_random_model("llama", seed=seed).model, dtype=torch.float64)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    compute_advantages(data, cfg)
    update_policy(policy, optimizer, data, cfg)
    return policy
