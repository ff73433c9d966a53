"""verl-format tool configs become sandboxed tools; bad entries fail with the file and entry named."""

from __future__ import annotations

from pathlib import Path

import pytest

from srt_agent.agent.toolconfig import CodeInterpreterTool, load_tools
from srt_agent.config import ConfigError, InterpreterConfig
from srt_agent.tools import LocalSandbox

TOOLS = Path(__file__).resolve().parents[1] / "tools"

SCHEMA = """
    tool_schema:
      type: function
      function:
        name: {name}
        description: Run Python code.
        parameters:
          type: object
          properties: {{code: {{type: string}}}}
          required: [code]
"""


def write_tools(tmp_path, config: str, name: str = "code_interpreter") -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(
        f"tools:\n  - class_name: srt_agent.integrations.verl.CodeInterpreterTool\n{config}{SCHEMA.format(name=name)}"
    )
    return path


LOCAL = "    config:\n      type: native\n      sandbox: local\n      timeout_s: 5\n      max_output_chars: 64\n"


def test_code_interpreter_from_verl_config_runs_code_in_the_sandbox(tmp_path):
    tools = load_tools(write_tools(tmp_path, LOCAL))
    tool = tools["code_interpreter"]
    assert isinstance(tool, CodeInterpreterTool) and isinstance(tool.interpreter.sandbox, LocalSandbox)
    assert tool.interpreter.sandbox.timeout_s == 5
    assert tool.schema["function"]["name"] == "code_interpreter"
    result = tool({"code": "print(sum(range(10)))"})
    assert (result.text.strip(), result.status) == ("45", "ok")
    crash = tool({"code": "raise ValueError('bad')"})
    assert crash.status == "error" and "ValueError: bad" in crash.text
    long = tool({"code": "print('x' * 1000)"})
    assert len(long.text) <= 64 and "truncated" in long.text and long.truncated
    assert not result.truncated
    assert tool({"cmd": "ls"}).status == "bad_arguments"


def test_env_interpreter_section_overrides_the_tool_config(tmp_path):
    tools = load_tools(write_tools(tmp_path, LOCAL), InterpreterConfig(max_output_chars=32, timeout_s=2))
    tool = tools["code_interpreter"]
    assert tool.interpreter.max_output_chars == 32 and tool.interpreter.sandbox.timeout_s == 2


@pytest.mark.parametrize(
    "config, name, message",
    [
        (LOCAL, "web_search", r"tools.0: no tool named 'web_search' here"),
        ("    config: {type: mcp}\n", "code_interpreter", r"tools.0.config.type: only 'native'"),
        ("    config: {sandbox: nowhere}\n", "code_interpreter", r"tools.0.config: unknown sandbox kind 'nowhere'"),
        ("    config: {sandbox: local, colour: red}\n", "code_interpreter", r"tools.0.config: bad options"),
    ],
)
def test_bad_entries_name_file_and_entry(tmp_path, config, name, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_tools(write_tools(tmp_path, config, name))
    assert str(tmp_path / "tools.yaml") in str(info.value)


def test_schema_without_a_name_and_unknown_keys(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("tools:\n  - class_name: x\n    tool_schema: {type: function, function: {}}\n")
    with pytest.raises(ConfigError, match=r"t.yaml: tools.0.tool_schema.function.name: missing"):
        load_tools(path)
    path.write_text("tools:\n  - class_name: x\n    tool_schema: {}\n    extra: 1\n")
    with pytest.raises(ConfigError, match=r"t.yaml: tools.0.extra: Extra inputs are not permitted"):
        load_tools(path)


@pytest.mark.parametrize("path", sorted(TOOLS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_tool_configs_load(path):
    tools = load_tools(path)
    assert tools and all(t.name == name for name, t in tools.items())
