"""The languages the local sandbox runs: how each program is named, started and, for C++, compiled first.

A compiled language runs in two sandboxed phases, as SandboxFusion's runners do: the compiler in one sandbox
(its own time limit, `compile_timeout`), the binary it leaves in the working directory fetched back and run
in a fresh one (`run_timeout`). Which languages a machine offers depends on what is installed there
(:func:`available`); the interpreter of ``python`` is the sandbox's own (see sandbox_python.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .files import WORKDIR

PROGRAM_DIR = "/sandbox"  # where the program's file is mounted (read-only) inside the sandbox
PROGRAM = "{program}"  # stands for the program's path in a command
PYTHON = "{python}"  # stands for the sandbox's Python interpreter
BINARY = "main"  # what a compiler leaves in the working directory
COMPILE_MEMORY_MB = 2048  # compilers get at least this address space (cc1plus maps more than a small program)
# The environment every program starts with, in each sandbox (beside a PATH of the sandbox's own).
PROGRAM_ENV = {
    "HOME": WORKDIR,
    "TMPDIR": WORKDIR,
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


@dataclass(frozen=True)
class Language:
    """One language: its program's file name, the command that runs it and, when compiled, the compiler's.

    `run` and `compile` are argv lists; ``{program}`` is the program's path (the source, or the compiled
    binary), ``{python}`` the sandbox's interpreter. `extra_address_space_mb` is added to the memory limit's
    address-space cap (V8 reserves address space it never touches; the cgroup still caps the RAM)."""

    name: str
    source: str
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    extra_address_space_mb: int = 0

    @property
    def tools(self) -> tuple[str, ...]:
        """The host executables it needs (absolute paths of its commands)."""
        argv = (*self.run, *(self.compile or ()))
        return tuple(arg for arg in argv if arg.startswith("/") and arg != f"{PROGRAM_DIR}/{BINARY}")

    def program_path(self, compiled: bool) -> str:
        return f"{PROGRAM_DIR}/{BINARY if compiled else self.source}"


LANGUAGES: dict[str, Language] = {
    "python": Language("python", "main.py", (PYTHON, PROGRAM)),
    "bash": Language("bash", "main.sh", ("/bin/bash", PROGRAM)),
    "nodejs": Language("nodejs", "main.js", ("/usr/bin/node", PROGRAM), extra_address_space_mb=1024),
    "cpp": Language(
        "cpp",
        "main.cpp",
        (PROGRAM,),
        compile=("/usr/bin/g++", "-std=c++17", PROGRAM, "-o", BINARY, "-lpthread"),
    ),
}
INSTALL_HINTS = {"nodejs": "apt-get install nodejs", "cpp": "apt-get install g++"}


def find_language(name: str) -> Language:
    """The language called `name`; ValueError naming those there are."""
    if name not in LANGUAGES:
        raise ValueError(f"language {name!r} is not one of {tuple(LANGUAGES)}")
    return LANGUAGES[name]


def available() -> list[str]:
    """The languages whose tools are installed on this machine."""
    return [name for name, lang in LANGUAGES.items() if all(os.access(tool, os.X_OK) for tool in lang.tools)]


def missing_tools(name: str) -> str | None:
    """Why `name` cannot run here (a missing compiler or interpreter, and how to install it), or None."""
    lang = find_language(name)
    absent = [tool for tool in lang.tools if not os.access(tool, os.X_OK)]
    if not absent:
        return None
    hint = f" ({INSTALL_HINTS[name]})" if name in INSTALL_HINTS else ""
    return f"{name} needs {', '.join(absent)}, which this machine lacks{hint}"


def command(lang: Language, program: str, python: str, compiling: bool) -> list[str]:
    """The argv of one phase with the placeholders filled in."""
    argv = lang.compile if compiling else lang.run
    return [program if arg == PROGRAM else python if arg == PYTHON else arg for arg in argv]
