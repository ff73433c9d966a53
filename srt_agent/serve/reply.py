"""One generated turn as the rollout server answers it, whatever the endpoint: the answer's id, time and model,
the prompt's and the reply's token ids, their log-probabilities, the text shown, the finish reason and the
``srt`` object (session, branch, tokens inserted from messages)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Reply:
    """A turn's answer; `text` is what the client sees (stop string cut, tool calls parsed out)."""

    id: str
    model: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    srt: dict
    created: int = field(default_factory=lambda: int(time.time()))

    def head(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def usage(self) -> dict:
        prompt, completion = len(self.prompt_ids), len(self.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
