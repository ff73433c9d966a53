"""The tool configs in tools/ load through verl's own registry and run code (real verl classes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

registry = pytest.importorskip("verl.tools.tool_registry", reason="verl is an optional extra: pip install 'srt-agent[verl]'")
from verl.tools.base_tool import BaseTool  # noqa: E402

from srt_agent.tools import LocalSandbox  # noqa: E402
from srt_agent.tools.local import bwrap_path  # noqa: E402
from srt_agent.tools.server import ServerConfig, running_server  # noqa: E402

TOOLS = Path(__file__).resolve().parents[1] / "tools"


async def call(tool: BaseTool, parameters: dict):
    instance_id, _ = await tool.create()
    try:
        return await tool.execute(instance_id, parameters)
    finally:
        await tool.release(instance_id)


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_verl_builds_the_local_tool_and_runs_code():
    (tool,) = registry.initialize_tools_from_config(str(TOOLS / "code_interpreter.yaml"))
    assert isinstance(tool, BaseTool) and tool.name == "code_interpreter"
    response, reward, metrics = asyncio.run(call(tool, {"code": "print(6 * 7)"}))
    assert response.text.strip() == "42" and reward == 0.0 and metrics["status"] == "ok"
    response, _, metrics = asyncio.run(call(tool, {"code": "1 / 0"}))
    assert metrics["status"] == "error" and "ZeroDivisionError" in response.text
    response, _, metrics = asyncio.run(call(tool, {"source": "print(1)"}))
    assert metrics["status"] == "bad_arguments" and "'code'" in response.text


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_verl_builds_the_sandbox_fusion_tool_against_sandbox_serve(tmp_path):
    config = yaml.safe_load((TOOLS / "code_interpreter_sandbox_fusion.yaml").read_text())
    with running_server(ServerConfig(LocalSandbox(timeout_s=5))) as url:
        config["tools"][0]["config"]["endpoint"] = url
        path = tmp_path / "tools.yaml"
        path.write_text(yaml.safe_dump(config))
        (tool,) = registry.initialize_tools_from_config(str(path))
        response, _, metrics = asyncio.run(call(tool, {"code": "import sys\nprint('to stderr', file=sys.stderr)"}))
    assert metrics["status"] == "ok" and "to stderr" in response.text
