"""An OpenAI-compatible rollout server over a RolloutBackend: `srt-agent serve ENV.yaml`.

`POST /v1/chat/completions`, `POST /v1/completions` (both streaming over SSE or not) and `GET /v1/models`,
served by the backend the env config's ``engine:`` section picks (:func:`srt_agent.backends.make_backend`).
Besides OpenAI's fields every answer carries the token ids (``prompt_token_ids``, ``choices[i].token_ids``,
as vLLM's ``return_token_ids`` does), each sampled token's log-probability (``choices[i].token_logprobs``;
OpenAI's ``logprobs`` too when asked) and an ``srt`` object (session, branch, tokens inserted from messages).

Multi-turn sessions (see :mod:`srt_agent.serve.sessions`): the same endpoints under
``/sessions/{sid}/v1`` (or ``/v1`` with an ``X-SRT-Session`` header) keep the conversation's exact token
list, extend it by the new messages' tokens only, and record the trajectory (prompt ids, response ids, a
response mask that is 1 for sampled tokens and 0 for inserted ones, log-probs) that a trainer reads with
:meth:`RolloutServer.end_session`. Faults stay with their request: a bad request gets a 4xx with a message
in OpenAI's error shape, a failed generation a 500 for that request only.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from ..agent.hermes import ChatFormat, parse_tool_calls
from ..agent.trajectory import Trajectory
from ..drafting.trees.keys import prompt_key
from ..engine import RequestOutput, SamplingParams
from ..tools.server import BodyLimit
from ..tools.threaded_server import served
from .schema import ChatRequest, CompletionRequest, Sampling
from .sessions import RequestError, Session, Sessions, Turn, normalize_messages

if TYPE_CHECKING:
    import torch

    from ..backends import RolloutBackend

SESSION_HEADER = "x-srt-session"


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = {404: "model_not_found", 409: "session_busy"}.get(status)
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{key}: {err['msg']}")
    return "; ".join(parts)


class RolloutServer:
    """The server over one backend: the FastAPI `app`, its sessions, and what a trainer calls between steps
    (`update_weights`, `end_step`, `end_session`). `running()` serves it from a background thread.

    `max_context` bounds prompt and reply (a prompt that leaves no room gets a 400); `max_tokens_per_turn`
    caps a reply's tokens and `max_response_tokens` a session's branch's response (sampled and inserted
    tokens, as the env config's limits do; a request past it gets a 400); `max_sessions` caps the sessions
    kept (the least recently used idle one is forgotten beyond it); `owns_backend`: `close()` closes it.
    """

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer,
        *,
        model_name: str,
        max_context: int,
        eos_token_ids: list[int] = (),
        vocab_size: int | None = None,
        max_tokens_per_turn: int | None = None,
        max_response_tokens: int | None = None,
        max_sessions: int = 100_000,
        max_request_bytes: int = 32 << 20,
        owns_backend: bool = False,
    ):
        self.backend = backend
        self.tokenizer = tokenizer
        self.chat = ChatFormat.of(tokenizer)  # tools as Hermes text where the template cannot express them
        self.model_name = model_name
        self.max_context = max_context
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = vocab_size or len(tokenizer)
        self.max_tokens_per_turn = max_tokens_per_turn
        self.max_response_tokens = max_response_tokens
        self.owns_backend = owns_backend
        self.max_request_bytes = max_request_bytes
        self.sessions = Sessions(max_sessions, self._forget)
        self.counts = {"requests": 0, "errors": 0, "new_branches": 0}
        self.created = int(time.time())
        self.app = self._create_app()

    @classmethod
    def from_config(cls, config, model: str | None = None, loaded=None, log=None, **options) -> RolloutServer:
        """Load the model (`loaded`, else `model`, else the config's) and start the backend the config's
        ``engine:`` section asks for; the server closes it on `close()`."""
        from ..backends import make_backend
        from ..models import load_model

        loaded = loaded or load_model(model or config.model, device=config.engine.device)
        backend = make_backend(config, loaded, log=log)
        vocab = getattr(getattr(loaded.model, "config", None), "vocab_size", None)
        return cls(
            backend,
            loaded.tokenizer,
            model_name=model or config.model,
            max_context=config.engine.max_context,
            eos_token_ids=list(loaded.eos_token_ids),
            vocab_size=vocab,
            owns_backend=True,
            **options,
        )

    # ----- what a trainer calls -------------------------------------------------------------------

    def open_session(self, sid: str | None = None, prompt_key=None, seed: int | None = None) -> str:
        """A new session (id `sid`, else a fresh one); `prompt_key` is the backend's tree key for it
        (default: a hash of its first prompt's tokens), `seed` the sampling seed of its requests that give
        none. Its base URL is ``{url}/sessions/{sid}/v1``."""
        sid = sid or uuid.uuid4().hex
        if self.sessions.get(sid, create=False) is not None:
            raise ValueError(f"session {sid!r} exists")
        self.sessions.get(sid, prompt_key=prompt_key, seed=seed)
        return sid

    def session(self, sid: str) -> Session | None:
        return self.sessions.get(sid, create=False)

    def end_session(self, sid: str) -> list[Trajectory]:
        """Close session `sid`: release its backend request; returns its branches (the last is current).

        A session whose request still runs (its agent gave up on it) is released when that request ends;
        what it returns is the branches as they stand now."""
        session = self.sessions.pop(sid)
        if session is None:
            return []
        if session.busy:
            session.ended = True
            return copy.deepcopy(session.branches)
        self._forget(session)
        return session.branches

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights in place (blocking; call it between steps, from the trainer's thread)."""
        self.backend.update_weights(weights)

    def end_step(self) -> None:
        self.backend.end_step()

    def close(self) -> None:
        for sid in self.sessions.ids():
            self.end_session(sid)
        if self.owns_backend:
            self.backend.close()

    def _forget(self, session: Session) -> None:
        if session.current is not None:
            try:
                self.backend.release(session.current.request_id)
            except Exception:  # noqa: BLE001 - a closed backend holds nothing
                pass

    # ----- serving ---------------------------------------------------------------------------------

    @contextmanager
    def running(self, host: str = "127.0.0.1", port: int | None = None) -> Iterator[str]:
        """Serve from a background thread (on a free port unless given); yields the base URL (``http://host:port``)."""
        with served(self.app, "rollout server", host, port) as url:
            yield url

    def serve(self, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
        """Serve until interrupted."""
        import uvicorn

        uvicorn.run(self.app, host=host, port=port, log_level=log_level)

    def _create_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI):
            yield

        app = FastAPI(title="srt-agent rollout server (OpenAI-compatible)", lifespan=lifespan)
        app.add_middleware(BodyLimit, max_bytes=self.max_request_bytes)
        for prefix in ("", "/sessions/{sid}"):
            app.add_api_route(prefix + "/v1/models", self._models, methods=["GET"])
            app.add_api_route(prefix + "/v1/chat/completions", self._chat_endpoint, methods=["POST"])
            app.add_api_route(prefix + "/v1/completions", self._completion_endpoint, methods=["POST"])
        app.add_api_route("/sessions/{sid}", self._get_session, methods=["GET"])
        app.add_api_route("/sessions/{sid}", self._delete_session, methods=["DELETE"])
        app.add_api_route("/health", self._health, methods=["GET"])
        return app

    async def _health(self):
        """The backend's state: 200 when ready, 503 while it restarts or once it failed (the body says which)."""
        health = {**self.backend.health(), "requests": self.counts["requests"], "errors": self.counts["errors"]}
        return JSONResponse(health, 200 if health["status"] == "ready" else 503)

    async def _models(self) -> dict:
        model = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "srt-agent",
            "max_model_len": self.max_context,
        }
        return {"object": "list", "data": [model]}

    def _session_json(self, session: Session) -> dict:
        return {
            "session": session.sid,
            "kind": session.kind,
            "branches": [t.to_json() for t in session.branches],
            "branch_reasons": [t.branch_reason for t in session.branches[1:]],
            "messages": session.messages,
        }

    async def _get_session(self, sid: str):
        session = self.sessions.get(sid, create=False) if sid else None
        return self._session_json(session) if session else _error(404, f"no session {sid!r}")

    async def _delete_session(self, sid: str):
        session = self.sessions.get(sid, create=False)
        if session is None:
            return _error(404, f"no session {sid!r}")
        if session.busy:
            return _error(409, f"session {sid!r} has a request running")
        self.end_session(sid)
        return self._session_json(session)

    async def _chat_endpoint(self, request: Request):
        return await self._handle(request, ChatRequest, self._chat)

    async def _completion_endpoint(self, request: Request):
        return await self._handle(request, CompletionRequest, self._completion)

    async def _handle(self, request: Request, model: type[Sampling], run):
        """Parse, run, answer; every failure becomes this request's error response and nothing else's."""
        self.counts["requests"] += 1
        try:
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(f"the body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            try:
                req = model.model_validate(body)
            except ValidationError as exc:
                raise RequestError(_validation_message(exc)) from None
            sid = request.path_params.get("sid") or request.headers.get(SESSION_HEADER)
            return await run(req, sid)
        except RequestError as exc:
            self.counts["errors"] += 1
            return _error(exc.status, str(exc), exc.param)
        except Exception as exc:  # noqa: BLE001 - isolation: one request's fault answers that request only
            self.counts["errors"] += 1
            return _error(500, f"{type(exc).__name__}: {exc}")

    # ----- one request -----------------------------------------------------------------------------

    def _check(self, req: Sampling) -> None:
        if req.model != self.model_name:
            raise RequestError(f"the model {req.model!r} does not exist; this server serves {self.model_name!r}", 404)
        if (req.n or 1) != 1:
            raise RequestError("n must be 1 (open one session per sample)", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(req, name):
                raise RequestError(f"{name} is not supported: sampling stays exactly on-policy", param=name)
        if req.logit_bias:
            raise RequestError("logit_bias is not supported: sampling stays exactly on-policy", param="logit_bias")
        if req.repetition_penalty not in (None, 1, 1.0):
            raise RequestError("repetition_penalty is not supported", param="repetition_penalty")

    def _params(self, req: Sampling, max_tokens: int | None, session: Session, turn: Turn) -> SamplingParams:
        prompt_len = len(turn.prompt_ids)
        room = self.max_context - prompt_len
        if room < 1:
            raise RequestError(
                f"context too long: the prompt has {prompt_len} tokens and this server's context is {self.max_context}",
                param="messages",
            )
        caps = [room] + ([self.max_tokens_per_turn] if self.max_tokens_per_turn else [])
        if self.max_response_tokens:
            used = 0 if turn.new_branch else len(session.current.response_ids)
            left = self.max_response_tokens - used - len(turn.forced_ids)
            if left < 1:
                raise RequestError(
                    f"the session's response budget of {self.max_response_tokens} tokens is spent", param="messages"
                )
            caps.append(left)
        cap = min(caps)
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        outside = [t for t in req.stop_token_ids or [] if t >= self.vocab_size]
        if outside:
            raise RequestError(
                f"stop_token_ids outside the vocabulary [0, {self.vocab_size}): {outside[:5]}", param="stop_token_ids"
            )
        try:
            return SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(req.top_k or 0, 0),
                max_tokens=cap if max_tokens is None else min(max_tokens, cap),
                seed=req.seed if req.seed is not None else session.seed,
                stop=stop,
                stop_token_ids=([] if req.ignore_eos else self.eos_token_ids) + list(req.stop_token_ids or []),
                include_stop_str_in_output=True,  # the tokens keep it; the text shown is cut here
                ignore_eos=req.ignore_eos,
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    def _encode(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def _decode(self, ids: list[int], skip_special: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    @asynccontextmanager
    async def _using(self, sid: str | None):
        """The request's session (a throw-away one without `sid`), held busy while the request runs."""
        if sid is None:
            session = Session(f"once-{uuid.uuid4().hex}")
        else:
            session = self.sessions.get(sid)
            if session.busy:
                raise RequestError(f"session {sid!r} has a request running: send a session's turns one at a time", 409)
        session.busy = True
        try:
            yield session
        finally:
            session.busy = False
            if sid is None or session.ended:
                self._forget(session)

    async def _generate(self, session: Session, turn: Turn, params: SamplingParams) -> RequestOutput:
        """Run `turn` on the backend and record it in the session's current branch (a new one if it starts one)."""
        bad = [
            t for t in turn.prompt_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size
        ]
        if bad:
            raise RequestError(f"token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}", param="prompt")
        if not turn.prompt_ids:
            raise RequestError("empty prompt", param="prompt")
        if turn.new_branch:
            self._forget(session)
            if session.branches:
                self.counts["new_branches"] += 1
            if session.prompt_key is None:
                session.prompt_key = prompt_key(turn.prompt_ids)
            session.branches.append(
                Trajectory(
                    request_id=turn.request_id,
                    task_index=0,
                    sample_index=0,
                    prompt_ids=list(turn.prompt_ids),
                    finish_reason="done",
                    branch_reason=turn.reason if session.branches else None,
                )
            )
            session.broken = None
        traj = session.current
        out = await self.backend.generate(turn.request_id, list(turn.prompt_ids), params, session.prompt_key)
        if out.finish_reason == "error" or out.error:
            session.broken = f"the session's previous turn failed ({out.error})"
            traj.finish_reason, traj.error = "error", out.error or "backend error"  # the rollout is not trained
            self._forget(session)
            if out.rejected:  # the backend refused what the request asked for
                raise RequestError(f"the backend refused the request: {out.error}")
            raise RequestError(f"generation failed: {out.error or 'backend error'}", 500)
        if turn.forced_ids:
            traj.append(list(turn.forced_ids))
            traj.observations += 1
        traj.append(list(out.token_ids), list(out.logprobs))
        traj.num_turns += 1
        m = out.metrics
        traj.forwards += m.forwards
        traj.draft_proposed += m.draft_proposed
        traj.draft_accepted += m.draft_accepted
        traj.prefill_tokens += m.prefill_tokens
        traj.prefill_reused += m.prefill_reused
        traj.finish_reason = "context" if out.finish_reason == "context" else "done"
        last = out.token_ids[-1:] if out.token_ids else []
        session.closed_by_eos = self._decode(last, False) if last and last[0] in self.eos_token_ids else None
        return out

    def _shown(self, out: RequestOutput, req: Sampling, skip_special: bool) -> tuple[str, str | None]:
        """The reply's text as the client sees it (cut before the stop string unless it asked to keep it), and
        the stop string cut from it (None when nothing was cut)."""
        text = self._decode(list(out.token_ids), skip_special)
        if out.finish_reason == "stop" and isinstance(out.stop_reason, str) and not req.include_stop_str_in_output:
            at = text.find(out.stop_reason)
            if at >= 0:
                return text[:at], out.stop_reason
        return text, None

    def _srt(self, session: Session, sid: str | None, turn: Turn, out: RequestOutput) -> dict:
        m = out.metrics
        return {
            "session": sid,
            "request_id": turn.request_id,
            "branch": len(session.branches) - 1,
            "new_branch": turn.new_branch,
            "branch_reason": turn.reason if sid is not None else None,
            "forced_token_ids": list(turn.forced_ids),
            "finish_reason": out.finish_reason,
            "prefill_tokens": m.prefill_tokens,
            "prefill_reused": m.prefill_reused,
            "forwards": m.forwards,
        }

    @staticmethod
    def _finish_reason(out: RequestOutput) -> str:
        return "length" if out.finish_reason in ("length", "context") else "stop"

    def _pieces(self, ids: list[int], text: str, skip_special: bool) -> list[str]:
        """`text` split over `ids`, one piece per token (possibly empty), in the order the tokens spell it."""
        pieces, emitted = [], 0
        for i in range(len(ids)):
            prefix = self._decode(ids[: i + 1], skip_special)
            end = min(len(prefix), len(text))
            if prefix.endswith("\ufffd") or end < emitted or not text.startswith(prefix[:end]):
                pieces.append("")
                continue
            pieces.append(text[emitted:end])
            emitted = end
        if pieces:
            pieces[-1] += text[emitted:]
        return pieces

    def _token_entry(self, token: int, logprob: float) -> dict:
        piece = self._decode([token], False)
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode()), "top_logprobs": []}

    async def _chat(self, req: ChatRequest, sid: str | None):
        self._check(req)
        messages = normalize_messages(req.messages)
        tools = req.tools or None
        async with self._using(sid) as session:
            turn = session.plan_chat(self.chat, messages, tools, self._encode)
            params = self._params(req, req.max_completion_tokens or req.max_tokens, session, turn)
            out = await self._generate(session, turn, params)
            content, cut = self._shown(out, req, skip_special=True)
            calls = []
            if tools:  # the reply's tool calls as OpenAI's, the rest as its content
                content, calls = parse_tool_calls(content, lambda: f"call_{uuid.uuid4().hex[:24]}")
            reply = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            session.record_chat(turn, messages, tools, reply, cut)
            session.current.messages = [dict(m) for m in session.messages]
            if not session.current.prompt:
                session.current.prompt = [dict(m) for m in messages]
            srt = self._srt(session, sid, turn, out)
        ids, lps = list(out.token_ids), list(out.logprobs)
        usage = {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model_name}
        finish = "tool_calls" if calls else self._finish_reason(out)
        if not req.stream:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": content or None, "tool_calls": calls}
                if calls
                else {"role": "assistant", "content": content},
                "logprobs": {"content": [self._token_entry(t, lp) for t, lp in zip(ids, lps)]}
                if req.logprobs
                else None,
                "finish_reason": finish,
                "token_ids": ids,
                "token_logprobs": lps,
            }
            body = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            return {**body, "prompt_token_ids": list(turn.prompt_ids), "srt": srt}

        def chunk(choice: dict | None, **extra) -> str:
            body = {**head, "object": "chat.completion.chunk", "choices": [choice] if choice else [], **extra}
            return f"data: {json.dumps(body)}\n\n"

        def events() -> Iterator[str]:
            yield chunk(
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
                prompt_token_ids=list(turn.prompt_ids),
            )
            if calls:  # the tokens in one chunk with the content outside the calls, then the calls
                logprobs = {"content": [self._token_entry(t, lp) for t, lp in zip(ids, lps)]} if req.logprobs else None
                delta = {"index": 0, "delta": {"content": content}, "logprobs": logprobs, "finish_reason": None}
                yield chunk({**delta, "token_ids": ids, "token_logprobs": lps})
                deltas = [{"index": i, **call} for i, call in enumerate(calls)]
                yield chunk({"index": 0, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None})
            for t, lp, piece in zip(ids, lps, self._pieces(ids, content, True)) if not calls else ():
                logprobs = {"content": [self._token_entry(t, lp)]} if req.logprobs else None
                yield chunk(
                    {
                        "index": 0,
                        "delta": {"content": piece},
                        "logprobs": logprobs,
                        "finish_reason": None,
                        "token_ids": [t],
                        "token_logprobs": [lp],
                    }
                )
            done = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}
            yield chunk(done, srt=srt)
            if (req.stream_options or {}).get("include_usage"):
                yield chunk(None, usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @staticmethod
    def _completion_prompt(req: CompletionRequest) -> str | list[int]:
        """The request's one prompt (text or token ids); a 400 for what the endpoint does not support."""
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

    async def _completion(self, req: CompletionRequest, sid: str | None):
        self._check(req)
        prompt = self._completion_prompt(req)
        async with self._using(sid) as session:
            turn = session.plan_completion(prompt, self._encode)
            params = self._params(req, req.max_tokens, session, turn)
            out = await self._generate(session, turn, params)
            text, _ = self._shown(out, req, skip_special=False)
            if turn.new_branch:
                session.text = prompt if isinstance(prompt, str) else self._decode(turn.prompt_ids, False)
            elif isinstance(prompt, str):
                session.text = prompt
            else:
                session.text += self._decode(list(turn.forced_ids), False)
            session.text += text
            session.kind = "completion"
            srt = self._srt(session, sid, turn, out)
        return self._completion_answer(req, turn, out, text, srt)

    def _completion_answer(self, req: CompletionRequest, turn: Turn, out: RequestOutput, text: str, srt: dict):
        """The completion's answer in OpenAI's shape: one body, or its tokens as SSE events when streamed."""
        ids, lps = list(out.token_ids), list(out.logprobs)
        pieces = self._pieces(ids, text, False)
        usage = {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model_name}

        def legacy(start: int, toks: list[int], logs: list[float], parts: list[str]) -> dict | None:
            if req.logprobs is None:
                return None
            offsets, at = [], start
            for piece in parts:
                offsets.append(at)
                at += len(piece)
            names = [self._decode([t], False) for t in toks]
            return {"tokens": names, "token_logprobs": logs, "top_logprobs": None, "text_offset": offsets}

        if not req.stream:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": legacy(0, ids, lps, pieces),
                "finish_reason": self._finish_reason(out),
                "stop_reason": out.stop_reason,
                "prompt_token_ids": list(turn.prompt_ids),
                "token_ids": ids,
                "token_logprobs": lps,
            }
            return {**head, "object": "text_completion", "choices": [choice], "usage": usage, "srt": srt}

        def chunk(choice: dict | None, **extra) -> str:
            body = {**head, "object": "text_completion", "choices": [choice] if choice else [], **extra}
            return f"data: {json.dumps(body)}\n\n"

        def events() -> Iterator[str]:
            at = 0
            for i, (t, lp, piece) in enumerate(zip(ids, lps, pieces)):
                choice = {
                    "index": 0,
                    "text": piece,
                    "logprobs": legacy(at, [t], [lp], [piece]),
                    "finish_reason": None,
                    "token_ids": [t],
                    "token_logprobs": [lp],
                }
                if i == 0:
                    choice["prompt_token_ids"] = list(turn.prompt_ids)
                at += len(piece)
                yield chunk(choice)
            done = {"index": 0, "text": "", "logprobs": None, "finish_reason": self._finish_reason(out)}
            if not ids:
                done["prompt_token_ids"] = list(turn.prompt_ids)
            yield chunk(done, srt=srt)
            if (req.stream_options or {}).get("include_usage"):
                yield chunk(None, usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
