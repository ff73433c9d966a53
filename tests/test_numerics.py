"""One precision story from sampler to trainer (`runner/numerics.py`): in bfloat16 the engine and the trainer
compute alike (float32 residual stream and LM head, the trainer's float32 masters cast as the engine holds
them), and with exact attention a sampled token's log-probability is the trainer's to float32 precision."""

from __future__ import annotations

import pytest
import torch
from helpers.scripted_drafter import ScriptedDrafter

from srt_agent.engine import Engine, EngineOptions
from srt_agent.engine.params import SamplingParams
from srt_agent.models import tiny_random_model
from srt_agent.rl.batch import Sample
from srt_agent.rl.policy import Policy, master_copy
from srt_agent.rl.update import logprob_mismatch, score_samples
from srt_agent.runner.numerics import choose_exact_attention, linears_batch_invariant

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [9, 8, 7, 6, 5, 4]]

pytestmark = pytest.mark.usefixtures("one_thread")


def _model():
    return tiny_random_model("llama", vocab_size=512, hidden_size=128, num_layers=4, seed=3, dtype=torch.float32)


def _engine(loaded, drafter, batch_invariant: bool, **options) -> Engine:
    return Engine(
        loaded,
        EngineOptions(
            drafter=drafter,
            device="cpu",
            max_batch=3,
            max_context=128,
            calibrate=False,
            dtype="bfloat16",
            batch_invariant=batch_invariant,
            **options,
        ),
    )


def _rollouts(loaded, batch_invariant: bool, drafter: str = "none") -> list[Sample]:
    engine = _engine(loaded, drafter, batch_invariant)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=24, seed=11, ignore_eos=True))
    return [Sample(p, o.token_ids, [1] * len(o.token_ids), o.logprobs) for p, o in zip(PROMPTS, outs)]


def _gap(loaded, masters, samples, exact: bool) -> dict[str, float]:
    policy = Policy(loaded.model, compute_dtype=torch.bfloat16, exact_attention=exact, masters=masters)
    logprobs, _ = score_samples(policy, samples, 4096)
    return logprob_mismatch(samples, logprobs)


def test_bfloat16_rollouts_and_the_trainers_scores_agree_to_float32_precision_with_exact_attention():
    loaded = _model()
    masters = master_copy(loaded.model)  # before the engine casts the module
    samples = _rollouts(loaded, batch_invariant=True)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    gap = _gap(loaded, masters, samples, exact=True)
    assert gap["training/rollout_logprob_diff_max"] < 1e-5, gap


def test_the_masters_keep_what_bfloat16_cannot_hold():
    loaded = _model()
    masters = master_copy(loaded.model)
    _rollouts(loaded, batch_invariant=False)
    policy = Policy(loaded.model, compute_dtype=torch.bfloat16, masters=masters)
    for name, tensor in policy.base.state_dict().items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, masters[name]), name  # not the engine's rounded copy
    assert any(not torch.equal(masters[n], p.float()) for n, p in loaded.model.state_dict().items())


def test_the_trainers_gradients_reach_the_float32_masters_through_the_cast():
    loaded = _model()
    policy = Policy(loaded.model, compute_dtype=torch.bfloat16)
    assert policy.cast
    samples = [Sample([1, 2, 3], [4, 5, 6, 7], [1, 1, 1, 1], [-1.0] * 4)]
    from srt_agent.rl.batch import pack

    scores = policy.score(pack(samples, 4096)[0])
    assert scores.logprobs.dtype == torch.float32
    scores.logprobs.sum().backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("mode", ["right", "tree"])
def test_speculation_emits_plain_decodings_tokens_in_bfloat16_with_exact_attention(mode):
    """With the batch-invariant numerics a drafted position's hidden state is its plain decoding's bits: verified
    drafts (accepted and rejected nodes of one tree) give plain decoding's tokens and log-probabilities."""
    plain = _rollouts(_model(), batch_invariant=True)
    drafter = ScriptedDrafter([s.prompt_ids + s.response_ids for s in plain], mode, 512)
    engine = _engine(_model(), drafter, True, adaptive_drafts=False)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=24, seed=11, ignore_eos=True))
    assert engine.stats()["draft_accepted"] > 0
    for sample, out in zip(plain, outs):
        assert out.token_ids == sample.response_ids
        # the same up to the float32 head's sums, which a CPU orders by the number of rows (~1e-6)
        assert out.logprobs == pytest.approx(sample.engine_logprobs, abs=1e-5)


class _RowCountLinear(torch.nn.Linear):
    """A linear whose result depends on how many rows it gets (as a kernel chosen by shape may)."""

    def forward(self, x):
        return super().forward(x) + 1e-3 * x.reshape(-1, x.shape[-1]).shape[0]


def test_auto_turns_exact_attention_on_only_where_the_linears_are_batch_invariant():
    model = _model().model
    assert choose_exact_attention(True, model, torch.device("cpu"))
    assert not choose_exact_attention(False, model, torch.device("cpu"))
    first = model.model.layers[0].self_attn.q_proj
    first.__class__ = _RowCountLinear
    assert not linears_batch_invariant(model, torch.device("cpu"))
    assert not choose_exact_attention("auto", model, torch.device("cpu"))
