"""The hostile battery: programs that attack the sandbox, run concurrently with good ones, with one set of
expectations for every backend (tests/test_sandbox_hostile.py runs it through the local sandbox, Docker and
the SandboxFusion-compatible server).

Each hostile program must be contained and reported with its status while the good programs beside it
finish correctly. `python tests/helpers/sandbox_hostile.py` prints the results per backend as docs/sandboxes.md's table.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from srt_agent.tools import CodeSandbox, SandboxResult

TIMEOUT_S = 3.0  # the deadline of the cases that must be stopped by it
ENDS_BY_ITSELF_S = 60.0  # the others': they end in well under a second on an idle machine, not on a loaded one
MAX_OUTPUT = 65536
MEMORY_MB = 256
PROJECT_FILE = Path(__file__).resolve().parents[2] / "pyproject.toml"
ORPHAN_MARK = "987.6543"  # argv of a `sleep` the fork-and-leave case tries to leave behind
CANARY = ("SRT_HOSTILE_CANARY", "the-callers-secret-7f3a")  # set in the caller's environment during the battery
PROGRAM_ENV = {  # what a program may find in its environment
    *("PATH", "HOME", "TMPDIR", "LANG", "PWD", "HOSTNAME", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"),
    *("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING"),
}


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


def _refused_below(limit: int, errno: int) -> Callable[[SandboxResult], None]:
    def check(result: SandboxResult) -> None:
        count, error = result.stdout.split()
        assert int(count) < limit and error == str(errno), result

    return check


def _exit_code(code: int) -> Callable[[SandboxResult], None]:
    def check(result: SandboxResult) -> None:
        assert result.exit_code == code, result

    return check


def _stderr_has(text: str) -> Callable[[SandboxResult], None]:
    def check(result: SandboxResult) -> None:
        assert text in result.stderr, result

    return check


def _clean_environment(result: SandboxResult) -> None:
    environment = json.loads(result.stdout)
    assert set(environment) <= PROGRAM_ENV and CANARY[1] not in result.stdout, environment


def _ticked_until_stopped(result: SandboxResult) -> None:
    _timed_out(result)
    assert result.stdout.startswith("tick\n"), result


_FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
_FORK_UNTIL_REFUSED = """\
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
"""
_FORK_AND_LEAVE = f"""\
import os
for _ in range(3):
    if os.fork() == 0:
        os.setsid()
        os.execv('/usr/bin/sleep', ['sleep', '{ORPHAN_MARK}'])
print('left')
"""
_THREAD_BOMB = """\
import threading, time
while True:
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
"""
_DISK_FILL = """\
n = 0
try:
    while True:
        with open(f'/tmp/fill{n}', 'wb') as f:
            f.write(b'x' * (1 << 20))
        n += 1
except OSError as e:
    print(n, e.errno)
"""
_WRITE_OUTSIDE = """\
written = []
for path in ['/usr/evil', '/etc/evil', '/evil', '/var/tmp/evil', '/opt/evil', '/root/evil', '/sandbox/evil',
             '/sandbox/main.py', '/proc/sys/kernel/hostname']:
    try:
        open(path, 'w').write('x')
        written.append(path)
    except OSError:
        pass
open('/tmp/fine', 'w').write('ok')
print(written, open('/tmp/fine').read())
"""
_IGNORE_SIGNALS = """\
import signal, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU):
    signal.signal(s, signal.SIG_IGN)
time.sleep(60)
"""
_KILL_EVERYTHING = """\
import os, time
if os.fork() == 0:
    time.sleep(30)
os.kill(-1, 9)
print(os.waitstatus_to_exitcode(os.wait()[1]))
"""
_GOOD_FORKS = """\
import os
pid = os.fork()
if pid == 0:
    os._exit(7)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def _connect(address: str) -> str:
    return f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect({address})\n"


def battery(listener_port: int) -> list[Case]:
    """The hostile programs (plus good ones, which must come back 'ok' with the right output)."""
    return [
        Case("fork_bomb", _FORK_BOMB, "timeout", _timed_out),
        Case("fork_until_refused", _FORK_UNTIL_REFUSED, "ok", _refused_below(64, 11)),  # EAGAIN: the process cap
        Case("fork_and_leave", _FORK_AND_LEAVE, "ok"),
        Case("thread_bomb", _THREAD_BOMB, "error", _stderr_has("can't start new thread")),
        Case("infinite_loop", "while True:\n    pass\n", "timeout", _timed_out),
        Case("sleep_past_timeout", "import time\ntime.sleep(60)\n", "timeout", _timed_out),
        Case("ignore_signals_and_sleep", _IGNORE_SIGNALS, "timeout", _timed_out),
        Case("close_output_and_sleep", "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n", "timeout", _timed_out),
        Case("memory_hog_once", "x = bytearray(4 << 30)\n", "memory"),
        Case("memory_hog_growing", "chunks = []\nwhile True:\n    chunks.append(bytes(32 << 20))\n", "memory"),
        Case("disk_fill", _DISK_FILL, "ok", _refused_below(65, 28)),  # ENOSPC: at most the 64 MB working directory
        Case("file_too_large", "open('/tmp/big', 'wb').write(b'x' * (64 << 20))\n", "error", _stderr_has("File too large")),
        Case("read_project_file", f"print(open({str(PROJECT_FILE)!r}).read())\n", "error", _no_host_secrets),
        Case("read_home", f"import os\nprint(os.listdir({str(Path.home())!r}))\n", "error", _no_host_secrets),
        Case("read_etc_shadow", "print(open('/etc/shadow').read())\n", "error", _no_host_secrets),
        Case("docker_socket", "import socket\nsocket.socket(socket.AF_UNIX).connect('/var/run/docker.sock')\n", "error"),
        Case("environment_leak", "import json, os\nprint(json.dumps(dict(os.environ)))\n", "ok", _clean_environment),
        Case("write_outside_tmp", _WRITE_OUTSIDE, "ok", _stdout_is("[] ok")),
        Case("become_root", "import os\nos.setuid(0)\n", "error", _stderr_has("[Errno")),  # EPERM, or EINVAL: no uid 0 there
        Case("network", _connect(f"('127.0.0.1', {listener_port})"), "error", _stderr_has("ConnectionRefusedError")),
        Case("network_external", _connect("('1.1.1.1', 80)"), "error", _stderr_has("Network is unreachable")),
        Case("dns", "import socket\nsocket.getaddrinfo('pypi.org', 443)\n", "error", _stderr_has("socket.gaierror")),
        Case("output_100mb_at_once", "import sys\nsys.stdout.write('x' * (100 << 20))\n", "output_limit", _capped),
        Case("output_10mb_then_sleep", "import sys, time\nfor _ in range(10):\n    sys.stdout.write('y' * (1 << 20))\ntime.sleep(60)\n", "output_limit", _capped),
        Case("output_forever", "while True:\n    print('spam')\n", "output_limit", _capped),
        Case("stderr_forever", "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n", "output_limit", _capped),
        Case("output_drip", "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.01)\n", "timeout", _ticked_until_stopped),
        Case("kill_parent", "import os\nos.kill(os.getppid(), 9)\nprint('still here')\n", "ok", _stdout_is("still here")),
        Case("kill_everything", _KILL_EVERYTHING, "ok", _stdout_is("-9")),  # kill(-1) reached its own child only
        Case("kill_self", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "killed", _exit_code(-11)),
        Case("good_sum", "print(sum(range(10**6)))\n", "ok", _stdout_is(str(sum(range(10**6))))),
        Case("good_forks", _GOOD_FORKS, "ok", _stdout_is("7")),
        Case("good_stdin", "print(input().upper())\n", "ok", _stdout_is("HELLO")),
        Case("good_numpy", "import numpy\nprint(int(numpy.arange(10).sum()))\n", "ok", _stdout_is("45")),
    ]  # fmt: skip


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


def failures(cases: list[Case], results: dict[str, SandboxResult]) -> list[str]:
    """What each case's results got wrong (empty: every case contained, every good run right)."""
    found = []
    for case in cases:
        for name, result in results.items():
            if name.split("#")[0] != case.name:
                continue
            try:
                loaded = case.status == "timeout" and result.status == "overloaded"  # a busy server says it stopped it
                assert result.status == case.status or loaded, (
                    f"status {result.status!r}, expected {case.status!r}: {result}"
                )
                case.check(result)
            except AssertionError as exc:
                found.append(f"{name}: {exc}")
    return found


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


class Listener:
    """A TCP listener on the host's loopback that no sandbox may reach; `hits` counts connections."""

    def __init__(self) -> None:
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen()
        self._server.settimeout(0.2)
        self.port, self.hits = self._server.getsockname()[1], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self.hits.append("connected")
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._server.close()


@contextmanager
def with_canary() -> Iterator[None]:
    """The caller's environment holds CANARY while the battery runs (the environment-leak case looks for it)."""
    os.environ[CANARY[0]] = CANARY[1]
    try:
        yield
    finally:
        del os.environ[CANARY[0]]


def table(results: dict[str, dict[str, SandboxResult]]) -> str:
    """Markdown: one row per case, one column per backend, each cell the status and wall time."""
    backends = list(results)
    lines = ["| case | expected | " + " | ".join(backends) + " |", "|---|---|" + "---|" * len(backends)]
    for case in battery(0):
        cells = []
        for backend in backends:
            result = results[backend][case.name]
            wrong = failures([case], {case.name: result})
            cells.append(f"{result.status} {result.wall_s:.1f} s" + (" **not contained**" if wrong else ""))
        lines.append(f"| `{case.name}` | {case.status} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
    from helpers.sandboxes import BACKENDS, backend_sandbox

    listener = Listener()
    collected = {}
    with with_canary():
        for backend in BACKENDS:
            with backend_sandbox(backend) as sandbox:
                collected[backend] = run_battery(sandbox, battery(listener.port))
    listener.close()
    print(f"listener reached: {bool(listener.hits)}; leftover processes: {leftover_processes()}")
    print(table(collected))
