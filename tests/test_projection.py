"""The GPU projection of a run's rollouts: known rollouts give known tokens per forward, a device twice as fast
halves a bandwidth-bound projection, the roofline's bytes and FLOPs, the projection's lines, and `bench project`
on verl's dumps."""

from __future__ import annotations

import json
import random

import pytest

from srt_agent.bench.project import project_run
from srt_agent.rl.projection import ProjectionSettings, project, projection_lines, run_projection
from srt_agent.rl.rollout_trace import RolloutTrace, TracedRunAhead, TracedStep, TracedTrajectory
from srt_agent.rl.roofline_cost import DEVICES, GPU, RooflineCost, device, load_model_config, model_shape

TURN = 40  # tokens of the one recorded turn
K = 7  # draft tokens per step: a repeated turn is verified 8 tokens per forward


def repeated_trace(steps: int = 2, rows: int = 1) -> RolloutTrace:
    """`rows` single-turn trajectories of one prompt that write the same distinct tokens every step."""
    rng = random.Random(0)
    tokens = rng.sample(range(1000, 5000), TURN)
    prompt = [1, 2, 3, 4]
    trace = RolloutTrace(
        "srt",
        "srt",
        limits=dict(max_tokens_per_turn=TURN, max_response_tokens=TURN),
        engine=dict(max_batch=8, max_context=256, max_draft_tokens=K, min_draft_gain=0.1, adaptive_drafts=True),
        cache={},
    )
    for step in range(1, steps + 1):
        trajs = [TracedTrajectory("p", prompt, [list(tokens)], [], [], forwards=TURN) for _ in range(rows)]
        trace.steps.append(TracedStep(step, trajs, {}, wall_s=1.0))
    return trace


def test_known_rollouts_give_the_known_tokens_per_forward():
    result = project(repeated_trace(), ProjectionSettings(host_us_per_row=0.0))
    methods = result["methods"]
    assert methods["none"]["tokens_per_forward"] == 1.0
    # SRT: the first step has no tree (one token per forward); the second step's turn repeats the first, so
    # every forward verifies a draft of K tokens and keeps K + 1: TURN / (K + 1) forwards.
    assert [s["forwards"] for s in methods["srt"]["steps"]] == [TURN, TURN // (K + 1)]
    assert methods["srt"]["tokens_per_forward"] == pytest.approx(2 * TURN / (TURN + TURN // (K + 1)))
    assert methods["srt"]["gen_s"] < methods["none"]["gen_s"]
    assert set(methods) == {"none", "srt", "suffix"}  # no run-ahead recorded: no srt+run-ahead


def test_a_device_twice_as_fast_halves_a_bandwidth_bound_projection():
    h100 = DEVICES["H100"]
    twice = GPU("2xH100", 2 * h100.bandwidth_gb_s, 2 * h100.bf16_tflops)
    trace = repeated_trace(rows=2)
    slow = project(trace, ProjectionSettings(device=h100, fixed_ms=0.0, host_us_per_row=0.0))
    fast = project(trace, ProjectionSettings(device=twice, fixed_ms=0.0, host_us_per_row=0.0))
    for method in ("none", "srt", "suffix"):
        assert fast["methods"][method]["gen_s"] == pytest.approx(slow["methods"][method]["gen_s"] / 2, rel=1e-9)
    _, shape = load_model_config()
    cost = RooflineCost(h100, shape, fixed_s=0.0)
    assert RooflineCost(twice, shape, fixed_s=0.0).seconds([(1, 512)] * 8) == pytest.approx(
        cost.seconds([(1, 512)] * 8) / 2
    )
    # Host time per row adds to each step, or hides under the device's work when it overlaps.
    assert RooflineCost(h100, shape, host_s_per_row=1e-5).seconds([(1, 0)] * 4) == pytest.approx(
        RooflineCost(h100, shape).seconds([(1, 0)] * 4) + 4e-5
    )
    overlap = RooflineCost(h100, shape, host_s_per_row=1e-5, overlap_host=True)
    assert overlap.seconds([(1, 0)] * 4) == RooflineCost(h100, shape).seconds([(1, 0)] * 4)


def test_the_model_shape_comes_from_its_config(tmp_path):
    name, shape = load_model_config()
    assert name == "Qwen2.5-1.5B"
    assert shape.layer_bytes + shape.head_bytes == pytest.approx(3.09e9, rel=0.01)  # 1.54 B parameters in bf16
    assert shape.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2  # keys and values, 28 layers, 2 KV heads of 128
    nbytes, flops = shape.step(sequences=1, tokens=1, context=0)
    assert flops == 2 * (shape.layer_params + shape.head_params) + 2 * shape.attention_macs_per_key
    assert nbytes == shape.layer_bytes + shape.head_bytes + shape.kv_bytes_per_token
    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    assert load_model_config(tmp_path / "config.json") == (tmp_path.name, model_shape({**config, "vocab_size": 100}))
    with pytest.raises(ValueError, match="not a model config"):
        load_model_config(tmp_path / "missing.json")
    assert device("h200").name == "H200"
    with pytest.raises(ValueError, match="unknown device"):
        device("TPU")


def test_the_projection_line_and_a_failure_that_never_raises():
    trace = repeated_trace()
    result = run_projection({"srt": trace}, "srt")
    line, validation = projection_lines(result)
    assert line.startswith("projected on H100 (Qwen2.5-1.5B shape): none ")
    assert ", srt " in line and "x), suffix " in line
    assert "no measured step-cost table" in validation  # the synthetic trace recorded none
    failed = run_projection({"srt": trace}, "srt", ProjectionSettings(device="TPU"))
    assert "unknown device" in failed["error"]
    assert projection_lines(failed) == [f"projection failed: {failed['error']}"]


class CharTokenizer:
    """A tokenizer of one token per character (verl's dumps are text)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_bench_project_reads_verl_dumps(tmp_path):
    answer = "".join(chr(0x4E00 + i) for i in range(TURN))  # distinct tokens, the same answer every step
    for step in (1, 2):
        rows = [{"input": "What is 6 * 7?", "output": answer, "score": 1.0, "step": step}]
        (tmp_path / f"{step}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match="--tokenizer"):
        project_run(tmp_path, ProjectionSettings())
    result = project_run(tmp_path, ProjectionSettings(host_us_per_row=0.0), CharTokenizer())
    assert result["variant"] == "verl" and result["validation"]["skipped"] == {
        "verl": "its backend recorded no measured step-cost table"
    }
    srt = result["methods"]["srt"]
    assert result["methods"]["none"]["tokens_per_forward"] == 1.0 and srt["tokens_per_forward"] > 1.5
    assert [s["step"] for s in srt["steps"]] == [1, 2]


def test_run_ahead_is_projected_where_the_run_recorded_it():
    trace = repeated_trace(steps=2, rows=2)
    trace.run_ahead = {"slack": 5.0, "tokens_per_sequence": 8}
    trace.steps[0].run_ahead = [TracedRunAhead("p", [1, 2, 3, 4], trace.steps[1].trajectories[0].turns[0])]
    methods = project(trace, ProjectionSettings(host_us_per_row=0.0))["methods"]
    assert set(methods) == {"none", "srt", "srt+run-ahead", "suffix"}
    assert methods["srt+run-ahead"]["decode_s"] > 0
