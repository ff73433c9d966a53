"""The sandbox runtime: sandboxed programs get its pinned libraries and nothing of the trainer's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srt_agent.tools import LocalSandbox, SandboxResult
from srt_agent.tools.base import is_memory_error
from srt_agent.tools.local import RUNTIME_MOUNT, bwrap_path
from srt_agent.tools.runtime import DESCRIBE_PROGRAM, RUNTIME_ENV, runtime_dir, runtime_python, venv_of

REPOSITORY = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPOSITORY / "srt_agent" / "tools" / "sandbox_runtime.txt"
INSTALL = REPOSITORY / "scripts" / "install_sandbox_runtime.sh"

pytestmark = [
    pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.skipif(
        runtime_python() is None, reason="the sandbox runtime is not built: bash scripts/install_sandbox_runtime.sh"
    ),
]


def pins() -> dict[str, str]:
    entries = (line.partition("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return dict(entry.lower().split("==") for entry in entries if entry)


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox(timeout_s=30, memory_mb=1024)


@pytest.fixture(scope="module")
def described(sandbox) -> dict:
    """What a sandboxed program sees of its interpreter and packages."""
    result = sandbox.run(DESCRIBE_PROGRAM)
    assert result.ok, result
    return json.loads(result.stdout)


def test_the_runtime_is_the_default_interpreter(sandbox, described):
    assert sandbox.interpreter == runtime_python()
    assert (described["prefix"], described["executable"]) == (RUNTIME_MOUNT, f"{RUNTIME_MOUNT}/bin/python")


def test_rollouts_and_training_use_it(tmp_path):
    """`srt-agent rollout` and `train` build their interpreter from the env's tool config: the shipped
    one runs on the runtime, and a config's `python:` picks another."""
    from srt_agent.agent.toolconfig import load_tools

    shipped = load_tools(REPOSITORY / "tools" / "code_interpreter.yaml")["code_interpreter"]
    assert shipped.interpreter.sandbox.interpreter == runtime_python()
    if not Path("/usr/bin/python3").is_file():
        pytest.skip("machine: no /usr/bin/python3 to choose instead")
    config = (
        (REPOSITORY / "tools" / "code_interpreter.yaml")
        .read_text()
        .replace("sandbox: local", "sandbox: local\n      python: /usr/bin/python3")
    )
    (tmp_path / "tools.yaml").write_text(config)
    chosen = load_tools(tmp_path / "tools.yaml")["code_interpreter"]
    assert chosen.interpreter.sandbox.interpreter == Path("/usr/bin/python3")


def test_a_venv_folder_or_another_interpreter_can_be_chosen(monkeypatch):
    assert LocalSandbox(python=str(runtime_dir())).interpreter == runtime_dir() / "bin" / "python"
    monkeypatch.setenv(RUNTIME_ENV, "/nonexistent/runtime")
    assert runtime_python() is None
    with pytest.warns(RuntimeWarning, match=f"{RUNTIME_ENV}=/nonexistent/runtime holds no sandbox runtime"):
        bare = LocalSandbox(timeout_s=10)
    assert "ModuleNotFoundError" in bare.run("import sympy").stderr


def test_every_pin_is_installed_at_its_version(described):
    installed = described["packages"]
    assert {name: installed.get(name) for name in pins()} == pins()


def test_math_code_runs(sandbox):
    code = (
        "import numpy as np, sympy as sp, scipy.integrate, networkx as nx, pandas as pd, mpmath, requests\n"
        "x = sp.symbols('x')\n"
        "print(sp.solve(x**2 - 5*x + 6, x), round(float(np.linalg.det(np.array([[2.0, 1], [1, 3]]))), 6))\n"
        "print(round(scipy.integrate.quad(lambda t: t * t, 0, 3)[0], 6), nx.shortest_path_length(nx.path_graph(5), 0, 4))\n"
        "print(pd.DataFrame({'a': [1, 2, 3]})['a'].sum(), mpmath.mpf(1) / 4)\n"
    )
    result = sandbox.run(code)
    assert (result.status, result.stdout) == ("ok", "[2, 3] 5.0\n9.0 4\n6 0.25\n"), result


def test_the_trainers_environment_does_not_leak_in(sandbox, described):
    """Neither the trainer's packages nor its environment's folders nor the repository are visible inside
    (the runtime is mounted at a path of its own, even when it lives in the repository)."""
    code = (
        "import importlib.util, json, os, sys\n"
        "print(json.dumps({'importable': [m for m in ('srt_agent', 'torch', 'transformers', 'pytest') if importlib.util.find_spec(m)],\n"
        f"    'paths': [p for p in sys.path if p.startswith({sys.prefix!r})],\n"
        f"    'trainer_env': os.path.exists({sys.prefix!r}),\n"
        f"    'repository': sorted(os.listdir({str(REPOSITORY)!r})) if os.path.isdir({str(REPOSITORY)!r}) else [],\n"
        "    'env': sorted(k for k in os.environ if k.startswith(('VIRTUAL_ENV', 'PYTHONHOME', 'CONDA')))}))\n"
    )
    result = sandbox.run(code)
    expected = {"importable": [], "paths": [], "trainer_env": False, "repository": [], "env": []}
    assert json.loads(result.stdout) == expected, result
    assert sys.prefix != described["prefix"] and "torch" not in described["packages"]


def test_an_unmappable_extension_reads_as_out_of_memory():
    stderr = "Traceback (most recent call last):\nImportError: libscipy_openblas.so: failed to map segment from shared object\n"
    assert is_memory_error(stderr) and not is_memory_error("ImportError: No module named 'x'\n")
    result = LocalSandbox(timeout_s=30, memory_mb=96).run("import numpy, scipy.special")
    assert result.status == "memory", result


def test_runtime_lives_in_a_venv_of_its_own():
    venv = venv_of(runtime_python())
    config = (venv / "pyvenv.cfg").read_text()
    assert venv == runtime_dir().resolve() and "include-system-site-packages = false" in config  # followed if a link


def test_install_is_a_no_op_once_built():
    stamp = runtime_dir() / "srt-requirements.txt"
    if not stamp.is_file() or stamp.read_bytes() != REQUIREMENTS.read_bytes():
        pytest.skip("the runtime was built from other pins: rebuild it with scripts/install_sandbox_runtime.sh")
    before = {path: path.stat().st_mtime_ns for path in (runtime_dir(), stamp, runtime_dir() / "bin")}
    done = subprocess.run(
        ["bash", str(INSTALL)], capture_output=True, text=True, env={**os.environ, RUNTIME_ENV: str(runtime_dir())}
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert {path: path.stat().st_mtime_ns for path in before} == before


def test_results_keep_fetched_files_json_ready():
    result = SandboxResult(status="ok", files={"a": b"\x00\xff"})
    assert json.loads(json.dumps(result.to_dict()))["files"] == {"a": "AP8="}
