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
:meth:`RolloutServer.end_session`. Faults stay with their request (:mod:`.routes`).

The parts, each a file: the routes (routes.py), request validation (schema.py), what a request's turn does
(endpoints.py) under the server's limits (sampling.py) through its tokenizer (text.py), the sessions
(sessions.py), and the answers (answers.py), streamed by one encoder (stream.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..agent.trajectory import Trajectory
from ..tools.threaded_server import served
from .endpoints import Endpoints
from .routes import create_app
from .sampling import TurnLimits
from .sessions import Session

if TYPE_CHECKING:
    import torch

    from ..backends import RolloutBackend


class RolloutServer:
    """The server over one backend: the FastAPI `app`, its sessions, and what a trainer calls between steps
    (`update_weights`, `end_step`, `end_session`). `running()` serves it from a background thread.

    `limits` bound every turn (:class:`~.sampling.TurnLimits`: context, vocabulary, end-of-turn tokens, a
    reply's and a session's branch's tokens; a request past them gets a 400); `max_sessions` caps the
    sessions kept (the least recently used idle one is forgotten beyond it); `owns_backend`: `close()`
    closes it.
    """

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer,
        *,
        model_name: str,
        limits: TurnLimits,
        max_sessions: int = 100_000,
        max_request_bytes: int = 32 << 20,
        owns_backend: bool = False,
    ):
        self.backend = backend
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.owns_backend = owns_backend
        self.endpoints = Endpoints(backend, tokenizer, model_name, limits, max_sessions)
        self.sessions = self.endpoints.sessions
        self.app = create_app(self.endpoints, max_request_bytes)

    @classmethod
    def from_config(cls, config, model: str | None = None, loaded=None, log=None, **options) -> RolloutServer:
        """Load the model (`loaded`, else `model`, else the config's) and start the backend the config's
        ``engine:`` section asks for; the server closes it on `close()`."""
        from ..backends import make_backend
        from ..models import load_model

        loaded = loaded or load_model(model or config.model, device=config.engine.device)
        backend = make_backend(config, loaded, log=log)
        limits = TurnLimits.of(loaded, config.engine.max_context)
        return cls(
            backend, loaded.tokenizer, model_name=model or config.model, limits=limits, owns_backend=True, **options
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
        return self.sessions.end(sid)

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
