"""Tool configs in verl's format (``tools/*.yaml``) turned into tools for the controller.

A file lists ``tools: - class_name, config: {type: native, ...}, tool_schema: {type: function, function:
{name, ...}}``. Tools are built by their schema's function name: ``code_interpreter`` becomes a
:class:`CodeInterpreterTool` over ``make_sandbox(config.sandbox, **options)``; its config may set
``sandbox`` (the kind, default ``local``), ``max_output_chars`` and any option of that sandbox kind
(e.g. ``timeout_s``, ``memory_mb``, ``endpoint``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..config import ConfigError, InterpreterConfig, read_yaml, validate_config
from .env import Tool, ToolResult
from .parsing import CODE_TOOL_NAME


class ToolEntry(BaseModel):
    """One entry of a verl tool config."""

    model_config = ConfigDict(extra="forbid")

    class_name: str
    config: dict[str, Any] = Field(default_factory=dict)
    tool_schema: dict[str, Any]

    @property
    def function_name(self) -> str | None:
        function = self.tool_schema.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return name if isinstance(name, str) else None


class ToolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[ToolEntry]


@dataclass
class CodeInterpreterTool:
    """The ``code_interpreter`` tool: runs ``arguments["code"]`` through a CodeInterpreter."""

    interpreter: Any  # srt_agent.tools.CodeInterpreter
    schema: dict
    name: str = CODE_TOOL_NAME

    def __call__(self, arguments: dict) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult('Error: the code interpreter needs a string argument "code".', "bad_arguments")
        from srt_agent.tools import SANDBOX_FAULTS, format_result

        text, result = self.interpreter.execute(code)
        cut = text != format_result(result, sys.maxsize)  # the interpreter's character cap
        return ToolResult(text, result.status, result.truncated or cut, fault=result.status in SANDBOX_FAULTS)


def build_code_interpreter(entry: ToolEntry, interpreter: InterpreterConfig | None) -> Tool:
    """A sandboxed code interpreter from a ``code_interpreter`` entry (env overrides applied)."""
    from srt_agent.tools import CodeInterpreter

    config = dict(entry.config)
    if interpreter is not None:
        config["max_output_chars"] = interpreter.max_output_chars
        if interpreter.timeout_s is not None:
            config["timeout_s"] = interpreter.timeout_s
    return CodeInterpreterTool(CodeInterpreter.from_config(config), entry.tool_schema)


def require_sandbox_runtime(tools: dict[str, Tool]) -> None:
    """For training: a SandboxUnavailable, one line naming the folder to open or the variable to set, when a
    tool's sandbox was asked for the sandbox runtime (built, or named by $SRT_SANDBOX_RUNTIME) but cannot
    use it. Programs would run without numpy and sympy, and model code importing them be scored wrong."""
    from srt_agent.tools import SandboxUnavailable

    for tool in tools.values():
        sandbox = getattr(getattr(tool, "interpreter", None), "sandbox", None)
        problem = sandbox.check_runtime() if hasattr(sandbox, "check_runtime") else None
        if problem:
            raise SandboxUnavailable(
                f"{problem} (training stops here: without it model code importing numpy or sympy is scored wrong)"
            )


TOOL_BUILDERS: dict[str, Callable[[ToolEntry, InterpreterConfig | None], Tool]] = {
    CODE_TOOL_NAME: build_code_interpreter,
}


def load_tools(path: str | Path, interpreter: InterpreterConfig | None = None) -> dict[str, Tool]:
    """Build every tool of a verl tool config, keyed by function name; errors name the file and entry."""
    path = Path(path)
    spec = validate_config(ToolsFile, read_yaml(path), path)
    tools: dict[str, Tool] = {}
    for i, entry in enumerate(spec.tools):
        name = entry.function_name
        if name is None:
            raise ConfigError(f"{path}: tools.{i}.tool_schema.function.name: missing (every tool needs a name)")
        if entry.config.get("type", "native") != "native":
            raise ConfigError(
                f"{path}: tools.{i}.config.type: only 'native' tools run here, got {entry.config['type']!r}"
            )
        builder = TOOL_BUILDERS.get(name)
        if builder is None:
            raise ConfigError(
                f"{path}: tools.{i}: no tool named {name!r} here (known: {', '.join(sorted(TOOL_BUILDERS))})"
            )
        if name in tools:
            raise ConfigError(f"{path}: tools.{i}: tool {name!r} is defined twice")
        try:
            tools[name] = builder(entry, interpreter)
        except ValueError as exc:
            raise ConfigError(f"{path}: tools.{i}.config: {exc}") from None
    return tools
