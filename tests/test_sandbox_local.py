"""LocalSandbox: what programs see and get back, limits, options, and the bubblewrap-missing path."""

from __future__ import annotations

import ast
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from srt_agent.tools import CodeSandbox, LocalSandbox, SandboxUnavailable
from srt_agent.tools.cgroup import CgroupLimiter
from srt_agent.tools.local import bwrap_path, classify, limited_argv
from srt_agent.tools.process import ProcessOutcome

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox(timeout_s=5)


@pytest.fixture
def no_bwrap_on_path(tmp_path, monkeypatch):
    """A PATH with python but without bwrap, as on a machine where bubblewrap is not installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))


@needs_bwrap
class TestSandboxed:
    def test_is_a_code_sandbox(self, sandbox):
        assert isinstance(sandbox, CodeSandbox) and sandbox.sandboxed

    def test_prints_and_exits_cleanly(self, sandbox):
        result = sandbox.run("print(6 * 7)")
        assert (result.status, result.stdout, result.stderr, result.exit_code) == ("ok", "42\n", "", 0)
        assert not result.truncated and result.wall_s > 0

    def test_exception_gives_error_with_traceback(self, sandbox):
        result = sandbox.run("def f():\n    return 1 / 0\nf()\n")
        assert result.status == "error" and result.exit_code == 1
        assert (
            "ZeroDivisionError: division by zero" in result.stderr
            and 'File "/sandbox/main.py", line 2' in result.stderr
        )

    def test_exit_code_is_reported(self, sandbox):
        result = sandbox.run("import sys\nprint('partial')\nsys.exit(3)")
        assert (result.status, result.exit_code, result.stdout) == ("error", 3, "partial\n")

    def test_stdin_is_fed(self, sandbox):
        result = sandbox.run("import sys\ndata = sys.stdin.read()\nprint(len(data), data[:3])", stdin="abc" * 400_000)
        assert result.stdout == "1200000 abc\n"

    def test_unread_stdin_does_not_block(self, sandbox):
        result = sandbox.run("print('done')", stdin="x" * 5_000_000)
        assert (result.status, result.stdout) == ("ok", "done\n")

    def test_large_program(self, sandbox):
        code = "".join(f"v{i} = {i}\n" for i in range(20_000)) + "print(v19999)\n"
        assert len(code) > 200_000
        assert sandbox.run(code).stdout == "19999\n"

    def test_unicode_and_invalid_utf8_output(self, sandbox):
        result = sandbox.run(
            "import sys\nprint('π ≈ 3.14 ✓')\nsys.stdout.flush()\nsys.stdout.buffer.write(b'\\xff\\xfe\\n')"
        )
        assert result.stdout.startswith("π ≈ 3.14 ✓\n") and "\ufffd" in result.stdout

    def test_output_until_a_timeout_is_kept(self, sandbox):
        result = sandbox.run("import time\nprint('before the hang')\ntime.sleep(30)", timeout_s=1)
        assert (result.status, result.stdout) == ("timeout", "before the hang\n")

    def test_environment_is_clean(self, sandbox, monkeypatch):
        monkeypatch.setenv("SRT_HOST_SECRET", "hunter2")
        result = sandbox.run("import os\nprint(sorted(os.environ))\nprint(os.getcwd(), os.environ['HOME'])")
        assert "SRT_HOST_SECRET" not in result.stdout and "/tmp /tmp" in result.stdout

    def test_runs_unprivileged_in_its_own_pid_namespace(self, sandbox):
        result = sandbox.run(
            "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint(os.getuid(), os.getpid(), len(pids))"
        )
        uid, pid, visible = map(int, result.stdout.split())
        assert uid != 0 and pid <= 3 and visible <= 3

    def test_concurrent_runs_keep_their_own_input_and_output(self, sandbox):
        code = "import sys\nn = int(input())\nprint(n * n)\nprint(n, file=sys.stderr)"
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: sandbox.run(code, stdin=f"{i}\n"), range(16)))
        assert [(r.stdout, r.stderr) for r in results] == [(f"{i * i}\n", f"{i}\n") for i in range(16)]

    def test_tmp_is_writable_and_private_to_each_run(self, sandbox):
        first = sandbox.run("open('/tmp/note', 'w').write('mine')\nprint(open('/tmp/note').read())")
        second = sandbox.run("import os\nprint(os.path.exists('/tmp/note'))")
        assert first.stdout == "mine\n" and second.stdout == "False\n"

    def test_tmp_size_is_capped(self):
        small = LocalSandbox(timeout_s=5, tmp_mb=4, max_file_mb=16)
        result = small.run("open('/tmp/a', 'wb').write(b'x' * (8 << 20))")
        assert result.status == "error" and "No space left on device" in result.stderr

    def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock(self):
        result = LocalSandbox(timeout_s=30, cpu_s=1).run("while True:\n    pass")
        assert result.status == "timeout" and result.wall_s < 30

    def test_per_call_timeout_overrides_the_default(self, sandbox):
        result = sandbox.run("import time\ntime.sleep(3)\nprint('late')", timeout_s=0.5)
        assert result.status == "timeout" and result.stdout == ""

    def test_memory_limit_is_per_sandbox(self):
        code = "x = bytearray(300 << 20)\nprint('fits')"
        assert LocalSandbox(timeout_s=5, memory_mb=200).run(code).status == "memory"
        assert LocalSandbox(timeout_s=5, memory_mb=600).run(code).stdout == "fits\n"

    @pytest.mark.skipif(
        CgroupLimiter.detect() is None, reason="machine: no writable cgroup memory/pids controllers here"
    )
    def test_memory_of_all_processes_together_is_capped(self):
        code = (
            "import os, sys, time\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
            "        data = b'x' * (120 << 20)\n        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\n"
            "sys.exit(max(os.waitpid(k, 0)[1] for k in kids) and 1)\n"
        )
        sandbox = LocalSandbox(timeout_s=20, memory_mb=200, tmp_mb=16)  # each child fits its 200 MB, four do not
        assert sandbox.run(code).status == "memory"
        leftovers = [
            p for p in CgroupLimiter.detect().memory_base.iterdir() if p.name.startswith(f"run-{os.getpid()}-")
        ]
        assert leftovers == []

    def test_pythonpath_is_importable_read_only(self):
        folder = Path(tempfile.mkdtemp(dir="/tmp"))
        try:
            folder.chmod(0o755)
            (folder / "helper_mod.py").write_text("ANSWER = 41 + 1\n")
            (folder / "helper_mod.py").chmod(0o644)
            sandbox = LocalSandbox(timeout_s=5, pythonpath=(str(folder),))
            code = "import helper_mod, os\nprint(helper_mod.ANSWER)\nopen(os.path.dirname(helper_mod.__file__) + '/x', 'w')"
            result = sandbox.run(code)
            assert result.stdout == "42\n" and "Read-only file system" in result.stderr
        finally:
            shutil.rmtree(folder)


class TestOptions:
    @pytest.mark.parametrize(
        "options", [{"timeout_s": 0}, {"memory_mb": -1}, {"max_processes": 0}, {"max_output_bytes": 0}, {"cpu_s": 0}]
    )
    def test_bad_limits_are_rejected(self, options):
        with pytest.raises(ValueError, match="must be positive"):
            LocalSandbox(**options)

    @needs_bwrap
    def test_bad_call_timeout_is_rejected(self, sandbox):
        with pytest.raises(ValueError, match="timeout_s must be positive"):
            sandbox.run("print(1)", timeout_s=0)

    def test_missing_interpreter_is_a_clear_error(self):
        with pytest.raises(SandboxUnavailable, match="no such interpreter"):
            LocalSandbox(python="/nonexistent/python3", allow_unsandboxed=True)

    @needs_bwrap
    def test_missing_pythonpath_is_a_clear_error(self):
        with pytest.raises(SandboxUnavailable, match="not a directory"):
            LocalSandbox(pythonpath=("/nonexistent/site-packages",))


class TestWithoutBubblewrap:
    def test_refuses_with_install_instructions(self, no_bwrap_on_path):
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            LocalSandbox()

    def test_runs_unsandboxed_only_when_asked_and_warns(self, no_bwrap_on_path):
        with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
            sandbox = LocalSandbox(timeout_s=2, allow_unsandboxed=True)
        assert not sandbox.sandboxed
        assert sandbox.run("print(input() * 2)", stdin="ab\n").stdout == "abab\n"
        assert sandbox.run("import time\ntime.sleep(10)").status == "timeout"
        assert sandbox.run("x = bytearray(2 << 30)").status == "memory"
        killed = sandbox.run("import os\nos.kill(os.getpid(), 9)")
        assert (killed.status, killed.exit_code) == ("killed", -9)

    def test_unsandboxed_runs_get_and_give_back_files(self, no_bwrap_on_path):
        with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
            sandbox = LocalSandbox(timeout_s=5, allow_unsandboxed=True)
        result = sandbox.run(
            "open('out', 'w').write(open('d/in').read() * 2)", files={"d/in": b"ab"}, fetch_files=["out", "gone"]
        )
        assert (result.status, result.files) == ("ok", {"out": b"abab"}), result
        bash = sandbox.run('printf %s "$(<d/in)"', files={"d/in": b"sh"}, language="bash")  # PATH: no cat
        assert (bash.status, bash.stdout) == ("ok", "sh")


def test_a_host_that_forbids_namespaces_fails_at_construction(monkeypatch):
    """A `bwrap` that cannot create namespaces (as where user namespaces are disabled) is caught up front."""
    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        folder.chmod(0o755)
        fake = folder / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
        with pytest.raises(SandboxUnavailable, match="No permissions to create a new namespace.*user namespaces"):
            LocalSandbox()
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("prlimit", ["/usr/bin/prlimit", None], ids=["prlimit", "python-launcher"])
def test_limits_are_set_before_the_program_starts(prlimit, tmp_path):
    if prlimit and not Path(prlimit).exists():
        pytest.skip("util-linux prlimit is not installed")
    program = tmp_path / "main.py"
    names = ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CORE")
    program.write_text(f"import resource\nprint([resource.getrlimit(getattr(resource, n)) for n in {names!r}])")
    argv = limited_argv(
        [sys.executable, str(program)], [7, 1 << 30, -1, 1 << 20], Path(sys.executable), prlimit=prlimit
    )
    limits = ast.literal_eval(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    unlimited_nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    assert limits == [(7, 8), (1 << 30, 1 << 30), unlimited_nproc, (1 << 20, 1 << 20), (0, 0)]


class TestClassify:
    def outcome(self, **changes) -> ProcessOutcome:
        base = dict(returncode=0, stdout=b"", stderr=b"", wall_s=0.1, timed_out=False, output_limited=False)
        return ProcessOutcome(**{**base, **changes})

    def test_setup_failure_is_a_sandbox_error(self):
        result = classify(self.outcome(returncode=1, stderr=b"bwrap: Can't find source path /x"), started=False)
        assert result.status == "sandbox_error" and "bwrap" in result.stderr

    def test_bubblewrap_signal_codes(self):
        assert classify(self.outcome(returncode=137), signal_offset=128).exit_code == -9
        assert classify(self.outcome(returncode=128 + 24), signal_offset=128).status == "timeout"  # SIGXCPU
        assert classify(self.outcome(returncode=137)).status == "error"  # a plain exit(137) without bwrap

    def test_output_limit_wins_over_timeout(self):
        result = classify(self.outcome(returncode=-9, timed_out=True, output_limited=True))
        assert (result.status, result.truncated, result.exit_code) == ("output_limit", True, None)


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="machine: only a sandbox started by root runs as another uid")
def test_the_callers_ld_preload_never_reaches_a_programs_output(monkeypatch):
    """The trainer runs with LD_PRELOAD (tcmalloc, OpenMP from its venv); from a checkout the per-run uid
    cannot enter, bwrap's loader used to print that it cannot read them into every program's stderr, which
    the cold start then read as the program's answer."""
    closed = Path(tempfile.mkdtemp(dir="/tmp"))  # mode 0700
    try:
        lib = closed / "libpreloaded.so"
        shutil.copy(next(Path("/usr/lib").rglob("libm.so.6")), lib)
        monkeypatch.setenv("LD_PRELOAD", str(lib))
        result = LocalSandbox(timeout_s=20, python="/usr/bin/python3").run("print(6 * 7)")
        assert (result.status, result.stdout, result.stderr) == ("ok", "42\n", ""), result
    finally:
        shutil.rmtree(closed, ignore_errors=True)
