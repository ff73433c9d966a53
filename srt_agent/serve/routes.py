"""The rollout server's HTTP routes: `POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`
(the same under ``/sessions/{sid}/v1``, or under ``/v1`` with an ``X-SRT-Session`` header), `GET` and
`DELETE /sessions/{sid}` (a session's branches and messages) and `GET /health`.

Faults stay with their request: a refused request is answered in OpenAI's error shape (4xx, the message
and the parameter at fault), any other failure is a 500 for that request only; bodies over the server's
byte limit are refused (413) before they are read.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..tools.server import BodyLimit
from .endpoints import Endpoints
from .schema import ChatRequest, CompletionRequest, RequestError, parse_request
from .sessions import Session

SESSION_HEADER = "x-srt-session"


def create_app(endpoints: Endpoints, max_request_bytes: int) -> FastAPI:
    """The FastAPI app serving `endpoints`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield

    routes = _Routes(endpoints)
    app = FastAPI(title="srt-agent rollout server (OpenAI-compatible)", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    for prefix in ("", "/sessions/{sid}"):
        app.add_api_route(prefix + "/v1/models", routes.models, methods=["GET"])
        app.add_api_route(prefix + "/v1/chat/completions", routes.chat, methods=["POST"])
        app.add_api_route(prefix + "/v1/completions", routes.completion, methods=["POST"])
    app.add_api_route("/sessions/{sid}", routes.get_session, methods=["GET"])
    app.add_api_route("/sessions/{sid}", routes.delete_session, methods=["DELETE"])
    app.add_api_route("/health", routes.health, methods=["GET"])
    return app


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    """An error answer in OpenAI's shape."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = {404: "model_not_found", 409: "session_busy"}.get(status)
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


class _Routes:
    """The handlers, over the server's endpoints."""

    def __init__(self, endpoints: Endpoints):
        self.endpoints = endpoints

    async def chat(self, request: Request):
        return await self._handle(request, ChatRequest, self.endpoints.chat)

    async def completion(self, request: Request):
        return await self._handle(request, CompletionRequest, self.endpoints.completion)

    async def _handle(self, request: Request, model: type, run):
        """Parse, run, answer; every failure becomes this request's error response and nothing else's."""
        counts = self.endpoints.counts
        counts["requests"] += 1
        try:
            req = parse_request(await request.body(), model)
            sid = request.path_params.get("sid") or request.headers.get(SESSION_HEADER)
            return await run(req, sid)
        except RequestError as exc:
            counts["errors"] += 1
            return _error(exc.status, str(exc), exc.param)
        except Exception as exc:  # noqa: BLE001 - isolation: one request's fault answers that request only
            counts["errors"] += 1
            return _error(500, f"{type(exc).__name__}: {exc}")

    async def health(self):
        """The backend's state: 200 when ready, 503 while it restarts or once it failed (the body says which)."""
        counts = self.endpoints.counts
        health = {**self.endpoints.backend.health(), "requests": counts["requests"], "errors": counts["errors"]}
        return JSONResponse(health, 200 if health["status"] == "ready" else 503)

    async def models(self) -> dict:
        e = self.endpoints
        model = {
            "id": e.model_name,
            "object": "model",
            "created": e.created,
            "owned_by": "srt-agent",
            "max_model_len": e.limits.max_context,
        }
        return {"object": "list", "data": [model]}

    async def get_session(self, sid: str):
        session = self.endpoints.sessions.get(sid, create=False) if sid else None
        return _session_json(session) if session else _error(404, f"no session {sid!r}")

    async def delete_session(self, sid: str):
        sessions = self.endpoints.sessions
        session = sessions.get(sid, create=False)
        if session is None:
            return _error(404, f"no session {sid!r}")
        if session.busy:
            return _error(409, f"session {sid!r} has a request running")
        sessions.end(sid)
        return _session_json(session)


def _session_json(session: Session) -> dict:
    """A session as `GET /sessions/{sid}` shows it: its branches, why each new one started, its messages."""
    return {
        "session": session.sid,
        "kind": session.kind,
        "branches": [t.to_json() for t in session.branches],
        "branch_reasons": [t.branch_reason for t in session.branches[1:]],
        "messages": session.messages,
    }
