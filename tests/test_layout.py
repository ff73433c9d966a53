"""The package's layout holds: every import runs down the floors that docs/architecture.md draws (read from
its "Layers" diagram, so the page and the test cannot part), cli/ and bench/ included, and no module imports
another that imports it back; tests share code through tests/helpers/ only. Imports are read from the code:
every ``import`` and ``from … import`` in a file, those inside functions and under ``TYPE_CHECKING``
included. A registry's ``"module:Class"`` strings, imported on first use, are no imports, but they may not
climb a floor either."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "srt_agent"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
FLOOR_LINE = re.compile(r"^ ((?:\w+/ *)+)")  # a floor of the diagram: its packages, at the start of the line


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


def floors() -> dict[str, int]:
    """Each top-level package's floor in the diagram under "Layers, from the ground up" (0 is the ground;
    packages drawn on one line share a floor)."""
    text = ARCHITECTURE.read_text().split("## Layers, from the ground up", 1)[1]
    diagram = text.split("```", 2)[1]
    lines = [match.group(1).split() for match in map(FLOOR_LINE.match, diagram.splitlines()) if match]
    return {name.rstrip("/"): floor for floor, names in enumerate(reversed(lines)) for name in names}


def floor_of(module: str, floor: dict[str, int]) -> int | None:
    """The floor of the package `module` belongs to (None for the package's own face, srt_agent/__init__.py)."""
    parts = module.split(".")
    return floor[parts[1]] if len(parts) > 1 else None


def test_the_diagram_draws_every_package_once():
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert sorted(floors()) == packages


def test_every_import_of_the_package_names_a_module_that_exists():
    """A renamed or moved module leaves no import behind (the floors' checks skip what they cannot find)."""
    modules = {module_name(p) for p in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cpp")]}  # C++: extensions
    missing = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("srt_agent.")]
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("srt_agent")):
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1] if node.level else []
                targets = [".".join(base + ([node.module] if node.module else []))]
            else:
                continue
            missing += [f"{name} -> {t}" for t in targets if t not in modules]
    assert missing == []


def test_every_import_runs_down_the_floors():
    floor = floors()
    upward = []
    for name, deps in graph().items():
        own = floor_of(name, floor)
        for dep in deps:
            other = floor_of(dep, floor)
            if own is not None and other is not None and dep.split(".")[1] != name.split(".")[1] and other >= own:
                upward.append(f"{name} -> {dep}")
    assert sorted(upward) == []


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


REFERENCE = re.compile(r"^(srt_agent(?:\.\w+)+|\.+\w+(?:\.\w+)*)(?::\w+)?$")  # "pkg.module:attr" or ".module"
#: the one string that still climbs: the default ``env:`` class, the value users write in their YAML
CLIMBING_STRINGS = ["srt_agent.config.schema -> srt_agent.agent.retool.ReToolEnv"]


def string_references(path: Path) -> set[str]:
    """The srt_agent modules `path` names in a string (``"srt_agent.sources.verifiers:rollout"``,
    ``".drafters.srt:SRTDrafter"``): what a registry imports on first use."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (match := REFERENCE.match(node.value)):
            target = match.group(1)
            if target.startswith("."):
                parts, level = package.split("."), len(target) - len(target.lstrip("."))
                target = ".".join(parts[: len(parts) - level + 1] + [target.lstrip(".")])
            found.add(target)
    return found


def test_no_string_reference_climbs_a_floor():
    """A registry's ``"module:attr"`` entries name modules too: none names one on a floor above (each
    implementation registers itself where it lives)."""
    floor = floors()
    climbing = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        own = floor_of(name, floor)
        for target in string_references(path):
            top = target.split(".")[1] if "." in target else None
            if own is not None and top in floor and top != name.split(".")[1] and floor[top] >= own:
                climbing.append(f"{name} -> {target}")
    assert sorted(climbing) == CLIMBING_STRINGS


TESTS = PACKAGE.parent / "tests"


def test_tests_share_code_through_helpers_only():
    """Outside tests/helpers/ every file is a test module or a conftest, and no test module imports another
    (what tests share lives in tests/helpers/ or in fixtures)."""
    files = [p for p in TESTS.rglob("*.py") if "helpers" not in p.relative_to(TESTS).parts]
    assert [str(p) for p in files if not p.name.startswith("test_") and p.name != "conftest.py"] == []
    local = {p.stem for p in files}
    crossing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            crossing += [f"{path.relative_to(TESTS)} -> {n}" for n in names if n.split(".")[0] in local]
    assert crossing == []
