"""The request bodies of the rollout server's endpoints and their validation: OpenAI's fields plus vLLM's
extras, every number held to the bounds vLLM's OpenAI server holds it to (a seed fits in 64 bits, token ids
are ids, penalties and log-probability counts in their ranges), and what the server does not do refused by
name (penalties and logit biases: sampling stays exactly on-policy), so a malformed request is answered 400
(:class:`RequestError`) before any backend sees it."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engine.params import INT64_MAX, INT64_MIN

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Field(ge=1, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
MAX_LOGPROBS = 20  # vLLM's default max_logprobs, OpenAI's top_logprobs cap


class RequestError(ValueError):
    """A request the server refuses; `status` is its HTTP status (400 unless said otherwise)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


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


Body = TypeVar("Body", bound=Sampling)


def parse_request(raw: bytes, model: type[Body]) -> Body:
    """The request body `raw` as `model`; a RequestError naming every field that does not validate."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestError(_validation_message(exc)) from None


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{key}: {err['msg']}")
    return "; ".join(parts)


def check_sampling(req: Sampling, model_name: str) -> None:
    """Refuse what this server does not serve: another model, several samples, penalties and biases."""
    if req.model != model_name:
        raise RequestError(f"the model {req.model!r} does not exist; this server serves {model_name!r}", 404)
    if (req.n or 1) != 1:
        raise RequestError("n must be 1 (open one session per sample)", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise RequestError(f"{name} is not supported: sampling stays exactly on-policy", param=name)
    if req.logit_bias:
        raise RequestError("logit_bias is not supported: sampling stays exactly on-policy", param="logit_bias")
    if req.repetition_penalty not in (None, 1, 1.0):
        raise RequestError("repetition_penalty is not supported", param="repetition_penalty")


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The completion request's one prompt (text or token ids); a 400 for what the endpoint does not support."""
    if req.echo:
        raise RequestError("echo is not supported", param="echo")
    if req.suffix:
        raise RequestError("suffix is not supported", param="suffix")
    if (req.best_of or 1) != 1:
        raise RequestError("best_of must be 1", param="best_of")
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise RequestError("one prompt per request (open one session per sample)", param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise RequestError("empty prompt", param="prompt")
    return prompt
