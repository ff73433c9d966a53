"""Rendering chat messages to text with the tokenizer's template, and the text that adds turns mid-episode."""

from __future__ import annotations

_PROBE = "\x00srt-probe\x00"


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The prompt text for `messages` (and `tools`, where the template renders them), ending with the
    opening of the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; multi-turn rollouts need one")
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)


def added_turns_text(
    tokenizer, messages: list[dict], turn_closed: str | None = None, tools: list[dict] | None = None
) -> str:
    """Text that ends the assistant's turn, adds `messages` (user, tool or system turns) and opens the next
    assistant turn.

    `turn_closed` is the text of the end-of-turn token the model already emitted (e.g. ``<|im_end|>``), which
    is then not repeated. Derived from the chat template by rendering a probe conversation with and without
    the added messages (all at once, so a template that merges consecutive tool turns merges them here too);
    ValueError when the template does not render them as a plain suffix.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; multi-turn rollouts need one")
    extra = {"tools": tools} if tools else {}
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PROBE}]
    before = tokenizer.apply_chat_template(probe, tokenize=False, **extra)
    after = render_prompt(tokenizer, probe + list(messages), tools)
    if not after.startswith(before) or _PROBE not in before:
        raise ValueError("the chat template does not render added turns as a plain suffix")
    closing = before[before.rindex(_PROBE) + len(_PROBE) :]
    if turn_closed and closing.startswith(turn_closed):
        closing = closing[len(turn_closed) :]
    return closing + after[len(before) :]


def user_turn_text(tokenizer, content: str, turn_closed: str | None = None) -> str:
    """Text that ends the assistant's turn, adds a user message with `content` and opens the next assistant
    turn (see :func:`added_turns_text`)."""
    return added_turns_text(tokenizer, [{"role": "user", "content": content}], turn_closed)
