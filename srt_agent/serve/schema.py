"""The request bodies of the rollout server's endpoints: OpenAI's fields plus vLLM's extras, every number held
to the bounds vLLM's OpenAI server holds it to (a seed fits in 64 bits, token ids are ids, penalties and
log-probability counts in their ranges), so a malformed request is answered 400 before any backend sees it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ..engine.params import INT64_MAX, INT64_MIN

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Field(ge=1, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
MAX_LOGPROBS = 20  # vLLM's default max_logprobs, OpenAI's top_logprobs cap


class Sampling(BaseModel):
    """The sampling fields both endpoints share (OpenAI's, plus vLLM's extras sent as ``extra_body``)."""

    model_config = ConfigDict(extra="allow")

    model: str
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_tokens: Count | None = None
    n: Count | None = None
    stream: bool | None = False
    stream_options: dict | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    logit_bias: dict | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None  # vLLM's extras; -1 (as 0): no filter
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    repetition_penalty: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


class ChatRequest(Sampling):
    messages: list[Any]
    max_completion_tokens: Count | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[dict] | None = None


class CompletionRequest(Sampling):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: Count | None = None
