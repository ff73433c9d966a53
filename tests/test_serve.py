"""The OpenAI-compatible rollout server with the real `openai` client, on our engine and a tiny float64 Llama
(SmolLM2's tokenizer and chat template): exact tokens, sessions that only append, streaming, isolation
under concurrent malformed requests, and agents written against the client run through `run_agents`."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import httpx
import openai
import pytest
import torch
from typer.testing import CliRunner

from srt_agent.agent import EnvConfig, Task
from srt_agent.agent.chat import render_prompt
from srt_agent.cli import app
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.models import load_model
from srt_agent.serve import RolloutServer, run_agents
from srt_agent.sources.arithmetic import arithmetic_tasks

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-llama"
CONTEXT = 512


@pytest.fixture(scope="module")
def tiny():
    return load_model(MODEL, dtype=torch.float64, device="cpu")


@pytest.fixture(scope="module")
def server(tiny):
    config = EnvConfig(
        model=MODEL,
        engine={
            "backend": "engine",
            "drafter": "srt",
            "device": "cpu",
            "max_batch": 8,
            "max_context": CONTEXT,
            "calibrate": False,
        },
    )
    server = RolloutServer.from_config(config, loaded=tiny)
    yield server
    server.close()


@pytest.fixture(scope="module")
def url(server):
    with server.running() as url:
        yield url


def client(base_url: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, **options)


def reference(tiny, prompt_ids: list[int], params: SamplingParams):
    """What our engine generates for the same prompt ids and params, outside the server."""
    engine = Engine(tiny, EngineOptions(drafter="srt", device="cpu", max_batch=2, max_context=CONTEXT, calibrate=False))
    return engine.generate([prompt_ids], params)[0]


def test_a_seeded_request_returns_exactly_the_engines_tokens(tiny, url):
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    chat = client(f"{url}/v1").chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, seed=7, temperature=0.8, top_p=0.95, logprobs=True
    )
    prompt_ids = chat.model_extra["prompt_token_ids"]
    assert prompt_ids == tiny.tokenizer.encode(render_prompt(tiny.tokenizer, messages), add_special_tokens=False)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=7, stop_token_ids=tiny.eos_token_ids)
    ref = reference(tiny, prompt_ids, params)
    choice = chat.choices[0]
    assert choice.token_ids == ref.token_ids and len(ref.token_ids) > 0
    assert choice.token_logprobs == pytest.approx(ref.logprobs, abs=1e-9)
    assert [entry.logprob for entry in choice.logprobs.content] == choice.token_logprobs
    assert choice.message.content == tiny.tokenizer.decode(ref.token_ids, skip_special_tokens=True)
    assert chat.usage.prompt_tokens == len(prompt_ids) and chat.usage.completion_tokens == len(ref.token_ids)

    # /v1/completions with token ids: the same tokens again (same prompt, same seed)
    done = client(f"{url}/v1").completions.create(
        model=MODEL, prompt=prompt_ids, max_tokens=16, seed=7, temperature=0.8, top_p=0.95
    )
    assert done.choices[0].token_ids == ref.token_ids
    assert done.choices[0].model_extra["prompt_token_ids"] == prompt_ids
    assert done.choices[0].text == tiny.tokenizer.decode(ref.token_ids)


def turn(c: openai.OpenAI, messages: list[dict], seed: int, **options):
    out = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, seed=seed, **options)
    messages.append(out.choices[0].message.model_dump(exclude_none=True))  # the reply as an agent echoes it
    return out


def test_a_three_turn_session_sends_each_earlier_token_once(server, url):
    c = client(f"{url}/sessions/three-turns/v1")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 2 and 3."}]
    outs = [turn(c, messages, seed=1)]
    messages.append({"role": "tool", "content": "5"})  # a tool's output, rendered by the chat template
    outs.append(turn(c, messages, seed=2))
    messages.append({"role": "user", "content": "And times 4?"})
    outs.append(turn(c, messages, seed=3))

    srt = [o.model_extra["srt"] for o in outs]
    assert [s["new_branch"] for s in srt] == [True, False, False] and {s["branch"] for s in srt} == {0}
    prompts = [o.model_extra["prompt_token_ids"] for o in outs]
    for k in range(2):  # turn k's tokens, then only the new messages' tokens
        before = prompts[k] + outs[k].choices[0].token_ids
        assert prompts[k + 1][: len(before)] == before
        assert prompts[k + 1][len(before) :] == srt[k + 1]["forced_token_ids"] != []
    final = prompts[2] + outs[2].choices[0].token_ids
    # every token entered the engine once: prefills plus one decode input per sampled token
    computed = sum(s["prefill_tokens"] for s in srt) + sum(len(o.choices[0].token_ids) for o in outs)
    ratio = computed / len(final)
    print(f"prefill ratio {ratio:.3f} ({computed} tokens computed, {len(final)} unique)")
    assert ratio <= 1.2

    recorded = httpx.get(f"{url}/sessions/three-turns").json()
    (branch,) = recorded["branches"]
    assert branch["prompt_ids"] + branch["response_ids"] == final and branch["prompt_ids"] == prompts[0]
    mask, logprobs = branch["response_mask"], branch["response_logprobs"]
    expected_mask, expected_lp = [], []
    for k, o in enumerate(outs):
        forced = srt[k]["forced_token_ids"]
        expected_mask += [0] * len(forced) + [1] * len(o.choices[0].token_ids)
        expected_lp += [0.0] * len(forced) + o.choices[0].token_logprobs
    assert mask == expected_mask and logprobs == expected_lp
    assert branch["num_turns"] == 3 and branch["observations"] == 2

    # a request that does not extend the conversation (an edited reply) starts a new branch, and says so
    edited = messages[:2] + [{"role": "assistant", "content": "edited"}, {"role": "user", "content": "Go on."}]
    out = c.chat.completions.create(model=MODEL, messages=edited, max_tokens=4, seed=4)
    assert out.model_extra["srt"]["new_branch"] and "do not extend" in out.model_extra["srt"]["branch_reason"]
    assert out.model_extra["prompt_token_ids"] == server.tokenizer.encode(
        render_prompt(server.tokenizer, edited), add_special_tokens=False
    )
    (reason,) = httpx.get(f"{url}/sessions/three-turns").json()["branch_reasons"]
    assert reason == out.model_extra["srt"]["branch_reason"] and "message 2" in reason
    branches = server.end_session("three-turns")
    assert len(branches) == 2 and branches[0].prompt_ids + branches[0].response_ids == final
    assert branches[0].branch_reason is None and branches[1].branch_reason == reason


def test_a_client_that_stores_its_reply_with_the_stop_string_keeps_one_session(tiny, url):
    """As smolagents does with `</code>`: ask for a stop string, store the reply with it appended (and
    stripped, as text parts); the session extends every turn (here the stop string is one the random model
    samples often, so that every turn ends on it)."""
    c = client(f"{url}/sessions/stop-appended/v1")
    messages = [{"role": "system", "content": "Write code."}, {"role": "user", "content": "Add 2 and 3."}]
    outs = []
    for k in range(4):
        out = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, seed=k, stop=["e"])
        text = out.choices[0].message.content
        assert out.choices[0].finish_reason == "stop" and not text.endswith("e")
        sampled = tiny.tokenizer.decode(out.choices[0].token_ids, skip_special_tokens=True)
        assert sampled.startswith(text + "e")  # the turn ended on the stop string, which the sampled tokens hold
        messages.append({"role": "assistant", "content": [{"type": "text", "text": (text + "e").strip()}]})
        messages.append({"role": "user", "content": f"Observation:\n{k}"})
        outs.append(out.model_extra["srt"])
    assert [s["new_branch"] for s in outs] == [True, False, False, False]
    recorded = httpx.get(f"{url}/sessions/stop-appended").json()
    assert len(recorded["branches"]) == 1 and recorded["branch_reasons"] == []
    assert recorded["branches"][0]["num_turns"] == 4


def test_streaming_returns_the_same_tokens_as_not_streaming(url):
    c = client(f"{url}/v1")
    messages = [{"role": "user", "content": "Tell me a story."}]
    plain = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, seed=11, logprobs=True)
    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=20, seed=11, logprobs=True, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    streamed = [ch.choices[0] for ch in chunks if ch.choices]
    assert "".join(ch.delta.content or "" for ch in streamed) == plain.choices[0].message.content
    assert [t for ch in streamed for t in (ch.model_extra.get("token_ids") or [])] == plain.choices[0].token_ids
    streamed_lps = [e.logprob for ch in streamed if ch.logprobs for e in ch.logprobs.content]
    # (the second run may reuse the first's prompt KV: float64 sums in another order, the last bits differ)
    assert streamed_lps == pytest.approx(plain.choices[0].token_logprobs, abs=1e-9)
    assert streamed[-1].finish_reason == plain.choices[0].finish_reason
    assert chunks[0].model_extra["prompt_token_ids"] == plain.model_extra["prompt_token_ids"]
    assert chunks[-1].usage.completion_tokens == len(plain.choices[0].token_ids)

    text = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, seed=5)
    pieces = list(c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, seed=5, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == text.choices[0].text
    assert [t for p in pieces for t in p.choices[0].model_extra.get("token_ids", [])] == text.choices[0].token_ids


def test_a_completion_session_extends_by_text_and_by_token_ids(url):
    c = client(f"{url}/sessions/completion/v1")
    first = c.completions.create(model=MODEL, prompt="Q: 2+2?\nA:", max_tokens=6, seed=1)
    shown = "Q: 2+2?\nA:" + first.choices[0].text
    second = c.completions.create(model=MODEL, prompt=shown + "\nQ: 3+3?\nA:", max_tokens=6, seed=2)
    s2 = second.model_extra["srt"]
    assert not s2["new_branch"]
    ids = first.choices[0].model_extra["prompt_token_ids"] + first.choices[0].token_ids
    assert second.choices[0].model_extra["prompt_token_ids"][: len(ids)] == ids
    full = second.choices[0].model_extra["prompt_token_ids"] + second.choices[0].token_ids
    third = c.completions.create(model=MODEL, prompt=full + [198], max_tokens=4, seed=3)
    assert not third.model_extra["srt"]["new_branch"] and third.model_extra["srt"]["forced_token_ids"] == [198]


def test_bad_requests_get_a_4xx_with_a_message(url):
    c = client(f"{url}/v1")
    ok = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.chat.completions.create(model="gpt-4", messages=ok)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.chat.completions.create(model=MODEL, messages=ok, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="context too long"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 600}])
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        c.chat.completions.create(model=MODEL, messages=ok, frequency_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        c.completions.create(model=MODEL, prompt=[1, 2, 10**7])
    answer = httpx.post(
        f"{url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"]
    answer = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": "hi"})
    assert answer.status_code == 400 and "messages" in answer.json()["error"]["message"]
    answer = httpx.post(f"{url}/sessions/bad%20id/v1/chat/completions", json={"model": MODEL, "messages": ok})
    assert answer.status_code == 400
    assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == [MODEL]


def test_32_concurrent_sessions_with_malformed_requests(url):
    bad_kinds = {3: "model", 11: "json", 19: "field", 27: "context"}  # ~10% of the sessions

    async def session(i: int, http: httpx.AsyncClient) -> tuple[str, object]:
        base = f"{url}/sessions/crowd-{i}/v1"
        c = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)
        messages = [{"role": "user", "content": f"Count to {i}."}]
        kind = bad_kinds.get(i)
        try:
            if kind == "json":
                answer = await http.post(f"{base}/chat/completions", content=b'{"model": ')
                return "bad", answer.status_code
            if kind is not None:
                body = {
                    "model": {"model": "nope"},
                    "field": {"max_tokens": "many"},
                    "context": {"messages": [{"role": "user", "content": "x " * 2000}]},
                }[kind]
                args = {"model": MODEL, "messages": messages, "max_tokens": 8, **body}
                await c.chat.completions.create(**args)
                return "bad", 200
            for k in range(2):
                out = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, seed=i * 10 + k)
                assert out.model_extra["srt"]["new_branch"] == (k == 0)
                messages += [{"role": "assistant", "content": out.choices[0].message.content}]
                messages += [{"role": "user", "content": "more"}]
            return "good", 200
        except openai.APIStatusError as exc:
            return ("bad" if kind else "good"), exc.status_code

    async def crowd():
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(session(i, http) for i in range(32)))

    results = asyncio.run(crowd())
    good = [status for kind, status in results if kind == "good"]
    bad = [status for kind, status in results if kind == "bad"]
    print(f"32 sessions: {len(good)} good ones answered {set(good)}, {len(bad)} bad ones {sorted(bad)}")
    assert good == [200] * 28 and len(bad) == 4 and all(400 <= s < 500 for s in bad)
    after = client(f"{url}/v1").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "still?"}])
    assert after.choices[0].token_ids


def test_a_session_takes_one_request_at_a_time(url):
    async def both():
        async with httpx.AsyncClient(timeout=60) as http:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 32,
                "ignore_eos": True,
            }
            return await asyncio.gather(
                *(http.post(f"{url}/sessions/busy/v1/chat/completions", json=body) for _ in range(2))
            )

    codes = sorted(r.status_code for r in asyncio.run(both()))
    assert codes in ([200, 200], [200, 409])  # 409 when the second arrives while the first runs


def test_weights_update_in_place_between_steps(tiny, server, url):
    c = client(f"{url}/v1")
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "same?"}], max_tokens=8, seed=3)
    before = c.chat.completions.create(**ask).choices[0].token_ids
    server.update_weights({name: p.detach().clone() for name, p in tiny.model.state_dict().items()})
    server.end_step()
    assert c.chat.completions.create(**ask).choices[0].token_ids == before


def load_example():
    spec = importlib.util.spec_from_file_location("openai_agent", ROOT / "examples" / "openai_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_agent_yields_trajectories_with_masks(server):
    example = load_example()
    assert example.calculate("6 * 7") == "42"
    tasks = arithmetic_tasks(2, seed=0)
    run = run_agents(example.agent, tasks, server=server, n_samples=1)
    assert [(t.task_index, t.sample_index) for t in run.trajectories] == [(0, 0), (1, 0)]
    for traj in run.trajectories:
        assert traj.error is None and traj.finish_reason == "done"
        assert traj.reward in (0.0, 1.0) and traj.ground_truth == tasks[traj.task_index].ground_truth
        assert len(traj.response_ids) == len(traj.response_mask) == len(traj.response_logprobs)
        assert traj.num_turns == 3 and traj.observations == 2  # the agent's two messages between turns
        assert 0 in traj.response_mask and traj.response_mask[0] == 1
        assert all(lp == 0.0 for lp, m in zip(traj.response_logprobs, traj.response_mask) if m == 0)
        assert all(lp <= 0.0 for lp, m in zip(traj.response_logprobs, traj.response_mask) if m == 1)
        assert traj.messages[0]["content"] == example.SYSTEM and traj.messages[-1]["role"] == "assistant"
        json.dumps(traj.to_json())
    assert run.summary.trajectories == 2 and run.summary.model_tokens > 0 and run.summary.forced_tokens > 0
    assert server.session(run.trajectories[0].request_id.split("-")[2]) is None  # sessions are closed


def test_a_failing_agent_gets_an_error_trajectory_and_the_others_run_on(server):
    async def agent(base_url: str, task: Task) -> float:
        c = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        first = await c.chat.completions.create(model=MODEL, messages=task.prompt, max_tokens=4)
        if task.ground_truth == "boom":
            raise RuntimeError("agent bug")
        if task.ground_truth == "slow":  # a second request, then it hangs until the run's timeout
            reply = {"role": "assistant", "content": first.choices[0].message.content}
            messages = task.prompt + [reply, {"role": "user", "content": "go on"}]
            second = asyncio.ensure_future(
                c.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=300, extra_body={"ignore_eos": True}
                )
            )
            await asyncio.sleep(3600)
            await second
        return 0.5

    tasks = [Task([{"role": "user", "content": c}], c) for c in ("1", "boom", "slow")]
    run = run_agents(agent, tasks, server=server, n_samples=2, timeout_s=10)  # ample for the others, under load too
    assert [t.reward for t in run.trajectories] == [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert [t.finish_reason for t in run.trajectories] == ["done", "done"] + ["error"] * 4
    assert run.trajectories[2].error == "RuntimeError: agent bug" and run.trajectories[2].model_tokens == 4
    # the session as it stood when the agent gave up: its first turn, and its second if that one had ended
    # (one still running then is released when it ends)
    assert run.trajectories[4].error == "TimeoutError" and run.trajectories[4].num_turns in (1, 2)
    assert not any(t.branches for t in run.trajectories)


def test_serve_command_refuses_a_missing_env_file(tmp_path):
    result = CliRunner().invoke(app, ["serve", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "no such file" in result.output


async def parity_agent(base_url: str, task: Task) -> float:
    """Two turns through the openai client; reward 1 when the replies' characters sum to an even number
    (random text varies on that, so GRPO groups carry a signal)."""
    c = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    model = (await c.models.list()).data[0].id
    messages = [dict(m) for m in task.prompt]
    first = (await c.chat.completions.create(model=model, messages=messages, max_tokens=6)).choices[0].message.content
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "Once more."}]
    second = (await c.chat.completions.create(model=model, messages=messages, max_tokens=6)).choices[0].message.content
    await c.close()
    return float(sum(map(ord, first + second)) % 2 == 0)


def test_train_runs_an_openai_client_agent_named_by_the_env_config(tmp_path):
    from srt_agent.models import load_tokenizer, tiny_random_model
    from srt_agent.rl.trainer import Trainer

    env = tmp_path / "agent.yaml"
    env.write_text(
        "name: agent\nagent: test_serve:parity_agent\nmodel: tiny-llama\n"
        "dataset: {n: 4, seed: 1}\nn_samples: 3\nmax_tokens_per_turn: 6\nmax_response_tokens: 80\n"
        "sampling: {temperature: 1.0, seed: 3}\nengine: {max_batch: 8, max_context: 512, calibrate: false}\n"
        "cold_start: {enabled: false, eval_tasks: 0}\n"
        "train: {steps: 1, prompts_per_step: 2, lr: 0.001, micro_batch_tokens: 256}\n"
    )
    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    report = Trainer.from_env_file(env, tmp_path / "run", loaded=tiny).run()
    (step,) = report["steps"]
    print({k: v for k, v in step.items() if k.startswith(("training/", "critic/score", "srt/"))})
    assert step["srt/forced_tokens"] > 0 and step["srt/model_tokens"] > 0
    # the trainer recomputes the log-probs of the tokens the server recorded: the same tokens, exactly on-policy
    assert step["training/rollout_logprob_diff_mean"] < 1e-4
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for row in rows:
        assert row["error"] is None and row["num_turns"] == 2 and row["observations"] == 1
        assert row["response_mask"][0] == 1 and 0 in row["response_mask"]
        assert row["reward"] in (0.0, 1.0)
