"""The endpoints' answers in OpenAI's shapes: a chat completion (a message, or its deltas) and a text
completion (a text, or its pieces), both with vLLM's token ids (``prompt_token_ids``, ``token_ids``),
each sampled token's log-probability (``token_logprobs``; OpenAI's ``logprobs`` too when asked) and the
``srt`` object. Streamed, both go through the one encoder (:mod:`.stream`)."""

from __future__ import annotations

from fastapi.responses import StreamingResponse

from .reply import Reply
from .stream import streamed, token_choices
from .text import TokenText


class ChatAnswer:
    """The chat endpoint's answer: one message, or its deltas token by token (a reply with tool calls: its
    tokens in one delta, then the calls); per token ``{"token", "logprob", "bytes", "top_logprobs"}`` when
    `logprobs` is asked for."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, text: TokenText, logprobs: bool):
        self.text, self.want_logprobs = text, logprobs

    def choice(self, delta: dict, finish: str | None = None, logprobs: dict | None = None, **fields) -> dict:
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish, **fields}

    def tokens_choice(self, at: int, ids: list[int], logprobs: list[float], pieces: list[str]) -> dict:
        content = {"content": "".join(pieces)}
        return self.choice(content, logprobs=self._logprobs(ids, logprobs), token_ids=ids, token_logprobs=logprobs)

    def _logprobs(self, ids: list[int], logprobs: list[float]) -> dict | None:
        if not self.want_logprobs:
            return None
        entries = []
        for token, logprob in zip(ids, logprobs):
            piece = self.text.decode([token], False)
            entries.append({"token": piece, "logprob": logprob, "bytes": list(piece.encode()), "top_logprobs": []})
        return {"content": entries}

    def body(self, reply: Reply, calls: list[dict]) -> dict:
        message = {"role": "assistant", "content": reply.text}
        if calls:
            message = {"role": "assistant", "content": reply.text or None, "tool_calls": calls}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self._logprobs(reply.token_ids, reply.logprobs),
            "finish_reason": reply.finish_reason,
            "token_ids": reply.token_ids,
            "token_logprobs": reply.logprobs,
        }
        body = {**reply.head(), "object": "chat.completion", "choices": [choice], "usage": reply.usage()}
        return {**body, "prompt_token_ids": reply.prompt_ids, "srt": reply.srt}

    def stream(self, reply: Reply, calls: list[dict], usage: bool) -> StreamingResponse:
        chunks = [(self.choice({"role": "assistant", "content": ""}), {"prompt_token_ids": reply.prompt_ids})]
        if calls:  # the tokens in one chunk with the content outside the calls, then the calls
            chunks.append((self.tokens_choice(0, reply.token_ids, reply.logprobs, [reply.text]), {}))
            chunks.append((self.choice({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}), {}))
        else:
            pieces = self.text.pieces(reply.token_ids, reply.text, True)
            chunks += [(choice, {}) for choice in token_choices(self, reply, pieces)]
        return streamed(reply, self, chunks, self.choice({}, reply.finish_reason), usage)


class CompletionAnswer:
    """The completions endpoint's answer: one text, or its pieces token by token; OpenAI's legacy
    ``logprobs`` (tokens, their log-probabilities, text offsets) when asked for."""

    chunk_object = "text_completion"

    def __init__(self, text: TokenText, logprobs: bool):
        self.text, self.want_logprobs = text, logprobs

    def choice(self, text: str, finish: str | None = None, logprobs: dict | None = None, **fields) -> dict:
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, **fields}

    def tokens_choice(self, at: int, ids: list[int], logprobs: list[float], pieces: list[str]) -> dict:
        legacy = self._logprobs(at, ids, logprobs, pieces)
        return self.choice("".join(pieces), logprobs=legacy, token_ids=ids, token_logprobs=logprobs)

    def _logprobs(self, at: int, ids: list[int], logprobs: list[float], pieces: list[str]) -> dict | None:
        if not self.want_logprobs:
            return None
        offsets = []
        for piece in pieces:
            offsets.append(at)
            at += len(piece)
        names = [self.text.decode([t], False) for t in ids]
        return {"tokens": names, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}

    def body(self, reply: Reply, stop_reason: int | str | None) -> dict:
        pieces = self.text.pieces(reply.token_ids, reply.text, False) if self.want_logprobs else []
        choice = self.choice(
            reply.text,
            reply.finish_reason,
            self._logprobs(0, reply.token_ids, reply.logprobs, pieces),
            stop_reason=stop_reason,
            prompt_token_ids=reply.prompt_ids,
            token_ids=reply.token_ids,
            token_logprobs=reply.logprobs,
        )
        return {
            **reply.head(),
            "object": "text_completion",
            "choices": [choice],
            "usage": reply.usage(),
            "srt": reply.srt,
        }

    def stream(self, reply: Reply, usage: bool) -> StreamingResponse:
        choices = list(token_choices(self, reply, self.text.pieces(reply.token_ids, reply.text, False)))
        closing = self.choice("", reply.finish_reason)
        (choices[0] if choices else closing)["prompt_token_ids"] = reply.prompt_ids
        return streamed(reply, self, [(choice, {}) for choice in choices], closing, usage)
