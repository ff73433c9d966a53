"""Environments for the trainer tests (imported by dotted path, as env configs name them).

A random-weight model never answers a math question, so every reward would be 0 and no GRPO group
would carry a gradient. ``ParityToolEnv`` keeps ReTool's multi-turn tool path real (a forced code call
that runs in the sandbox, its output inserted as masked tokens) but rewards a property random text
varies on.
"""

from __future__ import annotations

from srt_agent.agent.retool import ReToolEnv

FORCED_CALL = "<code>\n```python\nprint(6 * 7)\n```\n</code>"


class ParityToolEnv(ReToolEnv):
    """ReTool with a forced first code call; reward 1 when the model's text has an even character sum."""

    def response_prefix(self) -> str:
        return FORCED_CALL

    def score(self) -> float:
        return float(sum(map(ord, self.model_text)) % 2 == 0)
