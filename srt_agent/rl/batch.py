"""Training samples and padding-free packing into micro-batches.

A :class:`Sample` is one trajectory as training data: prompt tokens, response tokens with their mask
(1 = sampled by the model and trained on, 0 = forced tool output, never in the loss), the engine's
sampling log-probs, the reward and the per-token quantities the algorithm adds (advantages, returns,
old and reference log-probs). :func:`pack` concatenates samples into one row per micro-batch with no
padding; siblings of a GRPO group share one copy of their prompt (an explicit attention mask lets each
response see it). Only the rows that predict a trained token go through the LM head.

A rollout may be several samples: a server session that branched (its requests did not all extend one
token list) gives one sample per branch, all with the rollout's reward. They weigh as one sample of their
group: only the last (the *lead*) enters an outcome estimator's group statistics and the others take its
advantage (:func:`share_advantages`); the ``seq-mean`` losses count the rollout as one sequence (its
branches share a ``seq_index``) and mini-batches keep its branches together (:func:`mini_batches`). With
``token-mean`` every sampled token of the rollout weighs once, as it would had the session not branched.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from ..agent.trajectory import Trajectory


@dataclass
class Sample:
    """One trajectory as training data; per-token lists cover the response tokens."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    engine_logprobs: list[float]
    reward: float = 0.0
    group: Hashable = 0
    advantages: list[float] | None = None
    returns: list[float] | None = None
    values: list[float] | None = None
    old_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    rollout: Hashable | None = None  # the rollout it is a branch of (None: a rollout of its own)
    lead: bool = True  # False: an earlier branch of its rollout, which takes the lead sample's advantage

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.engine_logprobs) != n:
            raise ValueError(
                f"response of {n} tokens but {len(self.response_mask)} mask entries and "
                f"{len(self.engine_logprobs)} log-probs"
            )
        if not self.prompt_ids:
            raise ValueError("a training sample needs at least one prompt token")

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def trained_tokens(self) -> int:
        return sum(self.response_mask)

    def trained(self, values: list[float]) -> list[float]:
        """The entries of a per-response-token list at trained positions (mask 1), in order."""
        return [v for v, m in zip(values, self.response_mask) if m]

    def expand(self, trained: Sequence[float], fill: float = 0.0) -> list[float]:
        """The inverse of :meth:`trained`: a per-response-token list with `fill` at untrained positions."""
        values = iter(trained)
        return [next(values) if m else fill for m in self.response_mask]


@dataclass
class MicroBatch:
    """Packed samples: one row of tokens, and the rows whose next token is trained (``targets``)."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    targets: torch.Tensor  # [T] rows of the packed sequence whose hidden state predicts a trained token
    target_ids: torch.Tensor  # [T] those tokens
    seq_index: torch.Tensor  # [T] which sample of the mini-batch each target belongs to
    samples: list[int] = field(default_factory=list)  # indices of the packed samples, in order
    attention_mask: torch.Tensor | None = None  # [1, 1, N, N] bool, True where a row may attend

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def per_target(self, samples: Sequence[Sample], name: str) -> torch.Tensor:
        """A per-response-token field of the samples (e.g. ``advantages``), at this batch's targets."""
        out: list[float] = []
        for i in self.samples:
            values = getattr(samples[i], name)
            if values is None:
                raise ValueError(f"sample {i} has no {name}")
            out += samples[i].trained(values)
        return torch.tensor(out, dtype=torch.float32)

    def split(self, samples: Sequence[Sample], values: torch.Tensor) -> list[tuple[int, list[float]]]:
        """Per-target values back per sample: ``(sample index, its per-response-token list)``."""
        flat = values.detach().float().tolist()
        out, k = [], 0
        for i in self.samples:
            n = samples[i].trained_tokens
            out.append((i, samples[i].expand(flat[k : k + n])))
            k += n
        return out


def pack(samples: Sequence[Sample], max_tokens: int, indices: Sequence[int] | None = None) -> list[MicroBatch]:
    """Pack samples (all, or those at `indices`) into micro-batches of about `max_tokens` tokens.

    Samples with the same prompt (a GRPO group) are packed together and share one copy of it: each
    response attends to the prompt block and to itself, so the prompt is computed once per micro-batch
    instead of once per sample; gradients are the same as with separate copies. Groups keep their
    first-appearance order; a sample that does not fit starts a new micro-batch (one larger than
    `max_tokens` gets one of its own). ``seq_index`` numbers rollouts by their first position in `indices`
    (a rollout's branches share one number), so the ``seq-mean`` losses of all micro-batches share one
    numbering and count a rollout once.
    """
    indices = list(range(len(samples))) if indices is None else list(indices)
    numbers: dict[Hashable, int] = {}
    order = {i: numbers.setdefault(rollout_key(samples, i), len(numbers)) for i in indices}
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        by_prompt.setdefault(tuple(samples[i].prompt_ids), []).append(i)
    batches: list[list[int]] = []
    size = 0
    last_prompt: tuple[int, ...] | None = None
    for prompt, members in by_prompt.items():
        for i in members:
            cost = len(samples[i].response_ids) + (len(prompt) if prompt != last_prompt else 0)
            if batches and size + cost <= max_tokens:
                batches[-1].append(i)
                size += cost
            else:
                batches.append([i])
                size = len(samples[i])
            last_prompt = prompt
    return [_build(samples, members, order) for members in batches]


def _build(samples: Sequence[Sample], members: list[int], order: dict[int, int]) -> MicroBatch:
    ids: list[int] = []
    positions: list[int] = []
    segment: list[int] = []  # the block each token belongs to
    parent: list[int] = []  # per block: the prompt block a response attends to (-1 for prompt blocks)
    targets: list[int] = []
    target_ids: list[int] = []
    seq_index: list[int] = []
    prompt_block, prompt_end, prompt_key = -1, -1, None
    for i in members:
        s = samples[i]
        key = tuple(s.prompt_ids)
        if key != prompt_key:  # a new prompt block
            prompt_block, prompt_key = len(parent), key
            parent.append(-1)
            ids += s.prompt_ids
            positions += range(len(s.prompt_ids))
            segment += [prompt_block] * len(s.prompt_ids)
            prompt_end = len(ids) - 1
        block = len(parent)
        parent.append(prompt_block)
        base = len(ids)
        ids += s.response_ids
        positions += range(len(s.prompt_ids), len(s.prompt_ids) + len(s.response_ids))
        segment += [block] * len(s.response_ids)
        for j, (token, m) in enumerate(zip(s.response_ids, s.response_mask)):
            if m:
                targets.append(base + j - 1 if j else prompt_end)
                target_ids.append(token)
                seq_index.append(order[i])
    return MicroBatch(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([positions]),
        targets=torch.tensor(targets, dtype=torch.long),
        target_ids=torch.tensor(target_ids, dtype=torch.long),
        seq_index=torch.tensor(seq_index, dtype=torch.long),
        samples=list(members),
        attention_mask=shared_prefix_mask(torch.tensor(segment), torch.tensor(parent)),
    )


def shared_prefix_mask(segment: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
    """``[1, 1, N, N]`` boolean mask (True = attend): causal inside each block, plus every response
    block sees the whole prompt block it continues."""
    pos = torch.arange(len(segment))
    same = (segment[:, None] == segment[None, :]) & (pos[:, None] >= pos[None, :])
    via_prompt = parent[segment][:, None] == segment[None, :]
    return (same | via_prompt)[None, None]


def trajectory_sample(traj: Trajectory, group: Hashable = 0) -> Sample:
    """A trajectory as a training sample (its model tokens trained, its tool tokens masked)."""
    return Sample(
        prompt_ids=list(traj.prompt_ids),
        response_ids=list(traj.response_ids),
        response_mask=list(traj.response_mask),
        engine_logprobs=list(traj.response_logprobs),
        reward=traj.reward,
        group=group,
    )


def rollout_key(samples: Sequence[Sample], i: int) -> Hashable:
    """The rollout sample `i` belongs to (its own index when it is a rollout of its own)."""
    rollout = samples[i].rollout
    return ("sample", i) if rollout is None else ("rollout", rollout)


def count_rollouts(samples: Sequence[Sample], indices: Sequence[int]) -> int:
    """How many rollouts the samples at `indices` are (a session's branches count once)."""
    return len({rollout_key(samples, i) for i in indices})


def mini_batches(samples: Sequence[Sample], order: Sequence[int], parts: int) -> list[list[int]]:
    """`order` cut into mini-batches of at most ``ceil(len(order) / parts)`` samples, each rollout's samples
    together at its first place in `order` (a mini-batch may then run over by the rest of a rollout)."""
    groups: dict[Hashable, list[int]] = {}
    for i in order:
        groups.setdefault(rollout_key(samples, i), []).append(i)
    size = math.ceil(len(order) / max(parts, 1))
    batches: list[list[int]] = []
    for members in groups.values():
        if not batches or len(batches[-1]) >= size:
            batches.append([])
        batches[-1].extend(members)
    return batches


def share_advantages(samples: Sequence[Sample]) -> None:
    """Give every earlier branch (``lead=False``) its rollout's advantage: the lead sample's at its first
    trained token (an outcome advantage is the same on all of them), on each of its own trained tokens.
    As verl's multi-output GRPO does; a branch whose rollout has no lead sample keeps none."""
    leads = {s.rollout: s for s in samples if s.lead and s.rollout is not None and s.advantages is not None}
    for s in samples:
        lead = leads.get(s.rollout) if not s.lead else None
        if lead is None:
            continue
        trained = lead.trained(lead.advantages)
        value = trained[0] if trained else 0.0
        s.advantages = s.expand([value] * s.trained_tokens)
