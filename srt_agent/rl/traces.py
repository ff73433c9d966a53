"""Cold-start traces: code-integrated solutions in ReTool's format, as token-level training samples.

Procedural traces are produced by the very controller that runs RL rollouts, driven by a scripted
generator instead of the model: the solution program is written as a ``<code>`` block, really runs in
the configured sandbox, its output is inserted as forced ``<interpreter>`` tokens exactly as during
rollouts (same template, same tokenization boundaries, ``response_mask = 0``), and the answer is read
from that output into ``\\boxed{}``. User traces come in verl's multi-turn SFT layout (``messages`` with
assistant and tool turns) and are tokenized the same way; a row that carries verl's ``tools`` holds OpenAI
tool calls instead, tokenized as the OpenAI-compatible server tokenizes a session of that conversation.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

from ..agent.chat import render_prompt, user_turn_text
from ..agent.controller import MultiTurnController
from ..agent.hermes import ChatFormat
from ..agent.retool import interpreter_block
from ..agent.trajectory import Trajectory
from ..config.tasks import Task, read_rows
from ..drafting.trees.keys import prompt_key
from ..engine.params import RequestOutput, SamplingParams
from .batch import Sample

INTROS = (
    "I will use Python to compute this.",
    "Let me compute this with Python.",
    "I'll write a short program to get the exact value.",
    "Let me calculate it in Python.",
)
OUTROS = ("The answer is \\boxed{{{}}}.", "So the answer is \\boxed{{{}}}.", "The result is \\boxed{{{}}}.")
_INTERPRETER = re.compile(r"<interpreter>\n(.*?)\n</interpreter>", re.S)


def turn_end_token(tokenizer, eos_token_ids: Sequence[int]) -> int:
    """The token that closes an assistant turn (ChatML's ``<|im_end|>`` when the template uses it)."""
    vocab = tokenizer.get_vocab()
    if "<|im_end|>" in vocab and vocab["<|im_end|>"] in eos_token_ids:
        return vocab["<|im_end|>"]
    if not eos_token_ids:
        raise ValueError("the model has no end-of-turn token")
    return sorted(eos_token_ids)[0]


class ScriptedGenerator:
    """Stands in for the AsyncEngine: each call returns the next scripted turn of its trajectory.

    The script of a task is a code turn (its ``extra_info["solution"]``) and then an answer turn that
    boxes the interpreter's last output, read back from the tokens the controller passes in after the
    prompt (a few-shot prompt holds a worked example's own ``<interpreter>`` output, which is not this
    trace's).
    """

    def __init__(self, tokenizer, tasks_by_key: dict[Hashable, Task], end_token: int, seed: int = 0):
        self.tokenizer = tokenizer
        self.tasks = tasks_by_key
        self.end_token = end_token
        self.seed = seed
        self._prompt_lengths: dict[str, int] = {}  # request id -> its prompt's length (the first call's input)

    async def generate(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams | None = None, prompt_key: Hashable = None
    ) -> RequestOutput:
        task = self.tasks[prompt_key]
        rng = random.Random(f"{self.seed}/{request_id.rsplit('-', 1)[0]}")
        intro, outro = rng.choice(INTROS), rng.choice(OUTROS)
        start = self._prompt_lengths.setdefault(request_id, len(prompt_ids))
        seen = self.tokenizer.decode(prompt_ids[start:], skip_special_tokens=False)
        outputs = _INTERPRETER.findall(seen)
        if not outputs:
            text = f"{intro}\n<code>\n```python\n{task.extra_info['solution']}\n```\n</code>"
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            return RequestOutput(request_id, ids, [0.0] * len(ids), "stop", stop_reason="</code>", text=text)
        answer = outputs[-1].strip().splitlines()[-1].strip() if outputs[-1].strip() else ""
        text = outro.format(answer)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_token]
        return RequestOutput(request_id, ids, [0.0] * len(ids), "eos", stop_reason=self.end_token, text=text)

    def release(self, request_id: str) -> None:
        self._prompt_lengths.pop(request_id, None)

    def idle_capacity(self) -> int:
        return 0


def procedural_traces(
    controller_args: dict,
    tasks: Sequence[Task],
    end_token: int,
    seed: int = 0,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Run the controller over `tasks` with the scripted generator; one trajectory per task (each handed to
    `on_done` as it finishes).

    `controller_args` are :class:`MultiTurnController`'s fields other than ``engine`` (tokenizer, config,
    env class, tools, end-of-turn ids). Tasks need ``extra_info["solution"]``.
    """
    missing = [i for i, t in enumerate(tasks) if "solution" not in t.extra_info]
    if missing:
        raise ValueError(f"tasks {missing[:5]} have no extra_info['solution'] to write a trace from")
    tokenizer = controller_args["tokenizer"]
    generator = ScriptedGenerator(tokenizer, {}, end_token, seed)
    controller = MultiTurnController(engine=generator, **controller_args)
    generator.tasks = {prompt_key(controller.opening(t)[0]): t for t in tasks}  # the key the controller sends
    return asyncio.run(controller.run(list(tasks), n_samples=1, on_done=on_done))


def _tool_call_text(call: dict) -> str:
    """A verl ``tool_calls`` entry as the ReTool code block the model writes."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str):
        raise ValueError("a tool call without a string 'code' argument")
    return f"\n<code>\n```python\n{code}\n```\n</code>"


def messages_sample(messages: list[dict], tokenizer, end_token: int, where: str = "row") -> Sample:
    """Tokenize one conversation (verl's multi-turn SFT layout) the way rollouts are tokenized.

    Messages before the first assistant turn are the prompt; assistant text (and its ``tool_calls`` as
    code blocks) is trained; ``tool`` messages become forced ``<interpreter>`` blocks and later ``user``
    messages forced user turns, both masked out.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"{where}: 'messages' must be a list of chat messages with a 'role'")
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        raise ValueError(f"{where}: needs prompt messages followed by at least one assistant message")
    prompt = [{"role": m["role"], "content": str(m.get("content") or "")} for m in messages[:first]]
    prompt_ids = tokenizer.encode(render_prompt(tokenizer, prompt), add_special_tokens=False)
    ids: list[int] = []
    mask: list[int] = []
    turn_open = False
    end_text = tokenizer.decode([end_token])
    for m in messages[first:]:
        role, content = m["role"], str(m.get("content") or "")
        if role == "assistant":
            try:
                text = content + "".join(_tool_call_text(c) for c in m.get("tool_calls") or [])
            except (ValueError, AttributeError, TypeError) as exc:
                raise ValueError(f"{where}: {exc}") from None
            piece, trained = tokenizer.encode(text, add_special_tokens=False), 1
            turn_open = True
        elif role == "tool":
            piece, trained = tokenizer.encode(interpreter_block(content), add_special_tokens=False), 0
        elif role == "user":
            if turn_open:
                ids.append(end_token)
                mask.append(1)
                turn_open = False
            piece, trained = tokenizer.encode(user_turn_text(tokenizer, content, end_text), add_special_tokens=False), 0
        else:
            raise ValueError(f"{where}: unexpected role {role!r} after the prompt")
        ids += piece
        mask += [trained] * len(piece)
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"{where}: the conversation must end with an assistant message")
    ids.append(end_token)
    mask.append(1)
    return Sample(prompt_ids=prompt_ids, response_ids=ids, response_mask=mask, engine_logprobs=[0.0] * len(ids))


def load_message_traces(path: str | Path, tokenizer, end_token: int) -> list[Sample]:
    """Read a ``.jsonl`` or ``.parquet`` file of ``{"messages": [...]}`` rows into samples (a row with verl's
    ``tools`` key is a conversation in the chat template's tool-call format: :func:`tool_chat_sample`)."""
    rows = read_rows(path, "cold-start traces")
    samples = []
    for where, row in rows:
        messages = row.get("messages") if isinstance(row, dict) else None
        if messages is None:
            raise ValueError(f"{where}: missing 'messages'")
        if row.get("tools"):  # OpenAI tools: the chat template's own tool-call format, as the server renders it
            samples.append(tool_chat_sample(messages, row["tools"], tokenizer, end_token, where))
        else:
            samples.append(messages_sample(messages, tokenizer, end_token, where))
    if not samples:
        raise ValueError(f"cold-start traces {path}: no rows")
    return samples


def tool_chat_sample(messages: list[dict], tools: list[dict], tokenizer, end_token: int, where: str = "row") -> Sample:
    """Tokenize a conversation with OpenAI `tools` and ``tool_calls`` as the OpenAI-compatible server
    tokenizes a session of it: the prompt rendered with the tools (:class:`~srt_agent.agent.hermes.ChatFormat`:
    Hermes text where the template cannot express them), each assistant turn (its calls in the template's
    format) and its end-of-turn token trained, the messages between turns (tool results, user turns)
    inserted as the chat template adds turns, masked out."""
    chat = ChatFormat.of(tokenizer)
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0 or messages[-1].get("role") != "assistant":
        raise ValueError(f"{where}: needs prompt messages, then turns that end with an assistant message")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    prompt_ids = encode(chat.prompt(messages[:first], tools))
    ids: list[int] = []
    mask: list[int] = []
    closed, i = tokenizer.decode([end_token]), first
    while i < len(messages):
        if messages[i]["role"] == "assistant":
            piece, trained, i = encode(chat.messages([messages[i]], None)[0]["content"] or "") + [end_token], 1, i + 1
        else:
            j = next(k for k in range(i, len(messages)) if messages[k]["role"] == "assistant")
            piece, trained, i = encode(chat.added_turns(messages[i:j], closed, tools)), 0, j
        ids += piece
        mask += [trained] * len(piece)
    return Sample(prompt_ids=prompt_ids, response_ids=ids, response_mask=mask, engine_logprobs=[0.0] * len(ids))
