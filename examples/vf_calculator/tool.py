"""The calculator tool server (MCP), run by verifiers as ``python -m vf_calculator.tool``."""

import ast
import operator

import verifiers.v1 as vf

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def evaluate(expression: str) -> float:
    """+, -, *, / and parentheses over numbers; ValueError on anything else."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression: {expression!r}")

    return walk(ast.parse(expression, mode="eval"))


class CalculatorToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * / and parentheses) and return the result."""
        try:
            value = evaluate(expression)
        except (ValueError, SyntaxError, ZeroDivisionError) as exc:
            return f"error: {exc}"
        return str(int(value)) if float(value).is_integer() else str(value)


if __name__ == "__main__":
    CalculatorToolset.run()
