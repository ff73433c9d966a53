"""One GRPO run of the trainer on the tiny env, shared by every test here: 3 steps (4 prompts, 2 a step, so
step 3 revisits), `none` compared, a KL loss, held-out tasks before and after, one success per group.
Each test checks one thing the run trains, reports or writes."""

from __future__ import annotations

import io
import json

import pytest
import torch
from helpers.rl_envs import one_success_per_group, rollouts, tiny_env_file
from rich.console import Console

from srt_agent.bench.headroom import headroom
from srt_agent.bench.project import project_run
from srt_agent.config import load_env_config
from srt_agent.models import load_tokenizer, tiny_random_model
from srt_agent.rl.checkpoint import load_checkpoint
from srt_agent.rl.evaluate import wilson_interval
from srt_agent.rl.projection import ProjectionSettings
from srt_agent.rl.rollout_trace import RolloutTrace
from srt_agent.rl.trainer import Trainer

STEPS = 3
HELD_OUT = 4
TRAIN = {"steps": STEPS, "prompts_per_step": 2, "lr": 1e-3, "micro_batch_tokens": 256, "kl_coef": 0.01}
# GRPO's advantages of a group scoring {1, 0, 0}: (score - 1/3) / (std + 1e-6), std = sqrt(1/3).
SUCCESS_ADVANTAGE = (2 / 3) / (3**-0.5 + 1e-6)
FAILURE_ADVANTAGE = -(1 / 3) / (3**-0.5 + 1e-6)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run: its report, folder, console output and the tiny model's weights before it."""
    tmp_path = tmp_path_factory.mktemp("grpo-run")
    config = tiny_env_file(tmp_path, **TRAIN)
    config.write_text(config.read_text().replace("eval_tasks: 0", f"eval_tasks: {HELD_OUT}"))
    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    buffer = io.StringIO()
    console = Console(file=buffer, width=400, color_system=None)
    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as patch:
        one_success_per_group(patch)
        report = Trainer(load_env_config(config).for_run(compare=["none"]), out, loaded=tiny, console=console).run()
    return {"report": report, "out": out, "output": buffer.getvalue(), "before": before, "after": tiny}


@pytest.fixture(scope="module")
def steps(run):
    return run["report"]["steps"]


def test_every_step_is_reported_and_labelled_a_first_visit_or_a_revisit(steps):
    assert [m["step"] for m in steps] == [1.0, 2.0, 3.0]
    assert [m["training/revisit"] for m in steps] == [0.0, 0.0, 1.0]


def test_the_runs_memory_peak_is_reported(run):
    memory = run["report"]["memory"]
    assert memory["peak_gb"] >= memory["at"]["engines started"] > 0
    assert json.loads((run["out"] / "report.json").read_text())["memory"] == memory


def test_the_compared_drafter_reproduces_the_training_tokens(run, steps):
    for m in steps:  # exact drafters, a float64 model: no near-tie flips
        assert m["compare/none/identical"] == 1.0
        assert m["compare/none/gen_s"] > 0 and m["timing_s/gen"] > 0
    assert json.loads((run["out"] / "report.json").read_text())["totals"]["identical_vs_none"] == 1.0


def test_each_step_reports_its_tail(steps):
    for m in steps:  # engine steps with at most 4 sequences running
        for prefix in ("srt", "compare/none"):
            assert 0 <= m[f"{prefix}/tail_share"] <= 1 and m[f"{prefix}/tail_tok_s"] > 0


def test_every_trajectory_runs_the_forced_tool_call_and_siblings_share_the_prompt(steps):
    for m in steps:
        assert m["env/tool_call_rate"] == 1.0
        assert m["srt/forced_tokens"] > 0
        assert m["srt/prefill_reused"] > 0  # siblings copy their group's prompt KV instead of computing it


def test_the_trainer_scores_what_the_engine_sampled(steps):
    for m in steps:
        assert m["training/rollout_logprob_diff_mean"] < 1e-4
        assert m["perf/trained_tokens"] == m["srt/model_tokens"]


def test_grpo_advantages_of_one_success_per_group(steps):
    for m in steps:
        assert m["critic/score/mean"] == pytest.approx(1 / 3)
        assert m["critic/advantages/max"] == pytest.approx(SUCCESS_ADVANTAGE)
        assert m["critic/advantages/min"] == pytest.approx(FAILURE_ADVANTAGE)


def test_the_kl_loss_is_zero_at_the_reference_then_positive(steps):
    assert steps[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-12)  # step 1's policy is the reference
    assert steps[1]["actor/kl_loss"] > 1e-9


def test_the_engine_gets_the_new_weights_in_memory(run):
    after = run["after"].model.state_dict()
    assert any(not torch.equal(run["before"][k], v) for k, v in after.items())


def test_forced_tool_tokens_are_masked_out_of_training(run):
    rows = rollouts(run["out"], 2)
    assert len(rows) == 6
    for row in rows:  # the code call and the interpreter's output
        assert row["response_mask"][0] == 0 and 1 in row["response_mask"]
        assert all(lp == 0.0 for lp, m in zip(row["response_logprobs"], row["response_mask"]) if m == 0)


def test_the_run_folder_holds_its_files_and_a_checkpoint(run):
    out = run["out"]
    for name in ("report.json", "summary.md", "plots.png"):
        assert (out / name).stat().st_size > 0
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    state, caches = load_checkpoint(out)
    assert state["step"] == STEPS and "srt" in caches and state["reference"] is not None


def test_speedups_over_first_visits_and_revisits_with_an_interval(run, steps):
    totals = run["report"]["totals"]
    for label, chosen in (("first", steps[:2]), ("revisit", steps[2:])):
        expected = sum(m["compare/none/gen_s"] for m in chosen) / sum(m["timing_s/gen"] for m in chosen)
        assert totals[f"speedup_vs_none_{label}"] == pytest.approx(expected, abs=1e-9)
    low, high = totals["speedup_vs_none_interval"]  # resampled steps: the step ratios bound it
    ratios = [m["compare/none/gen_s"] / m["timing_s/gen"] for m in steps]
    assert min(ratios) - 1e-9 <= low <= totals["speedup_vs_none"] <= high <= max(ratios) + 1e-9
    assert totals["speedup_vs_none_revisit_interval"] == [totals["speedup_vs_none_revisit"]] * 2  # one step
    for m in steps:  # our engine samples the same tokens with and without drafts: both ratios agree
        assert m["compare/none/token_speedup"] == pytest.approx(m["compare/none/speedup"], abs=1e-9)


def test_the_closing_story_and_the_summary_tell_the_speed_per_visit(run):
    totals = run["report"]["totals"]
    low = totals["speedup_vs_none_interval"][0]
    output = run["output"]
    assert f"srt vs none (their generation time / ours): all {totals['speedup_vs_none']:.2f}x [{low:.2f}, " in output
    assert "per step: 1 new " in output and ", 3 seen " in output
    summary = (run["out"] / "summary.md").read_text()
    assert "the speed of `none`" in summary
    assert "| step | prompts |" in summary and "| 3 | seen |" in summary and "| 1 | new |" in summary


def test_held_out_figures_before_and_after_rl_carry_their_intervals(run):
    held = run["report"]["held_out"]
    assert list(held) == ["before RL", "after RL"]
    for r in held.values():
        assert r["trajectories"] == HELD_OUT
        for key in ("accuracy", "tool_call_rate", "code_ok_rate"):
            low, high = r["intervals"][key]
            assert low <= r[key] <= high and (low, high) == tuple(wilson_interval(round(r[key] * HELD_OUT), HELD_OUT))
        assert r["intervals"]["mean_reward"][0] <= r["mean_reward"] <= r["intervals"]["mean_reward"][1]
    assert json.loads((run["out"] / "report.json").read_text())["held_out"] == held


def test_held_out_figures_reach_the_summary_and_tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = (run["out"] / "summary.md").read_text()
    assert f"| before RL | {HELD_OUT} |" in summary and f"| after RL | {HELD_OUT} |" in summary
    events = EventAccumulator(str(next((run["out"] / "tensorboard").rglob("events.out.tfevents.*")).parent))
    events.Reload()
    assert [e.step for e in events.Scalars("val/accuracy")] == [0, STEPS]


def test_the_run_projects_its_rollouts_onto_a_gpu_and_validates_the_replay(run):
    """Every run projects its rollouts onto a GPU and checks the replay against its own measured times."""
    projection, out = run["report"]["projection"], run["out"]
    assert projection["device"]["name"] == "H100" and projection["model"]["name"] == "Qwen2.5-1.5B"
    assert set(projection["methods"]) == {"none", "srt", "suffix"}
    assert all(m["gen_s"] > 0 and m["tokens_per_forward"] >= 1 for m in projection["methods"].values())
    assert set(projection["validation"]["variants"]) == {"srt", "none"}
    assert "projected on H100 (Qwen2.5-1.5B shape): none " in (out / "summary.md").read_text()
    assert RolloutTrace.load(out / "traces" / "srt.json").steps[1].cost["shapes"]  # the engine's measured steps
    again = project_run(out, ProjectionSettings(device="A100"))  # `bench project` on the run folder
    assert again["device"]["name"] == "A100" and set(again["validation"]["variants"]) == {"srt", "none"}


def test_each_step_says_what_speculation_cost(steps):
    for m in steps:
        assert m["srt/draft_host_s"] >= 0 and m["srt/rejected_tokens"] >= 0 and m["srt/rejected_s"] >= 0


def test_a_runs_trace_compressed_gives_the_headroom_of_its_rollouts(run, tmp_path):
    """A trace (what ships as ``retool_long``) holds what the run's rollouts hold: headroom reads either."""
    trace = RolloutTrace.load(run["out"] / "traces" / "srt.json")
    packed = trace.save(tmp_path / "srt.json.xz")
    assert RolloutTrace.load(packed) == trace
    from_rollouts, from_trace = headroom(run["out"], k=4), headroom(packed, k=4)
    for a, b in zip(from_rollouts["steps"], from_trace["steps"], strict=True):
        assert (a["revisit"], a["achieved"], a["methods"]) == (b["revisit"], b["achieved"], b["methods"])
