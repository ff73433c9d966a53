"""verifiers (>= 0.4) environments through the OpenAI-compatible server: ``env: verifiers:<taskset id>``.

The example (examples/vf_calculator: arithmetic rows shipped in the module, an MCP calculator tool, a
\\boxed{} reward) is trained for a step and evaluated on the tiny random model; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srt_agent.agent.hermes import parse_tool_calls
from srt_agent.config import EnvConfig

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_hermes_tool_calls_become_openai_tool_calls():
    ids = iter(["call_a", "call_b"])
    text = 'Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'
    content, calls = parse_tool_calls(text, lambda: next(ids))
    assert content == "Let me compute."
    assert calls == [
        {"id": "call_a", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2+3"}'}}
    ]
    assert parse_tool_calls("no calls <tool_call>not json</tool_call>", lambda: "x") == (
        "no calls <tool_call>not json</tool_call>",
        [],
    )


@pytest.fixture
def vf_examples(monkeypatch):
    pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install 'srt-agent[verifiers]')")
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_a_verifiers_env_config_brings_its_own_tasks(vf_examples):
    config = EnvConfig(env="verifiers:vf_calculator", env_options={"num_tasks": 3})
    assert config.episode_source().name == config.dataset.task_source().name == "verifiers"
    tasks = config.dataset.tasks()
    assert [t.ground_truth for t in tasks] == ["449", "186", "43"]
    assert tasks[0].prompt[0]["role"] == "system" and tasks[0].prompt[1]["content"] == "What is 37 * 12 + 5?"
    assert tasks[1].extra_info["vf_idx"] == 1 and tasks[1].data_source == "verifiers/vf_calculator"
    with pytest.raises(ValueError, match="not both"):
        EnvConfig(env="verifiers:vf_calculator", agent="m:agent")
    with pytest.raises(ValueError, match="own tasks"):
        EnvConfig(env="verifiers:vf_calculator", dataset={"source": "data.jsonl"})


def test_the_shipped_verifiers_env_file_validates(vf_examples):
    from srt_agent.config import load_env_config

    config = load_env_config(EXAMPLES.parent / "envs" / "vf_calculator.yaml")
    assert config.dataset.source == "verifiers:vf_calculator" and len(config.dataset.tasks()) == 8


def test_train_and_eval_a_verifiers_env_on_the_tiny_model(vf_examples, tmp_path):
    from srt_agent.models import load_tokenizer, tiny_random_model
    from srt_agent.rl.policy_eval import run_eval
    from srt_agent.rl.trainer import Trainer

    env = tmp_path / "vf.yaml"
    env.write_text(
        "name: vf\nenv: verifiers:vf_calculator\nenv_options: {num_tasks: 4}\nmodel: tiny-llama\n"
        "n_samples: 2\nmax_tokens_per_turn: 8\nmax_response_tokens: 200\n"
        "sampling: {temperature: 1.0, seed: 3}\nengine: {max_batch: 8, max_context: 1024, calibrate: false}\n"
        "cold_start: {enabled: false, eval_tasks: 0}\n"
        "train: {steps: 1, prompts_per_step: 2, lr: 0.001, micro_batch_tokens: 512}\n"
    )
    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    report = Trainer.from_env_file(env, tmp_path / "run", loaded=tiny).run()
    (step,) = report["steps"]
    assert step["srt/model_tokens"] > 0
    assert step["training/rollout_logprob_diff_mean"] < 1e-4  # the server's tokens, exactly on-policy
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert row["error"] is None, row["error"]
        assert row["reward"] in (0.0, 1.0) and row["response_mask"][0] == 1
        assert len(row["response_ids"]) == len(row["response_mask"])

    from srt_agent.config import load_env_config

    out = run_eval(load_env_config(env), tmp_path / "eval", n=2, loaded=tiny)
    assert (tmp_path / "eval" / "report.json").exists()
    assert json.dumps(out)
