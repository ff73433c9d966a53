"""The verl boundary without a cluster: sampling dicts and TokenOutputs both ways, and compute_score."""

from __future__ import annotations

import pytest

pytest.importorskip("verl.workers.rollout.replica", reason="verl is an optional extra: pip install 'srt-agent[verl]'")

from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from srt_agent.engine import RequestOutput, SamplingParams  # noqa: E402
from srt_agent.engine.params import RequestMetrics  # noqa: E402
from srt_agent.integrations.verl.reward import compute_score  # noqa: E402
from srt_agent.integrations.verl.wire import (  # noqa: E402
    from_token_output,
    from_verl_sampling,
    to_token_output,
    to_verl_sampling,
)


def test_sampling_params_round_trip_through_verls_dict():
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=0, max_tokens=33, seed=5, stop=["</code>"], stop_token_ids=[2]
    )
    sent = to_verl_sampling(params)
    assert sent["top_k"] == -1 and sent["logprobs"] is True and sent["repetition_penalty"] == 1.0
    assert from_verl_sampling(sent, default_max_tokens=99) == params
    # verl's own agent loops send only these keys; max_tokens then defaults to the response length
    got = from_verl_sampling(
        {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}, 64
    )
    assert (got.max_tokens, got.top_k, got.seed) == (64, 0, None)
    assert from_verl_sampling({"max_new_tokens": 7}, 64).max_tokens == 7


def test_sampling_the_engine_cannot_honour_is_an_error():
    with pytest.raises(ValueError, match="repetition_penalty"):
        from_verl_sampling({"repetition_penalty": 1.1}, 8)
    with pytest.raises(ValueError, match="presence_penalty"):
        from_verl_sampling({"presence_penalty": 0.5}, 8)
    with pytest.raises(ValueError, match="temperature"):
        from_verl_sampling({"temperature": -1}, 8)


def test_token_outputs_carry_tokens_logprobs_errors_and_draft_statistics():
    metrics = RequestMetrics(forwards=3, draft_proposed=8, draft_accepted=4, tokens=7)
    out = RequestOutput("r", [5, 6, 7], [-0.1, -0.2, -0.3], "stop", stop_reason="</code>", metrics=metrics)
    sent = to_token_output(out, global_steps=4)
    assert sent.stop_reason == "completed" and sent.extra_fields["global_steps"] == 4
    assert sent.extra_fields["srt_draft_accepted"] == 4
    back = from_token_output("r", sent)
    assert (back.token_ids, back.logprobs, back.finish_reason, back.metrics) == (
        [5, 6, 7],
        [-0.1, -0.2, -0.3],
        "stop",
        metrics,
    )
    failed = from_token_output("r", to_token_output(RequestOutput("r", [], [], "error", error="prompt too long")))
    assert failed.finish_reason == "error" and failed.error == "prompt too long"
    # another backend's output (vLLM): no srt fields, an abort becomes an error
    vllm = from_token_output("r", TokenOutput(token_ids=[1, 2], log_probs=[-1.0, -2.0], stop_reason="completed"))
    assert vllm.finish_reason == "stop" and vllm.metrics.tokens == 2 and vllm.error is None
    assert from_token_output("r", TokenOutput(token_ids=[], stop_reason="aborted")).finish_reason == "error"
    assert "log-probs" in from_token_output("r", TokenOutput(token_ids=[1, 2], log_probs=[-1.0])).error


@pytest.mark.parametrize(
    "solution, turns, expected",
    [
        ("so \\boxed{42}", 2, {"score": 1.0, "acc": 1.0, "pred": "42"}),
        ("so \\boxed{42}", 12, {"score": 1.0, "acc": 1.0, "pred": "42"}),
        ("so \\boxed{41}", 2, {"score": -1.0, "acc": 0.0, "pred": "41"}),
        ("so \\boxed{41}", 6, {"score": -0.8, "acc": 0.0, "pred": "41"}),  # two tool calls earn 0.2 back
        ("no answer", 30, {"score": -0.6, "acc": 0.0, "pred": ""}),
        ("so \\boxed{41}", None, {"score": -1.0, "acc": 0.0, "pred": "41"}),  # no turn count: no shaping
    ],
)
def test_compute_score_has_verls_signature_and_retools_shaping(solution, turns, expected):
    extra = {} if turns is None else {"num_turns": turns}
    got = compute_score(data_source="srt_agent/arithmetic", solution_str=solution, ground_truth="42", extra_info=extra)
    assert got == pytest.approx(expected)
    assert compute_score("x", "\\boxed{41}", "42", {"num_turns": 6}, turn_shaping=False)["score"] == -1.0
