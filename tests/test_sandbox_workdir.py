"""A run's working directory starts empty wherever the runtime lives, and a runtime the sandbox cannot use is named.

The runtime (a virtual environment) is mounted at RUNTIME_MOUNT inside, so a checkout under /tmp (the
sandbox's working directory is /tmp) no longer shows its top folder to every program.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from srt_agent.tools import LocalSandbox, SandboxUnavailable
from srt_agent.tools.bwrap import PYTHONPATH_MOUNT, bwrap_path
from srt_agent.tools.runtime import RUNTIME_ENV
from srt_agent.tools.sandbox_python import RUNTIME_MOUNT, base_prefixes

BASE_PYTHON = Path("/usr/bin/python3")
pytestmark = [
    pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.skipif(not BASE_PYTHON.is_file(), reason="machine: no /usr/bin/python3 to build a small runtime on"),
]

LOOK = (
    "import json, os, sys\nimport srt_marker\n"
    "print(json.dumps({'cwd': os.getcwd(), 'listing': sorted(os.listdir('.')), 'executable': sys.executable,\n"
    "                  'prefix': sys.prefix, 'marker': srt_marker.WHO}))\n"
)


def small_runtime(folder: Path) -> Path:
    """A virtual environment at `folder` (built on /usr/bin/python3, as the install script does) holding
    one module that says which runtime it is: a stand-in for the real runtime, built in a tenth of a second."""
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    site = next((folder / "lib").glob("python3*/site-packages"))
    (site / "srt_marker.py").write_text(f"WHO = {str(folder)!r}\n")
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    return folder


def others_can_enter(folder: Path) -> bool:
    return all(p.stat().st_mode & 0o001 for p in (folder, *folder.parents))


@pytest.fixture
def checkout_under(request, monkeypatch):
    """Makes a folder under `where` for a checkout's runtime (removed afterwards) and points
    $SRT_SANDBOX_RUNTIME at its runtime. With `linked`, the runtime is built in a folder others can enter
    and the checkout's .sandbox-venv links to it, as the install script does for a closed checkout run by root."""
    made: list[Path] = []

    def make(where: Path, *inner: str, linked: bool = False) -> Path:
        top = Path(tempfile.mkdtemp(prefix="srt-checkout-", dir=where))
        made.append(top)
        os.chmod(top, 0o755)
        checkout = top.joinpath(*inner) if inner else top
        checkout.mkdir(parents=True, exist_ok=True)
        if linked:
            outside = Path(tempfile.mkdtemp(prefix="srt-open-runtime-", dir="/tmp"))
            made.append(outside)
            os.chmod(outside, 0o755)
            runtime = small_runtime(outside / "runtime")
            (checkout / ".sandbox-venv").symlink_to(runtime)
            monkeypatch.setenv(RUNTIME_ENV, str(checkout / ".sandbox-venv"))
            return runtime
        runtime = small_runtime(checkout / ".sandbox-venv")
        monkeypatch.setenv(RUNTIME_ENV, str(runtime))
        return runtime

    yield make
    for top in made:
        shutil.rmtree(top, ignore_errors=True)


def look(sandbox: LocalSandbox, **run) -> dict:
    result = sandbox.run(LOOK, **run)
    assert result.ok, result
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "where, inner",
    [("/tmp", ("kept", "nc")), ("/tmp", ("a folder with spaces",)), ("home", ("srt agent",))],
    ids=["tmp", "space", "home"],
)
def test_the_working_directory_holds_only_what_the_run_put_there(checkout_under, where, inner):
    """Under /tmp, in a folder with spaces, and under $HOME (root's is closed to the per-run uid: there the
    runtime lives elsewhere and the checkout links to it, as the install script arranges)."""
    base = Path.home() if where == "home" else Path(where)
    runtime = checkout_under(base, *inner, linked=os.geteuid() == 0 and not others_can_enter(base))
    sandbox = LocalSandbox(timeout_s=20)
    assert sandbox.runtime_problem is None, sandbox.runtime_problem
    seen = look(sandbox)
    assert seen == {
        "cwd": "/tmp",
        "listing": [],
        "executable": f"{RUNTIME_MOUNT}/bin/python",
        "prefix": RUNTIME_MOUNT,
        "marker": str(runtime),
    }
    given = look(sandbox, files={"given.txt": b"x", "d/nested": b"y"})
    assert given["listing"] == ["d", "given.txt"]
    listing = sandbox.run('echo "[$(ls -A /tmp)]"; ls -A /', language="bash")
    first, *top = listing.stdout.split()
    assert first == "[]" and "opt" in top and not {*inner, "kept", "nc"} & set(top), listing


def test_pythonpath_under_tmp_stays_out_of_the_working_directory(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="srt-pythonpath-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        (folder / "helper_mod.py").write_text("VALUE = 42\n")
        os.chmod(folder / "helper_mod.py", 0o644)
        sandbox = LocalSandbox(timeout_s=20, python=str(BASE_PYTHON), pythonpath=(str(folder),))
        result = sandbox.run(
            "import os, helper_mod, sys\nprint(os.listdir('.'), helper_mod.VALUE, helper_mod.__file__)"
        )
        assert result.stdout == f"[] 42 {PYTHONPATH_MOUNT}/0/helper_mod.py\n", result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_venv_interpreter_needs_its_base_installation_bound():
    """A venv's base installation (e.g. pyenv's, under the home folder) is bound read-only beside the
    mounted venv: the one its symlinks lead to, and the one pyvenv.cfg's `home` names (a copied interpreter)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("machine: the tests do not run in a virtual environment")
    base = Path(sys.base_prefix).resolve()
    assert base in base_prefixes(Path(sys.executable)) or base == Path("/usr")
    with tempfile.TemporaryDirectory() as folder:
        copied = Path(folder) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--copies", str(copied)], check=True)
        prefixes = base_prefixes(copied / "bin" / "python")
    assert copied.resolve() not in prefixes and (base in prefixes or base == Path("/usr")), prefixes


class TestUnusableRuntime:
    """A runtime that exists or is asked for but cannot be used: plain sandboxes warn, naming what to fix."""

    def test_a_runtime_env_var_pointing_nowhere_is_named(self, monkeypatch, tmp_path):
        monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "nothing-here"))
        with pytest.warns(RuntimeWarning, match=RUNTIME_ENV):
            sandbox = LocalSandbox(timeout_s=10)
        assert f"{RUNTIME_ENV}={tmp_path / 'nothing-here'}" in sandbox.runtime_problem
        assert sandbox.run("print(1)").stdout == "1\n"  # plain use still runs, with the host's interpreter

    @pytest.mark.skipif(os.geteuid() != 0, reason="machine: only a sandbox started by root runs as another uid")
    def test_a_runtime_in_a_closed_folder_names_the_folder_to_open(self, checkout_under):
        closed = Path(tempfile.mkdtemp(dir="/tmp"))  # mktemp -d: mode 0700
        try:
            runtime = checkout_under(closed, "checkout")
            with pytest.warns(RuntimeWarning, match="cannot be read"):
                sandbox = LocalSandbox(timeout_s=10)
            assert f"open {closed} to other users (chmod o+rx {closed})" in sandbox.runtime_problem
            assert sandbox.interpreter != runtime / "bin" / "python"
        finally:
            shutil.rmtree(closed, ignore_errors=True)

    def test_a_runtime_that_does_not_start_inside_is_named_for_training(self, checkout_under):
        runtime = checkout_under(Path("/tmp"), "broken")
        python = runtime / "bin" / "python"
        python.unlink()
        python.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
        python.chmod(0o755)
        sandbox = LocalSandbox(timeout_s=10)
        assert sandbox.runtime_problem is None  # nothing to see without running it
        problem = sandbox.check_runtime()
        assert f"the sandbox runtime {runtime} does not start inside the sandbox (cannot start)" in problem
        assert sandbox.check_runtime() == problem  # asked once

    def test_a_working_runtime_passes_the_training_check(self, checkout_under):
        checkout_under(Path("/tmp"), "fine")
        assert LocalSandbox(timeout_s=10).check_runtime() is None

    def test_an_interpreter_installed_under_the_working_directory_is_refused(self, tmp_path):
        prefix = Path(tempfile.mkdtemp(prefix="srt-prefix-", dir="/tmp"))
        try:
            (prefix / "bin").mkdir()
            shutil.copy(BASE_PYTHON.resolve(), prefix / "bin" / "python3")
            os.chmod(prefix, 0o755)
            with pytest.raises(SandboxUnavailable, match="under /tmp, the sandbox's working directory"):
                LocalSandbox(python=str(prefix / "bin" / "python3"))
        finally:
            shutil.rmtree(prefix, ignore_errors=True)
