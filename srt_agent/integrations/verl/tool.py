"""`CodeInterpreterTool`: verl's `BaseTool` over srt-agent's code interpreter and sandboxes.

The tool configs in `tools/` name this class, so one file serves srt-agent (`load_tools`) and verl
(`actor_rollout_ref.rollout.multi_turn.tool_config_path=tools/code_interpreter.yaml`). The tool's
`config` section is `CodeInterpreter.from_config`'s: `sandbox` (local, sandbox_fusion, docker),
`max_output_chars` and the sandbox's options.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from ...tools import CodeInterpreter


class CodeInterpreterTool(BaseTool):
    """Runs the `code` argument in the configured sandbox; the text is what the model sees."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self.interpreter = CodeInterpreter.from_config(config)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run the program in a worker thread (the event loop keeps serving other trajectories).

        Returns (response, reward 0.0, metrics with the sandbox status, seconds and truncation).
        Bad arguments come back as a message to the model, never as an exception.
        """
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: the 'code' argument must be a non-empty string."), 0.0, {"status": "bad_arguments"}
        text, result = await asyncio.to_thread(self.interpreter.execute, code)
        metrics = {"status": result.status, "seconds": result.wall_s, "truncated": result.truncated}
        return ToolResponse(text=text), 0.0, metrics
