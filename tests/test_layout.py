"""The package's layout holds: the product imports nothing from the benchmarks, and no module imports
another that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "srt_agent"
MEASUREMENT = ("srt_agent.bench", "srt_agent.cli")  # the benchmarks, and the command line that runs them


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The srt_agent modules `path` imports, anywhere in the file (in functions and type-checking blocks
    too); ``from package import module`` counts as importing that module, not the package."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports(path, set(paths)) for name, path in paths.items()}


def test_the_product_imports_nothing_from_the_benchmarks():
    offenders = {
        name: sorted(m for m in deps if m.startswith("srt_agent.bench"))
        for name, deps in graph().items()
        if not name.startswith(MEASUREMENT)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_import_cycles():
    edges = graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name) :] + [name]))
        if name in done:
            return
        for dep in sorted(edges.get(name, ())):
            if not dep.startswith(name + "."):  # a package importing its own modules is no cycle
                visit(dep, path + [name])
        done.add(name)

    for name in sorted(edges):
        visit(name, [])
