"""A tool-calling agent written against the `openai` client: the code interpreter as an OpenAI function tool.

The agent sends the task with ``tools=[code_interpreter]``, runs every call the model makes (its Python, in
srt-agent's sandbox) and sends the output back as a ``tool`` message, until the model answers in
``\\boxed{}``; reward 1 for the right answer. It knows nothing of how the model writes tool calls: the
server renders the tools for the model and returns its calls as OpenAI ``tool_calls`` (SmolLM2's ChatML
template has no tool format, so Hermes ``<tool_call>`` JSON: srt_agent.agent.hermes).

`envs/openai_tools.yaml` trains it on SmolLM2: a cold start on traces of this very conversation whose
code really ran (``--write-traces`` writes them), then GRPO through the server's sessions:

    python examples/tool_agent.py --write-traces envs/openai_tools_traces.jsonl
    PYTHONPATH=examples srt-agent train envs/openai_tools.yaml --steps 2 --compare none
    python examples/tool_agent.py --model smollm2 --tasks 4 --n 2     # roll it out once
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

from openai import AsyncOpenAI

SYSTEM = (
    "You are a careful math assistant. Use the code_interpreter tool for every calculation: it runs Python "
    "and returns what the code prints. When you know the answer, give it as \\boxed{answer}."
)
TOOL = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print() the result"}},
            "required": ["code"],
        },
    },
}
MAX_TURNS = 3
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def opening(task) -> list[dict]:
    """The conversation's first messages: the agent's system prompt and the task's question."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt[-1]["content"]}]


def run_code(code: str) -> str:
    """The tool: `code` run in srt-agent's local sandbox; what it printed (errors and limits noted)."""
    from srt_agent.tools import CodeInterpreter

    text, _ = CodeInterpreter.from_config({"sandbox": "local", "timeout_s": 5, "max_output_chars": 256}).execute(code)
    return text.strip()


def tool_output(call) -> str:
    """Run one OpenAI tool call (an object or a dict) and return the tool message's content."""
    function = call["function"] if isinstance(call, dict) else call.function.model_dump()
    if function["name"] != TOOL["function"]["name"]:
        return f"error: no tool named {function['name']!r}"
    try:
        code = json.loads(function["arguments"] or "{}").get("code")
    except (ValueError, AttributeError):
        code = None
    return run_code(code) if isinstance(code, str) else "error: the arguments need a string 'code'"


def answer(text: str) -> str | None:
    found = BOXED.findall(text or "")
    return found[-1].strip() if found else None


async def agent(base_url: str, task) -> float:
    """Up to three turns: each tool call the model makes is run and answered; reward 1.0 when the final
    ``\\boxed{}`` answer matches the task's ground truth."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    model = (await client.models.list()).data[0].id
    messages = opening(task)
    reply = None
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=[TOOL], max_tokens=160, temperature=1.0
        )
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            content = await asyncio.to_thread(tool_output, call)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    await client.close()
    return 1.0 if reply is not None and answer(reply.content) == task.ground_truth.strip() else 0.0


def trace(task) -> dict | None:
    """The conversation a right answer takes, with the task's own solution as the model's call, really run:
    a ``{"messages", "tools"}`` row (verl's multi-turn SFT layout); None when its output is not the answer."""
    code = task.extra_info["solution"]
    call = {"id": "call_0", "type": "function", "function": {"name": "code_interpreter", "arguments": ""}}
    call["function"]["arguments"] = json.dumps({"code": code})
    output = tool_output(call)
    if output != task.ground_truth.strip():
        return None
    messages = opening(task) + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": output},
        {"role": "assistant", "content": f"The answer is \\boxed{{{output}}}."},
    ]
    return {"messages": messages, "tools": [TOOL]}


def write_traces(path: str, n: int, seed: int) -> int:
    """`n` procedural tasks (seed `seed`: the env's ``cold_start.seed``) as traces whose code ran right."""
    from srt_agent.sources.arithmetic import arithmetic_tasks

    rows = [row for row in map(trace, arithmetic_tasks(n, seed=seed)) if row is not None]
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return len(rows)


def main() -> None:
    from srt_agent.agent import EnvConfig
    from srt_agent.serve import run_agents
    from srt_agent.sources.arithmetic import arithmetic_tasks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--write-traces", metavar="PATH", help="write cold-start traces instead")
    parser.add_argument("--traces", type=int, default=96, help="tasks to write traces of")
    parser.add_argument("--seed", type=int, default=1000, help="their seed (the env's cold_start.seed)")
    args = parser.parse_args()
    if args.write_traces:
        print(f"wrote {write_traces(args.write_traces, args.traces, args.seed)} traces to {args.write_traces}")
        return
    config = EnvConfig(name="openai_tools", model=args.model, n_samples=args.n, engine={"max_context": 1024})
    run = run_agents(agent, arithmetic_tasks(args.tasks, seed=0), config)
    for traj in run.trajectories:
        calls = [c.status for c in traj.tool_calls]
        print(f"task {traj.task_index} sample {traj.sample_index}: reward {traj.reward:.0f}, tool calls {calls}")
    print(f"mean reward {run.summary.mean_reward:.2f}")


if __name__ == "__main__":
    main()
