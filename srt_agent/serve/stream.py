"""The one streaming encoder of both endpoints: a reply as OpenAI's server-sent events.

Each event is one chunk (``data: {json}``) of the answer's id, time, model and object with one choice: the
endpoint's opening chunks, one per sampled token (its piece of the text, its id and log-probability), then
the closing one with the finish reason and the ``srt`` object; the usage chunk when the client asked for it
(``stream_options.include_usage``), then ``data: [DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Protocol

from fastapi.responses import StreamingResponse

from .reply import Reply


class Choices(Protocol):
    """An endpoint's choices: `tokens_choice` carries tokens with their piece of text, starting at `at`."""

    chunk_object: str

    def tokens_choice(self, at: int, ids: list[int], logprobs: list[float], pieces: list[str]) -> dict: ...


def token_choices(choices: Choices, reply: Reply, pieces: list[str]) -> Iterator[dict]:
    """One choice per sampled token, its piece of the reply's text with it."""
    at = 0
    for token, logprob, piece in zip(reply.token_ids, reply.logprobs, pieces):
        yield choices.tokens_choice(at, [token], [logprob], [piece])
        at += len(piece)


def streamed(
    reply: Reply, choices: Choices, chunks: Iterable[tuple[dict, dict]], closing: dict, usage: bool
) -> StreamingResponse:
    """The reply's events: `chunks` (a choice and the chunk's own extra fields each), then `closing` with the
    ``srt`` object, then the usage chunk when `usage`, then ``[DONE]``."""
    head = {**reply.head(), "object": choices.chunk_object}

    def events() -> Iterator[str]:
        for choice, extra in [*chunks, (closing, {"srt": reply.srt})]:
            yield _event({**head, "choices": [choice], **extra})
        if usage:
            yield _event({**head, "choices": [], "usage": reply.usage()})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"
