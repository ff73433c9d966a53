"""An agent written against the `openai` client only, trained and rolled out by srt-agent.

The agent solves an arithmetic task in up to three turns with a calculator it runs itself: the model asks
for it with ``CALC: <expression>``, the agent answers with the result as a message, and the model then
states the answer. The agent knows nothing of srt-agent: it gets a base URL (its own session on
srt-agent's OpenAI-compatible server) and returns a reward; srt-agent records the exact tokens, the
response mask (0 for the messages the agent inserted) and the log-probs of every turn.

Run it (tiny random model by default, `--model smollm2` for the real one):

    python examples/openai_agent.py --model smollm2 --tasks 4 --n 2
"""

from __future__ import annotations

import argparse
import ast
import operator
import re

from openai import AsyncOpenAI

SYSTEM = (
    "You solve arithmetic with a calculator. To use it, write one line `CALC: <expression>` and stop; "
    "you get the result back. Then give the final answer as `ANSWER: <number>`."
)
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The calculator tool: + - * on integers, nothing else."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only + - * on integers")

    try:
        return str(value(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"error: {exc}"


async def agent(base_url: str, task) -> float:
    """Up to three turns: ask, run the calculator if asked (else remind the model of it), ask for the answer.
    Reward 1.0 when the final answer matches the task's ground truth."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    model = (await client.models.list()).data[0].id
    question = task.prompt[-1]["content"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    reply = ""
    for turn in range(3):
        response = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=48, temperature=1.0, stop=["\nANSWER-END"]
        )
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        if "ANSWER:" in reply or turn == 2:
            break
        call = re.search(r"CALC:\s*([^\n]+)", reply)
        if call:  # the tool's output goes back as a message; the server inserts its tokens (mask 0)
            messages.append({"role": "user", "content": f"Calculator: {calculate(call.group(1))}"})
        elif turn == 0:
            messages.append({"role": "user", "content": "Use the calculator first: `CALC: <expression>`."})
        else:
            messages.append({"role": "user", "content": "Now give the final answer: `ANSWER: <number>`."})
    await client.close()
    answer = re.findall(r"ANSWER:\s*(-?\d+)", reply)
    return 1.0 if answer and answer[-1] == task.ground_truth.strip() else 0.0


def main() -> None:
    from srt_agent.agent import EnvConfig
    from srt_agent.serve import run_agents
    from srt_agent.sources.arithmetic import arithmetic_tasks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    args = parser.parse_args()
    config = EnvConfig(name="openai_agent", model=args.model, n_samples=args.n, engine={"max_context": 1024})
    run = run_agents(agent, arithmetic_tasks(args.tasks, seed=0), config)
    for traj in run.trajectories:
        print(
            f"task {traj.task_index} sample {traj.sample_index}: reward {traj.reward:.0f}, {traj.num_turns} turns, "
            f"{traj.model_tokens} sampled + {len(traj.response_ids) - traj.model_tokens} inserted tokens"
            + (f", error: {traj.error}" if traj.error else "")
        )
    print(f"mean reward {run.summary.mean_reward:.2f}, tokens per forward {run.summary.tokens_per_forward:.2f}")


if __name__ == "__main__":
    main()
