"""The tool-calling env (examples/tool_agent.py, envs/openai_tools.yaml): OpenAI tools on a template that
cannot express them (SmolLM2's ChatML) as Hermes text, its cold-start traces tokenized exactly as the
server tokenizes the agent's session, the calls recorded on the trajectory, and the traces file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from srt_agent.agent import load_env_config
from srt_agent.agent.hermes import ChatFormat, call_text, parse_tool_calls
from srt_agent.agent.trajectory import Trajectory
from srt_agent.models import cache_root
from srt_agent.rl.traces import load_message_traces, tool_chat_sample, turn_end_token
from srt_agent.serve.sessions import Session, normalize_messages
from srt_agent.sources.arithmetic import arithmetic_tasks
from srt_agent.tools.local import bwrap_path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "envs" / "openai_tools_traces.jsonl"


def load_example():
    spec = importlib.util.spec_from_file_location("tool_agent", ROOT / "examples" / "tool_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load_example()


@pytest.fixture(scope="module")
def rows():
    return [json.loads(line) for line in TRACES.read_text().splitlines()]


def test_chatml_gets_the_tools_and_calls_as_hermes_text(smollm2_tokenizer, example):
    chat = ChatFormat.of(smollm2_tokenizer)
    assert chat.writes_tools and chat.writes_calls  # SmolLM2's template would drop both
    prompt = chat.prompt([{"role": "user", "content": "2+2?"}], [example.TOOL])
    assert "<tools>\n" + json.dumps(example.TOOL) + "\n</tools>" in prompt and "<tool_call>" in prompt
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    (written,) = chat.messages([{"role": "assistant", "content": "Let me.", "tool_calls": [call]}], None)
    assert written == {
        "role": "assistant",
        "content": 'Let me.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    }
    content, calls = parse_tool_calls(written["content"], lambda: "id")
    assert content == "Let me." and calls == [{**call, "id": "id"}]


def test_a_template_that_renders_tools_is_left_to_render_them(smollm2_tokenizer, example):
    tok = type(smollm2_tokenizer).from_pretrained(smollm2_tokenizer.name_or_path)
    tok.chat_template = (
        "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
        "{% for c in m.get('tool_calls') or [] %} CALL {{ c['function']['name'] }}{% endfor %}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    chat = ChatFormat.of(tok)
    assert not chat.writes_tools and not chat.writes_calls
    messages = [{"role": "user", "content": "q"}]
    assert chat.prompt(messages, [example.TOOL]) == tok.apply_chat_template(
        messages, tools=[example.TOOL], tokenize=False, add_generation_prompt=True
    )


def test_a_trace_is_tokenized_as_the_server_tokenizes_the_agents_session(smollm2_tokenizer, example, rows):
    """The session of the trace's conversation, its model turns given: the server's first prompt, what it
    inserts after the tool call, and the turns' tokens are the trace sample's, token for token."""
    tok = smollm2_tokenizer
    end = turn_end_token(tok, [tok.convert_tokens_to_ids("<|im_end|>")])
    row = rows[0]
    sample = tool_chat_sample(row["messages"], row["tools"], tok, end)
    chat, tools = ChatFormat.of(tok), row["tools"]

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    opening, first_call, result, final = row["messages"][:2], *row["messages"][2:]
    session = Session("trace")
    turn = session.plan_chat(chat, normalize_messages(opening), tools, encode)
    assert turn.new_branch and turn.prompt_ids == sample.prompt_ids
    branch = Trajectory(request_id=turn.request_id, task_index=0, sample_index=0, prompt_ids=turn.prompt_ids)
    sampled = encode(call_text(first_call["tool_calls"][0])) + [end]  # the model writes its call, then ends its turn
    branch.append(sampled, [-0.1] * len(sampled))
    branch.num_turns, session.branches, session.closed_by_eos = 1, [branch], tok.decode([end])
    content, calls = parse_tool_calls(tok.decode(sampled, skip_special_tokens=True), lambda: "call_srt")
    reply = {"role": "assistant", "content": content, "tool_calls": calls}
    session.record_chat(turn, normalize_messages(opening), tools, reply, None)
    assert [(c.name, c.arguments, c.status) for c in branch.tool_calls] == [
        ("code_interpreter", json.loads(first_call["tool_calls"][0]["function"]["arguments"]), "requested")
    ]

    resent = {"role": "assistant", "tool_calls": [{**calls[0], "id": "call_rewritten"}]}  # as an agent echoes it
    second = normalize_messages(opening + [resent, result])
    turn = session.plan_chat(chat, second, tools, encode)
    assert (
        not turn.new_branch
        and turn.prompt_ids == sample.prompt_ids + sample.response_ids[: len(turn.prompt_ids) - len(sample.prompt_ids)]
    )
    trained = [t for t, m in zip(sample.response_ids, sample.response_mask) if m]
    assert (
        sampled == trained[: len(sampled)]
        and turn.forced_ids == sample.response_ids[len(sampled) : len(sampled) + len(turn.forced_ids)]
    )
    assert encode(final["content"]) + [end] == trained[len(sampled) :]
    session.record_chat(turn, second, tools, {"role": "assistant", "content": final["content"]}, None)
    assert branch.tool_calls[0].status == "ok" and branch.tool_calls[0].output == result["content"]


def test_the_env_and_its_traces_load(smollm2_tokenizer, rows):
    config = load_env_config(ROOT / "envs" / "openai_tools.yaml")
    assert (
        config.episode_source().name == "agent_function"
        and Path(config.cold_start.source) == TRACES
        and config.cold_start.n == len(rows) == 96
    )
    end = turn_end_token(smollm2_tokenizer, [smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")])
    samples = load_message_traces(TRACES, smollm2_tokenizer, end)
    assert len(samples) == 96 and all(s.trained_tokens > 0 and 0 in s.response_mask for s in samples)


@pytest.mark.skipif(bwrap_path() is None, reason="machine: bubblewrap (bwrap) is not installed")
def test_the_traces_are_the_example_conversations_whose_code_ran(example, rows):
    """The file is what `tool_agent.py --write-traces` writes: each task's own solution as the model's call,
    run in the sandbox, its output the right answer (checked on the first 12)."""
    tasks = arithmetic_tasks(12, seed=1000)
    assert [example.trace(t) for t in tasks] == rows[:12]
    for task, row in zip(tasks, rows):
        assert (
            row["messages"][-2]["content"] == task.ground_truth
            and example.answer(row["messages"][-1]["content"]) == task.ground_truth
        )


@pytest.mark.skipif(bwrap_path() is None, reason="machine: bubblewrap (bwrap) is not installed")
def test_the_env_file_trains_one_step_on_the_tiny_model(tmp_path, monkeypatch):
    """`srt-agent train envs/openai_tools.yaml` with its own settings but the model and the sizes: the cold
    start on the shipped traces, the held-out reports, one GRPO step through the server, identical to
    `--compare none`."""
    from typer.testing import CliRunner

    from srt_agent.cli import app

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(cache_root() / "models")
    monkeypatch.setenv("SRT_AGENT_CACHE_DIR", str(tmp_path / "cache"))  # a cold start of its own
    out = tmp_path / "run"
    small = {
        "n_samples": 2, "train.prompts_per_step": 2, "train.micro_batch_tokens": 512, "max_tokens_per_turn": 8,
        "cold_start.epochs": 1, "cold_start.eval_tasks": 2, "engine.calibrate": "false", "engine.max_batch": 8,
    }  # fmt: skip
    sets = [arg for key, value in small.items() for arg in ("--set", f"{key}={value}")]
    args = ["train", str(ROOT / "envs" / "openai_tools.yaml"), "--out", str(out), "--model", "tiny-llama"]
    result = CliRunner().invoke(app, [*args, "--steps", "1", "--compare", "none", *sets])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["cold_start"]["traces"] == 96 and report["cold_start"]["after"]["trajectories"] == 2
    (step,) = report["steps"]
    assert step["compare/none/identical"] == 1.0 and step["rollout/sampled_tokens"] > 0
