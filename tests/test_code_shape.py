"""Every function in the package fits on a screen: none runs over 80 lines, so a reader never has to jump
within one to follow it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "srt_agent"
MAX_LINES = 80


def long_functions() -> list[str]:
    """``file:line name length`` of each function or method over MAX_LINES lines (decorators not counted)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_LINES:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} {length}")
    return found


def test_no_function_is_over_80_lines():
    assert long_functions() == []
