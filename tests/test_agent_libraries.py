"""Agents written with popular agent libraries, run through `srt-agent serve` sessions as they are: each
runs a 3-turn conversation (its own memory re-sends the history every turn, in its own way) against the
tiny random model, and the session keeps one branch, or records why where the library edits the history
it re-sends, and every branch gives training samples of all its sampled tokens.

Libraries: the `openai` client (streamed, with tools), the OpenAI Agents SDK (plain and streamed, with its
session memory), LangChain's `ChatOpenAI` (bound tools, plain and streamed), Pydantic AI (plain and
streamed) and smolagents' `CodeAgent` (the `agents` extra: ``pip install 'srt-agent[agents]'``).
"""

from __future__ import annotations

import asyncio
from importlib.metadata import version

import openai
import pytest
import torch

from srt_agent.agent import EnvConfig, Task
from srt_agent.models import load_model
from srt_agent.rl.samples import rollout_samples
from srt_agent.serve import RolloutServer, run_agents

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL = "tiny-llama"
QUESTIONS = ("Add 2 and 3.", "Now add 4 and 5.", "And 6 and 7?")
TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(scope="module")
def server():
    tiny = load_model(MODEL, dtype=torch.float64, device="cpu")
    engine = {"backend": "engine", "drafter": "srt", "device": "cpu", "max_batch": 8, "max_context": 4096}
    server = RolloutServer.from_config(EnvConfig(model=MODEL, engine={**engine, "calibrate": False}), loaded=tiny)
    yield server
    server.close()


def rollout(server, agent):
    """One rollout of `agent` through a session: its trajectory (earlier branches inside) and its samples."""
    task = Task([{"role": "user", "content": QUESTIONS[0]}], "5")
    run = run_agents(agent, [task], server=server, n_samples=1, seed=0)  # requests without a seed: seeded
    (traj,) = run.trajectories
    assert traj.error is None, traj.error
    samples = rollout_samples(traj, 0, (0, 0, 0), EnvConfig(model=MODEL))
    sampled = sum(t.model_tokens for t in [*traj.branches, traj])
    assert sampled > 0 and sum(s.trained_tokens for s in samples) == sampled  # every sampled token trains
    for s, t in zip(samples, [*traj.branches, traj]):
        assert s.response_ids == t.response_ids and s.engine_logprobs == t.response_logprobs
        assert all(lp <= 0.0 for lp, m in zip(s.engine_logprobs, s.response_mask) if m)
    return traj


def kept_one_session(traj, turns: int = 3) -> None:
    assert traj.branches == [] and traj.branch_reason is None, traj.branch_reason
    assert traj.num_turns == turns and traj.observations == turns - 1
    assert 0 in traj.response_mask  # the messages added between turns are inserted, not trained


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_openai_client_with_tools_and_streamed_usage(server, stream):
    async def agent(base_url: str, task: Task) -> float:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        messages = [{"role": "system", "content": "Add numbers."}, *task.prompt]
        for question in QUESTIONS[1:] + ("",):
            ask = dict(model=MODEL, messages=messages, tools=[TOOL], max_tokens=8)
            if stream:
                text = ""
                async for chunk in await client.chat.completions.create(
                    **ask, stream=True, stream_options={"include_usage": True}
                ):
                    text += "".join(c.delta.content or "" for c in chunk.choices)
                messages.append({"role": "assistant", "content": text, "tool_calls": None})
            else:
                out = await client.chat.completions.create(**ask)
                messages.append(out.choices[0].message.model_dump())  # refusal, annotations, audio: None
            messages.append({"role": "user", "content": question})
        await client.close()
        return 1.0

    kept_one_session(rollout(server, agent))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_openai_agents_sdk_with_its_session_memory(server, stream):
    sdk = pytest.importorskip("agents")  # openai-agents
    sdk.set_tracing_disabled(True)

    @sdk.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def agent(base_url: str, task: Task) -> float:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        model = sdk.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
        settings = sdk.ModelSettings(max_tokens=8, temperature=1.0)
        bot = sdk.Agent(name="adder", instructions="Add numbers.", model=model, tools=[add], model_settings=settings)
        memory = sdk.SQLiteSession(base_url)
        for question in QUESTIONS:
            if stream:
                result = sdk.Runner.run_streamed(bot, question, session=memory)
                async for _ in result.stream_events():
                    pass
            else:
                await sdk.Runner.run(bot, question, session=memory)
        return 1.0

    kept_one_session(rollout(server, agent))
    print(f"openai-agents {version('openai-agents')}: one session over 3 turns")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_langchain_chat_openai_with_bound_tools(server, stream):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def agent(base_url: str, task: Task) -> float:
        llm = langchain_openai.ChatOpenAI(
            model=MODEL, base_url=base_url, api_key="unused", max_tokens=8, streaming=stream, max_retries=0
        ).bind_tools([add])
        messages = [SystemMessage("Add numbers."), HumanMessage(QUESTIONS[0])]
        for question in QUESTIONS[1:] + ("",):
            messages += [await llm.ainvoke(messages), HumanMessage(question)]
        return 1.0

    kept_one_session(rollout(server, agent))
    print(f"langchain-openai {version('langchain-openai')}: one session over 3 turns")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_pydantic_ai_with_its_message_history(server, stream):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def agent(base_url: str, task: Task) -> float:
        model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
        bot = pydantic_ai.Agent(model, instructions="Add numbers.", model_settings={"max_tokens": 8})

        @bot.tool_plain
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        history = None
        for question in QUESTIONS:
            if stream:
                async with bot.run_stream(question, message_history=history) as result:
                    await result.get_output()
                    history = result.all_messages()
            else:
                history = (await bot.run(question, message_history=history)).all_messages()
        return 1.0

    kept_one_session(rollout(server, agent))
    print(f"pydantic-ai-slim {version('pydantic-ai-slim')}: one session over 3 turns")


def smolagents_agent(tags: tuple[str, str] | None):
    """smolagents' CodeAgent for 3 steps (then its final-answer call): it asks for the closing code tag as a
    stop string and stores each reply with that tag appended, merging it into its next request's history."""
    smolagents = pytest.importorskip("smolagents")

    async def agent(base_url: str, task: Task) -> float:
        model = smolagents.OpenAIServerModel(model_id=MODEL, api_base=base_url, api_key="unused", max_tokens=32)
        options = {"code_block_tags": tags} if tags else {}
        bot = smolagents.CodeAgent(tools=[], model=model, max_steps=3, verbosity_level=-1, **options)
        await asyncio.to_thread(bot.run, task.prompt[-1]["content"])
        return 1.0

    return agent


def test_smolagents_keeps_one_session_when_its_turns_end_on_its_stop_string(server):
    """A closing tag the random model samples often (`a`), so that each step ends on smolagents' stop
    string: the reply it stores, with the tag appended, is the reply returned. Its final-answer call opens
    with another system prompt: a branch, with that reason."""
    traj = rollout(server, smolagents_agent(("<code>", "a")))
    (steps,) = traj.branches
    assert steps.num_turns == 3 and steps.observations == 2 and steps.branch_reason is None
    assert "message 0: the system message's content differ" in traj.branch_reason and traj.num_turns == 1
    print(f"smolagents {version('smolagents')}: 3 steps in one branch, the final answer in a second")


def test_smolagents_appending_a_tag_the_model_never_wrote_branches_with_the_reason(server):
    """With its default `</code>` the random model's turns end on the token limit, not on the stop string:
    smolagents still appends `</code>` to the reply it re-sends, text the model never wrote, so each step
    opens a branch that says so; every branch trains."""
    traj = rollout(server, smolagents_agent(None))
    reasons = [b.branch_reason for b in traj.branches[1:]] + [traj.branch_reason]
    assert len(traj.branches) == 3 and all(b.num_turns == 1 for b in [*traj.branches, traj])
    for reason in reasons[:2]:
        assert "the assistant's text differs from the reply as returned" in reason and "</code>" in reason
    assert "message 0: the system message's content differ" in reasons[2]
