"""The security battery: hostile programs run concurrently with good ones in the bubblewrap sandbox.

Each hostile program must be contained and reported with a clear status while the good programs
running beside it finish correctly and the host keeps working. tests/test_server.py runs the same
battery through the SandboxFusion-compatible server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from srt_agent.tools import CodeSandbox, LocalSandbox, SandboxResult
from srt_agent.tools.local import bwrap_path

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")

TIMEOUT_S = 3.0  # the deadline of the cases that must be stopped by it
ENDS_BY_ITSELF_S = 60.0  # the others': they end in well under a second on an idle machine, not on a loaded one
MAX_OUTPUT = 65536
MEMORY_MB = 256
PROJECT_FILE = Path(__file__).resolve().parents[1] / "pyproject.toml"
ORPHAN_MARK = "987.6543"  # argv of a `sleep` the fork-and-leave case tries to leave behind


@dataclass
class Case:
    """A program, the status it must end with, and extra checks on its result."""

    name: str
    code: str
    status: str
    check: Callable[[SandboxResult], None] = lambda result: None


def _no_host_secrets(result: SandboxResult) -> None:
    assert "[project]" not in result.stdout and "root:" not in result.stdout


def _stdout_is(expected: str) -> Callable[[SandboxResult], None]:
    def check(result: SandboxResult) -> None:
        assert result.stdout.strip() == expected, result

    return check


def _capped(result: SandboxResult) -> None:
    assert result.truncated
    assert 0 < len(result.stdout) + len(result.stderr) <= MAX_OUTPUT


def _timed_out(result: SandboxResult) -> None:
    """Stopped by the sandbox: not before the deadline, and long before the program's own end."""
    assert result.exit_code is None
    assert TIMEOUT_S - 0.1 <= result.wall_s < TIMEOUT_S + 10, result.wall_s


def _refused_below_the_limit(result: SandboxResult) -> None:
    forks, errno = result.stdout.split()
    assert int(forks) < 64 and errno == "11", result  # EAGAIN from RLIMIT_NPROC


def _exit_code(code: int) -> Callable[[SandboxResult], None]:
    def check(result: SandboxResult) -> None:
        assert result.exit_code == code, result

    return check


def _stderr_has(text: str) -> Callable[[SandboxResult], None]:
    def check(result: SandboxResult) -> None:
        assert text in result.stderr, result

    return check


def battery(listener_port: int) -> list[Case]:
    """The hostile programs (plus good ones, which must come back 'ok' with the right output)."""
    return [
        Case(
            "fork_bomb",
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            "timeout",
            _timed_out,
        ),
        Case(
            "fork_until_refused",
            "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
            "except OSError as e:\n    print(n, e.errno)\n",
            "ok",
            _refused_below_the_limit,
        ),
        Case(
            "fork_and_leave",
            f"import os\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n        os.execv('/usr/bin/sleep', ['sleep', '{ORPHAN_MARK}'])\nprint('left')\n",
            "ok",
        ),
        Case("infinite_loop", "while True:\n    pass\n", "timeout", _timed_out),
        Case("sleep_past_timeout", "import time\ntime.sleep(60)\n", "timeout", _timed_out),
        Case("memory_hog_once", "x = bytearray(4 << 30)\n", "memory"),
        Case("memory_hog_growing", "chunks = []\nwhile True:\n    chunks.append(bytes(32 << 20))\n", "memory"),
        Case("read_project_file", f"print(open({str(PROJECT_FILE)!r}).read())\n", "error", _no_host_secrets),
        Case("read_home", f"import os\nprint(os.listdir({str(Path.home())!r}))\n", "error", _no_host_secrets),
        Case("read_etc_shadow", "print(open('/etc/shadow').read())\n", "error", _no_host_secrets),
        Case(
            "write_outside_tmp",
            "written = []\nfor path in ['/usr/evil', '/etc/evil', '/evil', '/sandbox/main.py', '/proc/sys/kernel/hostname']:\n"
            "    try:\n        open(path, 'w').write('x')\n        written.append(path)\n    except OSError:\n        pass\n"
            "open('/tmp/fine', 'w').write('ok')\nprint(written, open('/tmp/fine').read())\n",
            "ok",
            _stdout_is("[] ok"),
        ),
        Case(
            "network",
            f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {listener_port}))\n",
            "error",
            _stderr_has("ConnectionRefusedError"),  # the sandbox's own loopback, not the host's
        ),
        Case(
            "network_external",
            "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 80))\n",
            "error",
            _stderr_has("Network is unreachable"),
        ),
        Case("dns", "import socket\nsocket.getaddrinfo('pypi.org', 443)\n", "error", _stderr_has("socket.gaierror")),
        Case("output_100mb_at_once", "import sys\nsys.stdout.write('x' * (100 << 20))\n", "output_limit", _capped),
        Case("output_forever", "while True:\n    print('spam')\n", "output_limit", _capped),
        Case(
            "kill_parent", "import os\nos.kill(os.getppid(), 9)\nprint('still here')\n", "ok", _stdout_is("still here")
        ),
        Case(
            "kill_everything",
            "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nos.kill(-1, 9)\nprint(os.waitstatus_to_exitcode(os.wait()[1]))\n",
            "ok",
            _stdout_is("-9"),  # kill(-1) reached the program's own child and nothing outside
        ),
        Case("kill_self", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "killed", _exit_code(-11)),
        Case(
            "file_too_large",
            "open('/tmp/big', 'wb').write(b'x' * (64 << 20))\n",
            "error",
            _stderr_has("File too large"),
        ),
        Case("good_sum", "print(sum(range(10**6)))\n", "ok", _stdout_is(str(sum(range(10**6))))),
        Case(
            "good_forks",
            "import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\nprint(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n",
            "ok",
            _stdout_is("7"),
        ),
        Case("good_stdin", "print(input().upper())\n", "ok", _stdout_is("HELLO")),
    ]


@pytest.fixture(scope="module")
def listener():
    """A TCP listener on the host's loopback that the sandbox must not reach; yields (port, hits)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    hits: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            hits.append("connected")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], hits
    stop.set()
    thread.join()
    server.close()


def run_battery(sandbox: CodeSandbox, cases: list[Case], workers: int = 6) -> dict[str, SandboxResult]:
    """Run every case concurrently; each good case runs three times, spread among the hostile ones. Cases that
    must time out get TIMEOUT_S, the others ENDS_BY_ITSELF_S: a busy machine may take seconds to start one."""
    jobs = [(case.name, case) for case in cases]
    jobs += [(f"{case.name}#{i}", case) for case in cases if case.name.startswith("good") for i in (1, 2)]
    with ThreadPoolExecutor(workers) as pool:
        futures = {
            name: pool.submit(
                sandbox.run,
                case.code,
                stdin="hello\n",
                timeout_s=TIMEOUT_S if case.status == "timeout" else ENDS_BY_ITSELF_S,
            )
            for name, case in jobs
        }
        return {name: future.result() for name, future in futures.items()}


def check_case(case: Case, results: dict[str, SandboxResult]) -> None:
    for name, result in results.items():
        if name.split("#")[0] == case.name:
            assert result.status == case.status, f"{name}: {result}"
            case.check(result)


def leftover_processes() -> list[str]:
    """Host processes still running the `sleep` the fork-and-leave case started."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and ORPHAN_MARK.encode() in (proc / "cmdline").read_bytes():
                found.append(proc.name)
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def battery_results(listener):
    port, _ = listener
    sandbox = LocalSandbox(timeout_s=TIMEOUT_S, max_output_bytes=MAX_OUTPUT, memory_mb=MEMORY_MB)
    return run_battery(sandbox, battery(port))


CASE_NAMES = [case.name for case in battery(0)]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_battery_case_is_contained(name: str, battery_results, listener):
    case = {case.name: case for case in battery(listener[0])}[name]
    check_case(case, battery_results)


def test_sandbox_never_reached_the_host_listener(battery_results, listener):
    assert listener[1] == []


def test_no_process_outlives_its_sandbox(battery_results):
    deadline = time.monotonic() + 3
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes() == []


def test_host_still_forks_and_runs_after_the_battery(battery_results):
    assert subprocess.run(["true"]).returncode == 0
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def test_100mb_of_output_does_not_grow_host_memory():
    """Peak RSS (VmHWM) is reset first, so it starts at the current RSS and the run's own peak shows."""
    sandbox = LocalSandbox(timeout_s=10, max_output_bytes=MAX_OUTPUT)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current RSS
    before = _status_kb("VmRSS")
    assert _status_kb("VmHWM") < before + 8 * 1024, "the peak did not reset: the check would be blind"
    result = sandbox.run("import sys\nfor _ in range(100):\n    sys.stdout.write('y' * (1 << 20))\n")
    grown_kb = _status_kb("VmHWM") - before
    assert result.status == "output_limit" and len(result.stdout) == MAX_OUTPUT
    assert grown_kb < 32 * 1024
