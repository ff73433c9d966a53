"""The check every exact comparison of two engines' outputs makes: token-identical, or every first difference a
near-tie proven in float64 (`srt_agent.rl.identity`); a fault fails it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from srt_agent.rl.identity import Difference, Rollout, Sampling, explain_pairs, faults


def assert_same_up_to_near_ties(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: Sequence,
    outputs: Sequence,
    reference: Sequence,
    dtype: torch.dtype = torch.float32,
) -> list[Difference]:
    """`outputs` and `reference` (RequestOutputs of the same seeded `prompts` and `params`) agree token for
    token up to proven near-ties of `model` (the weights both sampled from, computing in `dtype`); returns the
    differences."""
    assert len(outputs) == len(reference) == len(prompts)
    params = list(params) if isinstance(params, Sequence) else [params] * len(prompts)

    def rollout(prompt, out, p) -> Rollout:
        return Rollout(prompt, list(out.token_ids), [1] * len(out.token_ids), p.seed)

    pairs = [(rollout(q, a, p), rollout(q, b, p)) for q, a, b, p in zip(prompts, outputs, reference, params)]
    sampling = [Sampling(p.temperature, p.top_p, p.top_k) for p in params]
    differences = explain_pairs(model, pairs, sampling, dtype)
    assert not faults(differences), differences
    return differences
