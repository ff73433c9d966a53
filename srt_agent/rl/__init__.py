"""RL training with SRT rollouts: ReTool's cold start, GRPO / DAPO / PPO, checkpoints and reports.

Import the pieces from their modules (``srt_agent.rl.trainer.Trainer``, ``srt_agent.rl.algorithms``, …);
this package's own namespace resolves them lazily, so importing one module does not load the trainer.
The ``train:`` and ``cold_start:`` config sections are in :mod:`srt_agent.config`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Trainer": "trainer",
    "Policy": "policy",
    "Sample": "batch",
    "pack": "batch",
    "PromptSampler": "data",
    "ToolUseReport": "evaluate",
    "tool_use_report": "evaluate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
