"""The OpenAI-compatible rollout server (`srt-agent serve`) and rollouts from agents written against the
`openai` client (:func:`run_agents`)."""

from .agents import AgentFunction, AgentRun, load_agent, run_agents, run_agents_async
from .server import SESSION_HEADER, RolloutServer
from .sessions import RequestError, Session

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
