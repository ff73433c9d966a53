"""Agent environments, the ReTool multi-turn controller, parsing, rewards, datasets and rollouts."""

from ..config import ConfigError, EnvConfig, RewardConfig, load_env_config
from ..config.tasks import Task, load_tasks, save_tasks
from .controller import MultiTurnController
from .env import Env, FunctionTool, StepResult, Tool, ToolCallRecord, ToolResult
from .parsing import ParseError, ToolCall, extract_boxed, parse_tool_call
from .retool import ReToolEnv
from .rewards import answers_match, score_response
from .rollout import (
    RolloutSummary,
    build_controller,
    run_rollouts,
    summarize,
    write_jsonl,
)
from .toolconfig import load_tools
from .trajectory import Trajectory

__all__ = [
    "ConfigError",
    "Env",
    "EnvConfig",
    "FunctionTool",
    "MultiTurnController",
    "ParseError",
    "ReToolEnv",
    "RewardConfig",
    "RolloutSummary",
    "StepResult",
    "Task",
    "Tool",
    "ToolCall",
    "ToolCallRecord",
    "ToolResult",
    "Trajectory",
    "answers_match",
    "build_controller",
    "extract_boxed",
    "load_env_config",
    "load_tasks",
    "load_tools",
    "parse_tool_call",
    "run_rollouts",
    "save_tasks",
    "score_response",
    "summarize",
    "write_jsonl",
]
