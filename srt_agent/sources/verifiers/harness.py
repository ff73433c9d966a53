"""A verifiers (>= 0.4) harness that runs verifiers' own chat program with this Python instead of ``uv``.

verifiers' ``null`` harness is a plain chat loop with MCP tools (the bundled ``CHAT_PROGRAM_SOURCE``); it
prepares that program with ``uv sync --script``, which downloads an interpreter and packages. This harness
runs the same program, with the same arguments, under ``sys.executable`` (its imports: openai, mcp, httpx,
httpx2, tenacity, certifi come with ``verifiers`` itself), so nothing is downloaded at run time. Its id
for verifiers is ``srt_local_chat``: verifiers imports a harness id as a top-level module, so importing this
module registers it under that name too.
"""

from __future__ import annotations

import hashlib
import sys

from verifiers.v1.harnesses.null.harness import NullHarness, NullHarnessConfig
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE, launch_chat_program

HARNESS_ID = "srt_local_chat"


class _LocalPython:
    """The runtime, with ``prepare_uv_script`` writing the script and running it with ``sys.executable``."""

    def __init__(self, runtime):
        self._runtime = runtime

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script, env=None, *, activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f".vf-chat-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]


class LocalChatHarness(NullHarness):
    """verifiers' ``null`` chat loop (MCP tools, system prompt, tool interception), under this Python."""

    async def setup(self, runtime) -> None:
        return None

    async def launch(
        self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None
    ):  # verifiers' Harness.launch signature
        system_prompt, prompt = self.resolve_prompt(data)
        extra = [f"--tool-interception-url={tool_interception_url}"] if tool_interception_url else []
        return await launch_chat_program(
            CHAT_PROGRAM_SOURCE,
            self.config,
            ctx,
            trace,
            _LocalPython(runtime),
            endpoint,
            secret,
            mcp_urls,
            system_prompt,
            prompt,
            extra_args=extra,
        )


__all__ = ["LocalChatHarness", "NullHarnessConfig"]

sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])
