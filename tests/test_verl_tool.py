"""The tool configs in tools/ load through verl's own registry and run code (real verl classes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

registry = pytest.importorskip(
    "verl.tools.tool_registry", reason="verl is an optional extra: pip install 'srt-agent[verl]'"
)
from verl.tools.base_tool import BaseTool  # noqa: E402

from srt_agent.tools import LocalSandbox, SandboxResult  # noqa: E402
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


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_a_config_for_verls_former_sandbox_fusion_tool_works_unchanged(tmp_path):
    config = yaml.safe_load((TOOLS / "code_interpreter_verl_sandbox_fusion.yaml").read_text())
    with running_server(ServerConfig(LocalSandbox(timeout_s=5))) as url:
        config["tools"][0]["config"]["sandbox_fusion_url"] = f"{url}/run_code"
        path = tmp_path / "tools.yaml"
        path.write_text(yaml.safe_dump(config))
        (tool,) = registry.initialize_tools_from_config(str(path))
        sandbox = tool.interpreter.sandbox
        assert (sandbox.endpoint, sandbox.timeout_s, sandbox.memory_mb) == (url, 30, 1024)
        assert tool.max_concurrent == 128
        response, _, metrics = asyncio.run(call(tool, {"code": "print(sum(range(5)))"}))
    assert metrics["status"] == "ok" and response.text.strip() == "10"


def test_legacy_sandbox_fusion_keys_are_checked():
    from srt_agent.tools.interpreter import from_sandbox_fusion_tool_config

    assert from_sandbox_fusion_tool_config({"sandbox": "local", "timeout_s": 3}) == {"sandbox": "local", "timeout_s": 3}
    with pytest.raises(ValueError, match="python only"):
        from_sandbox_fusion_tool_config({"sandbox_fusion_url": "http://h:1/run_code", "default_language": "cpp"})
    with pytest.raises(ValueError, match="keep one"):
        from_sandbox_fusion_tool_config({"default_timeout": 3, "timeout_s": 4})
    with pytest.raises(ValueError, match="sandbox is 'local'"):
        from_sandbox_fusion_tool_config({"sandbox_fusion_url": "http://h:1/run_code", "sandbox": "local"})


def test_the_tool_caps_concurrent_programs():
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from srt_agent.integrations.verl.tool import CodeInterpreterTool

    schema = OpenAIFunctionToolSchema.model_validate(
        yaml.safe_load((TOOLS / "code_interpreter.yaml").read_text())["tools"][0]["tool_schema"]
    )
    tool = CodeInterpreterTool(
        {"sandbox_fusion_url": "http://127.0.0.1:9/run_code", "num_workers": 4, "rate_limit": 2}, schema
    )
    running, peak = 0, 0

    def execute(code):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        time.sleep(0.05)
        running -= 1
        return "done", SandboxResult(status="ok")

    tool.interpreter.execute = execute  # count overlapping runs instead of reaching a server

    async def many():
        return await asyncio.gather(*[tool.execute("i", {"code": "print(1)"}) for _ in range(6)])

    assert all(r[0].text == "done" for r in asyncio.run(many()))
    assert tool.max_concurrent == 2 and peak == 2
