"""Hermes tool calls, for chat templates that cannot express tools (SmolLM2's ChatML among them).

Qwen2.5's and Nous Research's Hermes templates put the tools' JSON schemas into the system message and
have the model write each call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in its
text. Where a tokenizer's template renders neither ``tools`` nor an assistant message's ``tool_calls``
(it would drop them silently: the model would never see its tools, nor a conversation its own calls), a
:class:`ChatFormat` writes them that way before the template renders, so an agent's OpenAI ``tools`` reach
the model and its calls come back as OpenAI ``tool_calls`` (:func:`parse_tool_calls`). A template that
renders them itself is left to do so. Tool results stay ``tool`` messages, rendered by the template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .chat import added_turns_text, render_prompt

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PROBE = "srt_probe_tool"


def tools_text(tools: list[dict]) -> str:
    """The tools block of a Hermes system message (as Qwen2.5's template writes it)."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


def call_text(call: dict) -> str:
    """An OpenAI tool call (or a ``{"name", "arguments"}`` one) as the Hermes text a model writes."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def parse_tool_calls(text: str, call_id: Callable[[], str]) -> tuple[str, list[dict]]:
    """The reply's Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks as OpenAI
    ``tool_calls`` (ids from `call_id`), and the text outside them; a block that is not such JSON stays text."""
    calls, kept, last = [], [], 0
    for match in TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        args = call.get("arguments", call.get("parameters", {}))
        arguments = args if isinstance(args, str) else json.dumps(args)
        calls.append({"id": call_id(), "type": "function", "function": {"name": call["name"], "arguments": arguments}})
        kept.append(text[last : match.start()])
        last = match.end()
    if not calls:
        return text, []
    kept.append(text[last:])
    return "".join(kept).strip(), calls


@dataclass(frozen=True)
class ChatFormat:
    """How a tokenizer's chat template gets tools: itself, or as Hermes text this class writes in."""

    tokenizer: Any
    writes_tools: bool = False  # the template ignores `tools`: they go into the system message
    writes_calls: bool = False  # the template drops `tool_calls`: they go into the assistant's text

    @classmethod
    def of(cls, tokenizer) -> ChatFormat:
        """Probe the template: does a tool's name come out when it renders `tools`, and a call's?"""
        tool = {"type": "function", "function": {"name": _PROBE, "parameters": {"type": "object", "properties": {}}}}
        call = {"id": "call_0", "type": "function", "function": {"name": _PROBE, "arguments": "{}"}}
        asked = [{"role": "user", "content": "q"}]
        called = asked + [{"role": "assistant", "content": "", "tool_calls": [call]}]
        return cls(
            tokenizer,
            writes_tools=_PROBE not in _render(tokenizer, asked, tools=[tool], add_generation_prompt=True),
            writes_calls=_PROBE not in _render(tokenizer, called),
        )

    def messages(self, messages: list[dict], tools: list[dict] | None) -> list[dict]:
        """`messages` as the template gets them: calls in the assistant's text and the tools in the system
        message where the template would drop them."""
        out = [dict(m) for m in messages]
        if self.writes_calls:
            for m in out:
                if m["role"] == "assistant" and m.get("tool_calls"):
                    calls = "\n".join(call_text(c) for c in m.pop("tool_calls"))
                    m["content"] = f"{m['content']}\n{calls}" if m.get("content") else calls
        if tools and self.writes_tools:
            if out and out[0]["role"] == "system":
                out[0]["content"] = f"{out[0]['content']}\n\n{tools_text(tools)}"
            else:
                out.insert(0, {"role": "system", "content": tools_text(tools)})
        return out

    def prompt(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text for `messages` with `tools` (see :func:`srt_agent.agent.chat.render_prompt`)."""
        return render_prompt(self.tokenizer, self.messages(messages, tools), tools)

    def added_turns(self, messages: list[dict], turn_closed: str | None, tools: list[dict] | None = None) -> str:
        """The text that adds `messages` after an assistant turn (see
        :func:`srt_agent.agent.chat.added_turns_text`)."""
        return added_turns_text(self.tokenizer, self.messages(messages, None), turn_closed, tools)


def _render(tokenizer, messages: list[dict], **options) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **options)
    except Exception:  # noqa: BLE001 - a template that fails on tools cannot render them
        return ""
