"""The OpenAI-compatible rollout server (`srt-agent serve`) and rollouts from agents written against the
`openai` client (:func:`run_agents`)."""

from .agents import AgentFunction, AgentRun, load_agent, run_agents, run_agents_async
from .routes import SESSION_HEADER
from .schema import RequestError
from .server import RolloutServer
from .sessions import Session

__all__ = [
    "SESSION_HEADER",
    "AgentFunction",
    "AgentRun",
    "RequestError",
    "RolloutServer",
    "Session",
    "load_agent",
    "run_agents",
    "run_agents_async",
]
