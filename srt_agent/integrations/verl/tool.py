"""`CodeInterpreterTool`: verl's `BaseTool` over srt-agent's code interpreter and sandboxes.

The tool configs in `tools/` name this class, so one file serves srt-agent (`load_tools`) and verl
(`actor_rollout_ref.rollout.multi_turn.tool_config_path=tools/code_interpreter.yaml`). The tool's
`config` section is `CodeInterpreter.from_config`'s: `sandbox` (local, sandbox_fusion, docker),
`max_output_chars` and the sandbox's options. Configs written for verl's former SandboxFusion tool
(`sandbox_fusion_url`, `default_timeout`, `memory_limit_mb`, `default_language`, `num_workers`,
`rate_limit`, `enable_global_rate_limit`) work unchanged: `num_workers` and `rate_limit` cap the
programs running at once, per process (verl's cluster-wide limiter actor is not reproduced).
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from ...tools import SANDBOX_FAULTS, CodeInterpreter


class CodeInterpreterTool(BaseTool):
    """Runs the `code` argument in the configured sandbox; the text is what the model sees."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self.interpreter = CodeInterpreter.from_config(config)
        caps = [int(config[k]) for k in ("num_workers", "rate_limit") if config.get(k)]
        if any(cap < 1 for cap in caps):
            raise ValueError(f"num_workers and rate_limit must be >= 1, got {caps}")
        self.max_concurrent = min(caps) if caps else None
        self._slots: asyncio.Semaphore | None = None

    def _slot(self) -> AbstractAsyncContextManager:
        """A slot under the concurrency cap (made on first use, inside the running event loop)."""
        if self.max_concurrent is None:
            return nullcontext()
        self._slots = self._slots or asyncio.Semaphore(self.max_concurrent)
        return self._slots

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run the program in a worker thread (the event loop keeps serving other trajectories).

        Returns (response, reward 0.0, metrics with the sandbox status, seconds, truncation and `sandbox_fault`:
        the interpreter's retries could not get past an overloaded or failed sandbox, so the call says nothing
        about the program). Bad arguments come back as a message to the model, never as an exception.
        """
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str) or not code.strip():
            return (
                ToolResponse(text="Error: the 'code' argument must be a non-empty string."),
                0.0,
                {"status": "bad_arguments"},
            )
        async with self._slot():
            text, result = await asyncio.to_thread(self.interpreter.execute, code)
        metrics = {"status": result.status, "seconds": result.wall_s, "truncated": result.truncated}
        metrics["sandbox_fault"] = result.status in SANDBOX_FAULTS
        return ToolResponse(text=text), 0.0, metrics
