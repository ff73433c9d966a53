"""What the rollout server's two generating endpoints do with a valid request: hold its session, plan the
turn (:mod:`.sessions`), bound it (:mod:`.sampling`), run it on the backend, record it in the session's
branch and answer it (:mod:`.answers`). A refused request raises :class:`~.schema.RequestError`; a failed
generation breaks its branch (the next request opens a new one) and is a 500 for that request only."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from ..agent.hermes import ChatFormat, parse_tool_calls
from ..engine import RequestOutput, SamplingParams
from .answers import ChatAnswer, CompletionAnswer
from .reply import Reply
from .sampling import TurnLimits
from .schema import ChatRequest, CompletionRequest, RequestError, check_sampling, completion_prompt
from .sessions import Session, Sessions, Turn, normalize_messages
from .text import TokenText

if TYPE_CHECKING:
    from ..backends import RolloutBackend


class Endpoints:
    """Chat and completion turns over one backend, served as `model_name` under `limits`, in `sessions`."""

    def __init__(self, backend: RolloutBackend, tokenizer, model_name: str, limits: TurnLimits, max_sessions: int):
        self.backend = backend
        self.text = TokenText(tokenizer)
        self.chat_format = ChatFormat.of(tokenizer)  # tools as Hermes text where the template cannot express them
        self.model_name = model_name
        self.limits = limits
        self.sessions = Sessions(max_sessions, backend.release)
        self.counts = {"requests": 0, "errors": 0, "new_branches": 0}
        self.created = int(time.time())

    async def chat(self, req: ChatRequest, sid: str | None):
        check_sampling(req, self.model_name)
        messages = normalize_messages(req.messages)
        tools = req.tools or None
        async with self.sessions.held(sid) as session:
            turn = session.plan_chat(self.chat_format, messages, tools, self.text.encode)
            params = self.limits.params(req, req.max_completion_tokens or req.max_tokens, session, turn)
            out = await self._generate(session, turn, params)
            content, cut = self.text.shown(out, req.include_stop_str_in_output, skip_special=True)
            calls = []
            if tools:  # the reply's tool calls as OpenAI's, the rest as its content
                content, calls = parse_tool_calls(content, lambda: f"call_{uuid.uuid4().hex[:24]}")
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            session.record_chat(turn, messages, tools, message, cut)
            session.current.messages = [dict(m) for m in session.messages]
            if not session.current.prompt:
                session.current.prompt = [dict(m) for m in messages]
            reply = self._reply("chatcmpl", session, sid, turn, out, content)
        if calls:
            reply.finish_reason = "tool_calls"
        answer = ChatAnswer(self.text, bool(req.logprobs))
        return answer.stream(reply, calls, _usage(req)) if req.stream else answer.body(reply, calls)

    async def completion(self, req: CompletionRequest, sid: str | None):
        check_sampling(req, self.model_name)
        prompt = completion_prompt(req)
        async with self.sessions.held(sid) as session:
            turn = session.plan_completion(prompt, self.text.encode)
            params = self.limits.params(req, req.max_tokens, session, turn)
            out = await self._generate(session, turn, params)
            text, _ = self.text.shown(out, req.include_stop_str_in_output, skip_special=False)
            if turn.new_branch:
                session.text = prompt if isinstance(prompt, str) else self.text.decode(turn.prompt_ids, False)
            elif isinstance(prompt, str):
                session.text = prompt
            else:
                session.text += self.text.decode(list(turn.forced_ids), False)
            session.text += text
            session.kind = "completion"
            reply = self._reply("cmpl", session, sid, turn, out, text)
        answer = CompletionAnswer(self.text, req.logprobs is not None)
        return answer.stream(reply, _usage(req)) if req.stream else answer.body(reply, out.stop_reason)

    async def _generate(self, session: Session, turn: Turn, params: SamplingParams) -> RequestOutput:
        """Run `turn` on the backend and record it in the session's current branch (a new one if it starts one)."""
        self.limits.check_prompt(turn)
        if turn.new_branch:
            self.sessions.forget(session)
            if session.branches:
                self.counts["new_branches"] += 1
            session.open_branch(turn)
        out = await self.backend.generate(turn.request_id, list(turn.prompt_ids), params, session.prompt_key)
        if out.finish_reason == "error" or out.error:
            session.broken = f"the session's previous turn failed ({out.error})"
            traj = session.current
            traj.finish_reason, traj.error = "error", out.error or "backend error"  # the rollout is not trained
            self.sessions.forget(session)
            if out.rejected:  # the backend refused what the request asked for
                raise RequestError(f"the backend refused the request: {out.error}")
            raise RequestError(f"generation failed: {out.error or 'backend error'}", 500)
        session.record(turn, out)
        last = out.token_ids[-1:] if out.token_ids else []
        eos = self.limits.eos_token_ids
        session.closed_by_eos = self.text.decode(last, False) if last and last[0] in eos else None
        return out

    def _reply(self, kind: str, session: Session, sid: str | None, turn: Turn, out: RequestOutput, text: str) -> Reply:
        """The turn's answer: `text` shown, with the ``srt`` object (session, branch, inserted tokens, counts)."""
        m = out.metrics
        srt = {
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
        finish = "length" if out.finish_reason in ("length", "context") else "stop"
        ids, logprobs = list(out.token_ids), list(out.logprobs)
        return Reply(
            f"{kind}-{uuid.uuid4().hex}", self.model_name, list(turn.prompt_ids), ids, logprobs, text, finish, srt
        )


def _usage(req) -> bool:
    """Whether a streamed answer ends with the usage chunk."""
    return bool((req.stream_options or {}).get("include_usage"))
