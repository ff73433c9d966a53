"""Identity that can be checked (`rl/identity.py`): each first differing token of two runs that should be
identical is recomputed in float64 from the same weights and judged a near-tie, a fault or a difference in
forced tokens; a fault fails an exact comparison."""

from __future__ import annotations

import pytest
import torch

from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.models import tiny_random_model
from srt_agent.rl.identity import Rollout, Sampling, explain_pairs, faults, first_difference
from srt_agent.runner.sampler import uniforms

PROMPT = [1, 2, 3]
SEED = 5
AT = 4  # the response index the tests change


@pytest.fixture(scope="module")
def sampled():
    """A float32 tiny model and one trajectory it sampled (8 tokens, T = 1)."""
    loaded = tiny_random_model("llama", seed=0, dtype=torch.float32)
    engine = Engine(loaded, EngineOptions(drafter="none", device="cpu", max_batch=1, max_context=64, calibrate=False))
    (out,) = engine.generate([PROMPT], SamplingParams(temperature=1.0, seed=SEED, max_tokens=8, ignore_eos=True))
    return loaded, Rollout(PROMPT, list(out.token_ids), [1] * len(out.token_ids), SEED)


def _with(r: Rollout, token: int, mask: int = 1, seed: int | None = SEED) -> Rollout:
    ids = list(r.response_ids[:AT]) + [token]
    return Rollout(r.prompt_ids, ids, list(r.response_mask[:AT]) + [mask], seed)


def _scores(model: torch.nn.Module, r: Rollout) -> torch.Tensor:
    """The float64 perturbed scores of the row at response index AT (as the sampler draws it)."""
    exact = _copy64(model)
    context = torch.tensor([list(r.prompt_ids) + list(r.response_ids[:AT])])
    logits = exact(context).logits[0, -1]
    u = uniforms([(SEED, len(r.prompt_ids) + AT)], logits.shape[-1], torch.float32).double()[0]
    return logits - torch.log(-torch.log(u))


def _copy64(model):
    import copy

    return copy.deepcopy(model).double().eval()


def test_identical_rollouts_have_no_difference(sampled):
    loaded, truth = sampled
    assert first_difference(truth, truth) is None
    assert explain_pairs(loaded.model, [(truth, truth)], Sampling(), torch.float32) == []


def test_a_token_the_exact_sampler_does_not_draw_is_a_fault(sampled):
    loaded, truth = sampled
    with torch.no_grad():
        worst = int(_scores(loaded.model, truth).argmin())
    (diff,) = explain_pairs(loaded.model, [(truth, _with(truth, worst))], Sampling(), torch.float32)
    assert diff.kind == "fault" and diff.position == len(PROMPT) + AT and diff.tokens == (truth.response_ids[AT], worst)
    assert diff.below_best > 1.0 > diff.tolerance
    assert faults([diff]) == [diff]


def test_a_token_within_the_float_error_of_the_best_is_a_near_tie(sampled):
    """The head row of the runner-up is moved until its perturbed score sits 1e-9 below the sampled token's:
    either token is what a float32 computation of that row may pick."""
    loaded, truth = sampled
    model = _copy64(loaded.model).float()
    with torch.no_grad():
        scores = _scores(model, truth)
        best, runner_up = scores.topk(2).indices.tolist()
        assert best == truth.response_ids[AT]
        context = torch.tensor([PROMPT + list(truth.response_ids[:AT])])
        hidden = _copy64(model).model(context).last_hidden_state[0, -1]
        lift = float(scores[best] - scores[runner_up]) - 1e-9
        head = model.lm_head.weight
        head[runner_up] += (lift * hidden / hidden.dot(hidden)).float()
    (diff,) = explain_pairs(model, [(truth, _with(truth, runner_up))], Sampling(), torch.float32)
    assert diff.kind == "near-tie", diff
    assert diff.gap <= diff.tolerance < 1e-3
    assert faults([diff]) == []


def test_forced_tokens_that_differ_are_an_observation_and_other_breaks_are_faults(sampled):
    loaded, truth = sampled
    other = (truth.response_ids[AT] + 1) % 256
    forced = explain_pairs(
        loaded.model, [(_with(truth, 7, mask=0), _with(truth, 9, mask=0))], Sampling(), torch.float32
    )
    assert [d.kind for d in forced] == ["observation"]
    kinds = [
        d.kind
        for d in explain_pairs(
            loaded.model,
            [
                (truth, _with(truth, other, mask=0)),  # one side forced a token where the other sampled
                (truth, _with(truth, other, seed=SEED + 1)),  # not the same request
                (truth, Rollout(PROMPT, truth.response_ids[:AT], truth.response_mask[:AT], SEED)),  # one ends early
            ],
            Sampling(),
            torch.float32,
        )
    ]
    assert kinds == ["fault", "fault", "fault"]
