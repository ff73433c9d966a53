"""Identity that can be checked: why two runs that should be token-identical are not.

Two exact methods (plain decoding and speculation, run-ahead or not, vLLM or our engine) sample the token at
position ``p`` of a request with seed ``s`` as ``argmax(filtered logits / T + G(s, p))``; their tokens can
differ only where their logits do. For each pair of trajectories that differ, :func:`explain_pairs` finds
the first differing token and recomputes that position's logits in float64 from the same weights (the
engine's, upcast), with the same noise:

- ``near-tie``: both tokens' perturbed scores lie within the tolerance of the row's best, the tolerance being
  four times the largest error of the logits the run's dtype computes there (measured: the same weights in
  that dtype, under the engine's numerics, against float64), so two computations of the row, each within
  that error, can pick either token;
- ``fault``: a token whose score lies further below the best (one run sampled what the exact sampler does
  not draw there), or one trajectory ends where the other samples on;
- ``observation``: the first difference is in forced tokens (the environment answered differently, e.g. a
  tool run that timed out under load).

An exact comparison holds when every difference is a near-tie; :func:`faults` names the others.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from ..runner.model_runner import LogitHead
from ..runner.numerics import compute, embeddings
from ..runner.sampler import filter_logits, uniforms

TOLERANCE_FACTOR = 4.0  # two computations, each within the measured error: a factor 2 on each side's 2
KINDS = {"near-tie": "near_ties", "fault": "faults", "observation": "observations"}  # kind → metric name


@dataclass(frozen=True)
class Difference:
    """The first differing token of one pair of trajectories, and what it is."""

    pair: int  # the pair's index
    position: int  # absolute position (prompt + response tokens before it)
    tokens: tuple[int | None, int | None]  # each side's token there (None: that trajectory ends)
    kind: str  # "near-tie", "fault" or "observation"
    gap: float | None = None  # float64: the two tokens' perturbed scores apart
    below_best: float | None = None  # float64: the farther token's score below the row's best
    tolerance: float | None = None  # what a near-tie may reach (TOLERANCE_FACTOR × the dtype's logit error)
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Rollout:
    """What identity needs of a trajectory: its tokens, which were sampled, and its seed."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    response_mask: Sequence[int]
    seed: int | None

    @classmethod
    def of(cls, traj) -> Rollout:
        """From a :class:`~srt_agent.agent.trajectory.Trajectory` or its JSON row."""
        get = traj.get if isinstance(traj, dict) else lambda k: getattr(traj, k)
        return cls(get("prompt_ids"), get("response_ids"), get("response_mask"), get("seed"))


@dataclass(frozen=True)
class Sampling:
    """How every token was sampled: temperature, top-p, top-k, and the dtype of the noise (float64 runs draw
    52-bit uniforms, every other dtype 23-bit ones)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    noise_dtype: torch.dtype = torch.float32


def identity_sampling(sampling, dtype: torch.dtype) -> Sampling:
    """The :class:`Sampling` of a run's ``sampling:`` config section, its engines computing in `dtype`."""
    noise = torch.float64 if dtype == torch.float64 else torch.float32
    return Sampling(sampling.temperature, sampling.top_p, sampling.top_k, noise)


def first_difference(a: Rollout, b: Rollout) -> int | None:
    """Index into the responses of the first token that differs (or where one ends); None when identical."""
    if list(a.prompt_ids) != list(b.prompt_ids):
        return 0
    for i, (x, y) in enumerate(zip(a.response_ids, b.response_ids)):
        if x != y:
            return i
    return None if len(a.response_ids) == len(b.response_ids) else min(len(a.response_ids), len(b.response_ids))


def explain_pairs(
    model: torch.nn.Module,
    pairs: Sequence[tuple[Rollout, Rollout]],
    sampling: Sampling | Sequence[Sampling],
    dtype: torch.dtype,
) -> list[Difference]:
    """Each differing pair's first difference, judged (module docstring). `model`: the weights the rollouts
    were sampled from (any dtype; rounded to `dtype`, the run's, then upcast to float64); `sampling`: how
    every pair was sampled, or one per pair."""
    found = [(i, a, b, first_difference(a, b)) for i, (a, b) in enumerate(pairs)]
    found = [(i, a, b, at) for i, a, b, at in found if at is not None]
    if not found:
        return []
    per_pair = [sampling] * len(pairs) if isinstance(sampling, Sampling) else list(sampling)
    judge = _Judge(model, dtype)
    return [judge.difference(i, a, b, at, per_pair[i]) for i, a, b, at in found]


def faults(differences: Sequence[Difference]) -> list[Difference]:
    """The differences an exact comparison cannot allow (all but near-ties)."""
    return [d for d in differences if d.kind != "near-tie"]


def compare_identity(
    name: str, main: Sequence, other: Sequence, model: torch.nn.Module, sampling: Sampling, dtype: torch.dtype
) -> tuple[dict[str, float], list[dict]]:
    """A compared method's trajectories (`other`) against the training ones (`main`), pair by pair:
    ``compare/<name>/near_ties``, ``…/faults`` and ``…/observations`` (differences of each kind), and every
    difference as a dict (with the method's name)."""
    pairs = [(Rollout.of(a), Rollout.of(b)) for a, b in zip(main, other)]
    differences = explain_pairs(model, pairs, sampling, dtype) if len(main) == len(other) else []
    counts = {kind: sum(d.kind == kind for d in differences) for kind in KINDS}
    metrics = {f"compare/{name}/{label}": float(counts[kind]) for kind, label in KINDS.items()}
    return metrics, [{"method": name, **d.as_dict()} for d in differences]


class _Judge:
    """The weights in the run's dtype and in float64, on the CPU, and the row-by-row verdict."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.dtype = dtype
        self.run = copy.deepcopy(model).to("cpu").eval()
        with torch.no_grad():
            for p in self.run.parameters():
                p.data = p.data.to(dtype)
        self.exact = copy.deepcopy(self.run).double()

    def difference(self, pair: int, a: Rollout, b: Rollout, at: int, sampling: Sampling) -> Difference:
        position = len(a.prompt_ids) + at
        tokens = (_token(a, at), _token(b, at))
        sampled = [_sampled(r, at) for r in (a, b)]
        if None in tokens:
            return Difference(pair, position, tokens, "fault", detail="one trajectory ends where the other goes on")
        if not any(sampled):
            return Difference(pair, position, tokens, "observation", detail="forced tokens differ")
        if not all(sampled):
            return Difference(pair, position, tokens, "fault", detail="one side sampled, the other forced a token")
        if sampling.temperature > 0 and (a.seed is None or a.seed != b.seed):  # greedy draws no noise
            return Difference(pair, position, tokens, "fault", detail=f"seeds differ ({a.seed} vs {b.seed})")
        context = list(a.prompt_ids) + list(a.response_ids[:at])
        return self._row(pair, position, tokens, context, a.seed or 0, sampling)

    @torch.no_grad()
    def _row(
        self, pair: int, position: int, tokens: tuple[int, int], context: list[int], seed: int, s: Sampling
    ) -> Difference:
        temperature = s.temperature or 1.0
        exact = _last_logits(self.exact, context, torch.float64) / temperature
        run = _last_logits(self.run, context, self.dtype).double() / temperature
        error = float((run - exact).abs().max())
        noise = uniforms([(seed, position)], exact.shape[-1], s.noise_dtype).double()
        gumbel = -torch.log(-torch.log(noise[0]))
        tolerance = TOLERANCE_FACTOR * error + 1e-6 * (1.0 + float(gumbel.abs().max()))
        scores = _filtered(exact, tokens, tolerance, s) + (gumbel if s.temperature > 0 else 0.0)
        best = float(scores.max())
        below = max(best - float(scores[t]) for t in tokens)
        gap = abs(float(scores[tokens[0]] - scores[tokens[1]]))
        kind = "near-tie" if below <= tolerance else "fault"
        return Difference(pair, position, tokens, kind, gap, below, tolerance, f"float error of the logits {error:.2e}")


def _filtered(scaled: torch.Tensor, tokens: tuple[int, int], tolerance: float, s: Sampling) -> torch.Tensor:
    """The row after `s`'s top-k / top-p in float64, each of `tokens` kept where raising its logit by
    `tolerance` would keep it (a filter boundary the row's error can move)."""
    if s.top_k <= 0 and s.top_p >= 1:
        return scaled
    out = filter_logits(scaled[None], [s.top_k], [s.top_p])[0]
    for t in tokens:
        if out[t] == float("-inf"):
            raised = scaled.clone()
            raised[t] += tolerance
            if filter_logits(raised[None], [s.top_k], [s.top_p])[0][t] != float("-inf"):
                out[t] = scaled[t]
    return out


def _token(r: Rollout, at: int) -> int | None:
    return r.response_ids[at] if at < len(r.response_ids) else None


def _sampled(r: Rollout, at: int) -> bool:
    return at < len(r.response_mask) and bool(r.response_mask[at])


def _last_logits(model: torch.nn.Module, context: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The next-token logits after `context` under the engine's numerics for weights of `dtype`."""
    decoder = model.get_decoder()
    ids = torch.tensor([context])
    with compute(dtype, "cpu"):
        hidden = decoder(inputs_embeds=embeddings(decoder, ids, dtype), use_cache=False).last_hidden_state[0, -1]
    return LogitHead.of(model)(hidden[None])[0]
