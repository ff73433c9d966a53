"""Sessions of the OpenAI-compatible server: one conversation's exact token history, and its trajectory.

A session holds the token list the backend has seen so far (prompt, sampled tokens, tokens the server
inserted from later messages) as a :class:`~srt_agent.agent.trajectory.Trajectory`, and the chat messages
(or completion text) that token list stands for, as the client was shown them. A request *extends* the
session when its messages are the session's messages plus new ones: only the new messages' tokens are
appended (the chat template's suffix for added turns, see :func:`srt_agent.agent.chat.added_turns_text`)
and the same backend request continues with the full token list, so no earlier token is ever re-tokenized.

Agent libraries re-send the assistant's replies in their own way, so a reply counts as the one returned
when it differs only by what cannot change the tokens the model sampled (:func:`reply_difference`): the
stop string that ended the turn added back (the sampled tokens hold it), surrounding whitespace, content as
a list of text parts, tool calls re-serialized (same names and parsed arguments; ids may be rewritten) and
extra fields (``name``, ``refusal``, ``reasoning_content``, ``annotations``, ``audio``). The session keeps
its own messages and tokens either way. Any other request starts a new *branch*: a fresh render of its
messages under a new backend request id, recorded as a new trajectory with the reason, which the response,
``GET /sessions/{sid}`` and the run's report show.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..agent.env import ToolCallRecord
from ..agent.hermes import ChatFormat
from ..agent.trajectory import Trajectory
from ..drafting.trees.keys import prompt_key
from .schema import RequestError

if TYPE_CHECKING:
    from ..engine import RequestOutput

SESSION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(content, where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}: only text content parts are supported, got {kind!r}", param="messages")
        return "".join(texts)
    raise RequestError(f"{where}: content must be a string or a list of text parts", param="messages")


def normalize_messages(messages: list) -> list[dict]:
    """Messages as the chat template gets them: role, text content, and name / tool_call_id / tool_calls where set."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}", param="messages")
        msg = {"role": role, "content": message_text(m.get("content"), where)}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = str(m[key])
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = m["tool_calls"]
        out.append(msg)
    if out[-1]["role"] == "assistant":
        raise RequestError("the last message is the assistant's: continuing a partial reply is not supported")
    return out


def _calls(calls) -> list:
    """Tool calls as (name, arguments) pairs, arguments parsed from their JSON text where they are JSON."""
    out = []
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            out.append(call)
            continue
        args = function.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass
        out.append((function.get("name"), args))
    return out


def reply_difference(sent: dict, kept: dict, stop: str | None = None) -> str | None:
    """Why `sent` is not the session's assistant reply `kept` as returned, or None when it is: the same text
    up to surrounding whitespace (or that text with `stop`, the stop string cut from it, added back) and the
    same tool calls by name and parsed arguments; other fields are ignored."""
    if sent["role"] != "assistant":
        return f"a {sent['role']} message where the session holds the assistant's reply"
    text, shown = sent["content"].strip(), kept["content"].strip()
    if text not in {shown, (kept["content"] + (stop or "")).strip()}:
        return f"the assistant's text differs from the reply as returned: {_difference(text, shown)}"
    if _calls(sent.get("tool_calls")) != _calls(kept.get("tool_calls")):
        return "the assistant's tool calls differ from the reply's (names or arguments)"
    return None


def message_difference(sent: dict, kept: dict, stop: str | None = None) -> str | None:
    """Why a message the client sent again is not the one the session holds, or None when it is (assistant
    replies as :func:`reply_difference` compares them, other messages exactly)."""
    if kept["role"] == "assistant":
        return reply_difference(sent, kept, stop)
    if sent == kept:
        return None
    if sent["role"] != kept["role"]:
        return f"a {sent['role']} message where the session holds a {kept['role']} message"
    fields = sorted(k for k in sent.keys() | kept.keys() if sent.get(k) != kept.get(k))
    return f"the {kept['role']} message's {', '.join(fields)} differ"


def _difference(sent: str, shown: str, context: int = 24) -> str:
    """Where two texts part: the character, and a little of each from a few characters before it."""
    at = next((i for i, (a, b) in enumerate(zip(sent, shown)) if a != b), min(len(sent), len(shown)))
    start = max(at - 8, 0)
    return f"from character {at}, sent {sent[start : at + context]!r}, returned {shown[start : at + context]!r}"


@dataclass
class Turn:
    """What a request will run: the backend request id, the full token list, the tokens it appends, and
    whether it starts a new branch (and why)."""

    request_id: str
    prompt_ids: list[int]
    forced_ids: list[int]
    new_branch: bool
    reason: str | None = None
    kept: int = 0  # chat: how many of the session's messages the request extends (0 on a new branch)


@dataclass
class Session:
    """One conversation: its branches (the last is current) and what the current one's tokens stand for."""

    sid: str
    prompt_key: object = None  # the backend's tree key: given, else set from the first prompt
    seed: int | None = None  # the sampling seed of requests that give none (None: a fresh one per request)
    branches: list[Trajectory] = field(default_factory=list)
    kind: str | None = None  # "chat" or "completion"
    messages: list[dict] = field(default_factory=list)  # chat: the messages the tokens render
    cut: dict[int, str] = field(default_factory=dict)  # chat: reply index -> the stop string cut from its text
    tools: list | None = None
    text: str = ""  # completions: the text the client was shown so far
    closed_by_eos: str | None = None  # text of the end-of-turn token that ended the last reply, if one did
    broken: str | None = None  # why the current branch cannot be extended (a failed turn)
    busy: bool = False
    ended: bool = False  # ended while a request ran: released when it finishes
    last_used: float = field(default_factory=time.monotonic)

    @property
    def current(self) -> Trajectory | None:
        return self.branches[-1] if self.branches else None

    @property
    def tokens(self) -> list[int]:
        t = self.current
        return t.prompt_ids + t.response_ids if t is not None else []

    def _request_id(self) -> str:
        return f"srt-session-{self.sid}-b{len(self.branches)}"

    def _why_new(self, kind: str) -> str | None:
        """Why the next request cannot extend the current branch, or None when it may."""
        if self.current is None:
            return "first request of the session"
        if self.broken:
            return self.broken
        if self.kind != kind:
            return f"the session switched from {self.kind} to {kind} requests"
        return None

    def plan_chat(self, chat: ChatFormat, messages: list[dict], tools: list | None, encode: Callable) -> Turn:
        """The turn for a chat request with `messages` (normalized), rendered as `chat` renders them; see the
        module docstring."""
        reason = self._why_new("chat") or self._chat_difference(messages, tools)
        if reason is None:
            n = len(self.messages)
            try:
                suffix = chat.added_turns(messages[n:], self.closed_by_eos, tools)
            except ValueError as exc:
                reason = str(exc)
            else:
                forced = encode(suffix)
                return Turn(self.current.request_id, self.tokens + forced, forced, False, kept=n)
        prompt = encode(chat.prompt(messages, tools))
        return Turn(self._request_id(), prompt, [], True, reason)

    def _chat_difference(self, messages: list[dict], tools: list | None) -> str | None:
        """Why `messages` (with `tools`) do not extend the session's conversation, or None when they do."""
        n = len(self.messages)
        if (tools or None) != self.tools:
            return "the tools differ from the session's"
        for i, (sent, kept) in enumerate(zip(messages, self.messages)):
            why = message_difference(sent, kept, self.cut.get(i))
            if why is not None:
                return f"the messages do not extend the session's conversation: message {i}: {why}"
        if len(messages) <= n:
            return f"the messages do not extend the session's conversation: {len(messages)} sent, {n} held"
        if any(m["role"] == "assistant" for m in messages[n:]):
            return "the added messages hold an assistant message the server did not write"
        return None

    def record_chat(self, turn: Turn, messages: list[dict], tools: list | None, reply: dict, cut: str | None) -> None:
        """After a chat turn: the conversation its tokens stand for, and the tool calls of its branch. An
        extended session keeps its own messages (replies as it returned them) and appends the new ones; a new
        branch holds the request's messages. `cut` is the stop string left out of the reply's text (the
        sampled tokens hold it). Tool messages answer the branch's open calls in order (ids may be rewritten)."""
        if turn.new_branch:
            self.cut = {}
        else:
            answers = [m for m in messages[turn.kept :] if m["role"] == "tool"]
            for call, answer in zip([c for c in self.current.tool_calls if c.status == "requested"], answers):
                call.status, call.output = "ok", answer["content"]
        self.messages = self.messages[: turn.kept] + messages[turn.kept :] + [reply]
        if cut:
            self.cut[len(self.messages) - 1] = cut
        self.kind, self.tools = "chat", tools
        for call in reply.get("tool_calls", []):
            arguments = _calls([call])[0][1]
            self.current.tool_calls.append(
                ToolCallRecord(
                    name=call["function"]["name"],
                    arguments=arguments if isinstance(arguments, dict) else {"arguments": arguments},
                    status="requested",  # until a tool message answers it
                    output="",
                    wall_s=0.0,
                    turn=self.current.num_turns - 1,
                )
            )

    def open_branch(self, turn: Turn) -> None:
        """Start the branch `turn` opens (its reason kept from the second branch on); the caller released the
        previous branch's backend request. The session's tree key comes from its first prompt unless given."""
        if self.prompt_key is None:
            self.prompt_key = prompt_key(turn.prompt_ids)
        self.branches.append(
            Trajectory(
                request_id=turn.request_id,
                task_index=0,
                sample_index=0,
                prompt_ids=list(turn.prompt_ids),
                finish_reason="done",
                branch_reason=turn.reason if self.branches else None,
            )
        )
        self.broken = None

    def record(self, turn: Turn, out: RequestOutput) -> None:
        """After a turn that generated: the tokens it inserted and sampled, in the current branch."""
        traj = self.current
        if turn.forced_ids:
            traj.append(list(turn.forced_ids))
            traj.observations += 1
        traj.append(list(out.token_ids), list(out.logprobs))
        traj.num_turns += 1
        traj.count(out.metrics)
        traj.finish_reason = "context" if out.finish_reason == "context" else "done"

    def plan_completion(self, prompt: str | list[int], encode: Callable) -> Turn:
        """The turn for a completion request: `prompt` extends the session when it starts with the session's
        token list (ids) or the text the client was shown (text)."""
        reason = self._why_new("completion")
        if reason is None:
            tokens = self.tokens
            if isinstance(prompt, list):
                if prompt[: len(tokens)] == tokens:
                    forced = prompt[len(tokens) :]
                    return Turn(self.current.request_id, list(prompt), forced, False)
                reason = "the prompt's token ids do not start with the session's token list"
            elif prompt.startswith(self.text):
                rest = prompt[len(self.text) :]
                forced = encode(rest) if rest else []
                return Turn(self.current.request_id, tokens + forced, forced, False)
            else:
                reason = "the prompt does not start with the session's text so far"
        ids = list(prompt) if isinstance(prompt, list) else encode(prompt, special=True)
        return Turn(self._request_id(), ids, [], True, reason)


class Sessions:
    """The server's sessions by id (thread-safe: the server's loop and a trainer's thread both reach them).

    At most `max_sessions` are kept; opening one more forgets the least recently used idle session. A
    session forgotten or ended has its backend request released (`release(request_id)`)."""

    def __init__(self, max_sessions: int, release: Callable[[str], None]):
        self.max_sessions = max_sessions
        self.release = release
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sid: str, create: bool = True, prompt_key=None, seed: int | None = None) -> Session | None:
        if not SESSION_ID.match(sid):
            raise RequestError(f"session id {sid!r}: use 1 to 128 letters, digits, '_', '.', ':' or '-'")
        forgotten = []
        with self._lock:
            session = self._sessions.get(sid)
            if session is None and create:
                session = self._sessions[sid] = Session(sid, prompt_key, seed)
                while len(self._sessions) > self.max_sessions:
                    idle = next((s for s in self._sessions.values() if not s.busy and s is not session), None)
                    if idle is None:
                        break
                    forgotten.append(self._sessions.pop(idle.sid))
            if session is not None:
                self._sessions.move_to_end(sid)
                session.last_used = time.monotonic()
        for old in forgotten:
            self.forget(old)
        return session

    def forget(self, session: Session) -> None:
        """Release the backend request of `session`'s current branch."""
        if session.current is not None:
            try:
                self.release(session.current.request_id)
            except Exception:  # noqa: BLE001 - a closed backend holds nothing
                pass

    @asynccontextmanager
    async def held(self, sid: str | None) -> AsyncIterator[Session]:
        """A request's session (a throw-away one without `sid`), held busy while the request runs; a
        session that is busy already is a 409."""
        if sid is None:
            session = Session(f"once-{uuid.uuid4().hex}")
        else:
            session = self.get(sid)
            if session.busy:
                raise RequestError(f"session {sid!r} has a request running: send a session's turns one at a time", 409)
        session.busy = True
        try:
            yield session
        finally:
            session.busy = False
            if sid is None or session.ended:
                self.forget(session)

    def end(self, sid: str) -> list[Trajectory]:
        """Close session `sid`: release its backend request; returns its branches (the last is current).

        A session whose request still runs (its agent gave up on it) is released when that request ends;
        what it returns is the branches as they stand now."""
        session = self.pop(sid)
        if session is None:
            return []
        if session.busy:
            session.ended = True
            return copy.deepcopy(session.branches)
        self.forget(session)
        return session.branches

    def pop(self, sid: str) -> Session | None:
        with self._lock:
            return self._sessions.pop(sid, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)
