"""DockerSandbox against a real Docker engine (as root, `bash scripts/install_docker.sh` starts one and builds
the sandbox image; where no engine can answer, these tests skip as a machine skip).

Every case runs real containers, and every test checks that the containers it created are gone afterwards
(those waiting in the warm pool included). A stand-in replaces one SDK call only where a real engine cannot
be made to do what the case needs, and says so. The hostile battery runs through Docker in
test_sandbox_hostile.py. Behind `srt-agent sandbox serve`, Docker gets the local sandbox's scheduler: a
client that leaves takes its container with it, overload is a SandboxError, an interactive call starts
ahead of a flood, and a container past its CPU quantum has its CPU weight lowered.
"""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

docker = pytest.importorskip("docker", reason="the docker client is an optional extra: pip install 'srt-agent[docker]'")
requests = pytest.importorskip("requests")

from helpers.sandboxes import containers_left, docker_client_or_skip, recorded_containers  # noqa: E402

from srt_agent.tools import DockerSandbox, SandboxUnavailable  # noqa: E402
from srt_agent.tools.docker_sandbox import DEFAULT_IMAGE, _Demux, _program_archive, _take_fetched  # noqa: E402
from srt_agent.tools.server import ServerConfig, running_server  # noqa: E402

CAP = 65536
PINS = Path(__file__).resolve().parents[1] / "srt_agent" / "tools" / "sandbox_runtime.txt"


@pytest.fixture(scope="module")
def client():
    return docker_client_or_skip()


@dataclass
class Created:
    """A docker client for the test's sandboxes, and the ids of the containers it created."""

    client: object
    ids: list[str]


@pytest.fixture
def created(client):
    """The containers the test's sandboxes create: all must be gone when it ends."""
    recording = docker.from_env()
    found = Created(recording, recorded_containers(recording))
    yield found
    assert found.ids and containers_left(client, found.ids) == []


@pytest.fixture
def sandbox(created):
    """A DockerSandbox with a warm pool, closed when the test ends."""
    box = DockerSandbox(timeout_s=10, memory_mb=256, max_output_bytes=CAP, client=created.client)
    yield box
    box.close()


def wait_for(condition, limit_s: float = 60.0) -> None:
    """Poll until `condition()` holds (a hang guard, not a measurement)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.1)


def timed(sandbox: DockerSandbox, code: str, **options):
    start = time.monotonic()
    result = sandbox.run(code, **options)
    return result, time.monotonic() - start


LOOK_AROUND = """\
import json, os, resource
def read(*paths):
    for path in paths:
        try:
            return open(path).read().strip()
        except OSError:
            pass
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
print(json.dumps({
    "ids": [os.getuid(), os.getgid(), os.getgroups()], "cwd": os.getcwd(), "stdin": input(),
    "net": sorted(os.listdir("/sys/class/net")), "caps": status["CapEff"], "no_new_privs": status["NoNewPrivs"],
    "memory": read("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
    "pids": read("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0], "workdir": os.listdir("."),
}))
"""


def test_a_run_is_a_locked_down_container(sandbox):
    result = sandbox.run(LOOK_AROUND, stdin="hello\n")
    assert result.status == "ok", result
    seen = json.loads(result.stdout)
    assert seen["ids"] == [65534, 65534, [65534]] and seen["cwd"] == "/tmp" and seen["stdin"] == "hello"
    assert seen["net"] == ["lo"] and int(seen["caps"], 16) == 0 and seen["no_new_privs"] == "1"
    assert int(seen["memory"]) == (256 + 64) << 20 and seen["pids"] == "64" and seen["fsize"] == 16 << 20
    assert seen["workdir"] == []


def test_a_flood_is_cut_at_the_cap_while_the_program_runs(sandbox):
    """10 MB in 1 MB writes, then a long sleep: cut at the cap long before the deadline (the program still
    ran), with the local sandbox's status (the battery's output_10mb_then_sleep)."""
    code = "import sys, time\nfor _ in range(10):\n    sys.stdout.write('y' * (1 << 20))\ntime.sleep(60)\n"
    result, elapsed = timed(sandbox, code, timeout_s=10)
    assert (result.status, result.exit_code, result.truncated) == ("output_limit", None, True)
    assert result.stdout == "y" * CAP and elapsed < 10


@pytest.mark.parametrize(
    "code",
    [
        "import time\nprint(time.time(), flush=True)\ntime.sleep(60)\n",
        "import time\nprint(time.time(), flush=True)\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.01)\n",
        "import os, time\nprint(time.time(), flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(60)\n",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(time.time(), flush=True)\ntime.sleep(60)\n",
    ],
    ids=["sleep", "drip", "output_closed", "sigterm_ignored"],
)
def test_the_deadline_holds_within_a_second(sandbox, code):
    """The program's run ends within its deadline plus a second (the deadline counts from its start, as the
    local sandbox's; the container's set-up comes before)."""
    called = time.time()
    result = sandbox.run(code, timeout_s=3)
    returned = time.time()
    assert (result.status, result.exit_code) == ("timeout", None), result
    assert returned - called >= 3 - 0.1 and returned - float(result.stdout.split()[0]) < 3 + 1


def test_statuses_are_the_local_sandboxs(sandbox):
    runs = {
        "print(1)": ("ok", 0),
        "import sys\nsys.exit(3)": ("error", 3),
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)": ("killed", -11),
        "x = bytearray(1 << 30)": ("memory", -9),  # the memory cgroup's kill
        "import numpy, sympy\nprint(numpy.__version__, sympy.__version__)": ("ok", 0),
    }
    for code, expected in runs.items():
        result = sandbox.run(code)
        assert (result.status, result.exit_code) == expected, result


def test_files_go_in_and_come_back(sandbox):
    files = {"data.txt": b"given\n", "sub/x.bin": bytes(range(256)), "/mnt/scratch": b"s"}
    code = "cat data.txt /mnt/scratch; echo made > out.txt; mkdir -p deep; head -c 3 sub/x.bin > deep/y"
    result = sandbox.run(code, language="bash", files=files, fetch_files=["out.txt", "deep/y", "sub/x.bin", "absent"])
    assert (result.status, result.stdout) == ("ok", "given\ns"), result
    assert result.files == {"out.txt": b"made\n", "deep/y": bytes(range(3)), "sub/x.bin": bytes(range(256))}


def test_fetched_files_do_not_count_against_the_output_cap(sandbox):
    code = f"import sys\nsys.stdout.write('o' * {CAP - 10})\nopen('big', 'wb').write(b'b' * {4 * CAP})\n"
    result = sandbox.run(code, fetch_files=["big"])
    assert (result.status, len(result.stdout), result.files) == ("ok", CAP - 10, {"big": b"b" * 4 * CAP})
    result = sandbox.run(f"print('o' * {2 * CAP})\nopen('f', 'w').write('x')\n", fetch_files=["f"])
    assert (result.status, len(result.stdout), result.files) == ("output_limit", CAP, {})


@pytest.mark.parametrize("call", ["put_archive", "start", "wait", "reload"])
def test_an_engine_failing_mid_run_is_a_sandbox_error_and_the_container_is_removed(created, monkeypatch, call):
    """Stand-in: one SDK call fails (a real engine cannot be made to fail one call on demand); the
    container around it is real and must be removed. Without a pool, every call is on the run's path."""

    def fail(*args, **kwargs):
        raise requests.exceptions.ConnectionError(f"engine went away during {call}")

    sandbox = DockerSandbox(timeout_s=10, memory_mb=256, pool_size=0, client=created.client)
    monkeypatch.setattr(docker.models.containers.Container, call, fail)
    result, elapsed = timed(sandbox, "print('hello')")
    assert result.status == "sandbox_error" and f"engine went away during {call}" in result.stderr
    assert elapsed < 10


def test_the_default_image_is_built_here_never_pulled(client, monkeypatch):
    monkeypatch.setattr("srt_agent.tools.docker_sandbox.DEFAULT_IMAGE", "srt-agent-sandbox:absent")
    with pytest.raises(
        SandboxUnavailable, match=r"'srt-agent-sandbox:absent' is not built: bash scripts/install_docker"
    ):
        DockerSandbox(image="srt-agent-sandbox:absent")


def test_another_missing_image_is_pulled_or_named(client):
    with pytest.raises(SandboxUnavailable, match=r"'srt-agent-absent:0' is missing and cannot be pulled"):
        DockerSandbox(image="srt-agent-absent:0")


def test_a_missing_image_is_pulled_once():
    """Stand-in: no registry is reachable here, so a pull that succeeds is the stand-in's."""

    class Images:
        pulled: list[str] = []

        def get(self, name):
            raise docker.errors.ImageNotFound(name)

        def pull(self, name):
            self.pulled.append(name)

    class Client:
        images = Images()

    DockerSandbox(image="python:3.12-slim", client=Client())
    assert Client.images.pulled == ["python:3.12-slim"]


def test_the_server_serves_with_docker_and_the_local_sandboxs_libraries(sandbox):
    pins = dict(line.split("==") for line in PINS.read_text().splitlines() if "==" in line and not line.startswith("#"))
    with running_server(ServerConfig(sandbox, workers=2)) as url:
        runtime = requests.get(f"{url}/v1/runtime", timeout=60).json()
        body = {"language": "python", "code": "print(input())", "stdin": "served"}
        answer = requests.post(f"{url}/run_code", json=body, timeout=60).json()
    assert runtime["python"]["image"] == DEFAULT_IMAGE and runtime["sandboxed"]
    assert {name: runtime["python"]["packages"].get(name) for name in pins} == pins
    assert (answer["status"], answer["run_result"]["stdout"]) == ("Success", "served\n")


def test_the_stream_is_demultiplexed_at_any_boundary_up_to_the_cap():
    def frame(stream: int, data: bytes) -> bytes:
        return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data

    stream = frame(1, b"out1") + frame(2, b"err") + frame(1, b"out2")
    for cut in range(len(stream) + 1):
        demux = _Demux(100)
        assert not demux.feed(stream[:cut]) and not demux.feed(stream[cut:])
        assert (demux.out, demux.err) == (b"out1out2", b"err")
    demux = _Demux(6)
    assert demux.feed(stream) and (demux.out, demux.err) == (b"out1", b"er")


def test_the_archive_holds_the_program_its_stdin_and_files():
    with tarfile.open(fileobj=io.BytesIO(_program_archive("echo", "in", "bash", {"/mnt/a": b"A"}, None))) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        folders = {m.name for m in tar.getmembers() if m.isdir()}
    assert files["sandbox/main.sh"] == b"echo" and files["sandbox/stdin"] == b"in"
    assert files["sandbox/files/.mnt/a"] == b"A" and folders == {"sandbox", "sandbox/files", "sandbox/files/.mnt"}
    assert json.loads(files["sandbox/run.json"])["argv"] == ["/bin/bash", "/sandbox/main.sh"]


def test_fetched_files_come_off_the_end_of_stdout_only_with_the_mark():
    payload = json.dumps({"f": "eA=="}).encode()
    out = bytearray(b"printed" + payload + b"MARK" + b"%016x" % len(payload))
    assert _take_fetched(out, b"MARK") == {"f": b"x"} and out == b"printed"
    out = bytearray(b"printed, then killed")
    assert _take_fetched(out, b"MARK") == {} and out == b"printed, then killed"


def test_a_warm_container_runs_one_program_only(sandbox):
    """Runs take containers started ahead of them; what one program leaves (a file, a process) is never
    seen by the next, because no container runs a second program."""
    wait_for(lambda: sandbox.pool.waiting() == sandbox.pool_size)
    leave = "import subprocess\nopen('left', 'w').write('x')\nsubprocess.Popen(['sleep', '60'])\nprint('left')"
    look = "import os\nprint(sorted(os.listdir('.')), len([p for p in os.listdir('/proc') if p.isdigit()]))"
    first, second = sandbox.run(leave), sandbox.run(look)
    assert (first.status, first.stdout) == ("ok", "left\n")
    assert (second.status, second.stdout) == ("ok", "[] 2\n")  # the launcher and this program
    assert sandbox.pool.counts["taken"] == 2


def serve_docker(created, **options):
    """`sandbox serve` on Docker, its sandbox's containers recorded."""
    box = DockerSandbox(timeout_s=10, memory_mb=256, client=created.client)
    return running_server(ServerConfig(box, **options))


def test_a_client_that_leaves_takes_its_container_with_it(created):
    with serve_docker(created) as url:
        body = {"code": "import time\ntime.sleep(60)", "language": "python", "run_timeout": 60}
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(f"{url}/run_code", json=body, timeout=3)
        wait_for(lambda: requests.get(f"{url}/v1/load", timeout=10).json()["running"] == 0)
        load = requests.get(f"{url}/v1/load", timeout=10).json()
        running = [
            cid for cid in created.ids if created.client.containers.list(filters={"id": cid, "status": "running"})
        ]
    assert (load["cancelled"], load["started"], load["sandbox"]) == (1, 1, "DockerSandbox")
    assert len(running) <= 4  # only the pool's waiting ones ran on; the sleeper's container was killed


def test_overload_is_a_sandbox_error_and_an_interactive_call_starts_ahead(created, client):
    """One slot held by a sleeper, a request queued behind it: that one is answered SandboxError (overloaded)
    at its deadline, while a short call starts in the interactive slot; a busy loop past its CPU quantum has
    its container's CPU weight lowered."""
    with serve_docker(created, workers=1, fresh_slots=1, interactive_slots=1) as url:
        post = lambda code, run, compile_s=0.0: requests.post(  # noqa: E731
            f"{url}/run_code",
            json={"code": code, "language": "python", "run_timeout": run, "compile_timeout": compile_s},
            timeout=run + compile_s + 30,
        ).json()
        held, queued = {}, {}
        holder = threading.Thread(target=lambda: held.update(post("while True:\n    pass", 8)))
        holder.start()
        wait_for(lambda: requests.get(f"{url}/v1/load", timeout=10).json()["running"] == 1)
        waiting = threading.Thread(target=lambda: queued.update(post("print(2)", 6, 1)))
        waiting.start()
        probe = post("print(1)", 5)
        wait_for(lambda: lowered(created.ids) != [])
        waiting.join()
        holder.join()
    assert (probe["status"], probe["run_result"]["stdout"]) == ("Success", "1\n")
    assert (queued["status"], queued["srt_status"]) == ("SandboxError", "overloaded")
    assert "overloaded" in queued["message"] and held["srt_status"] in ("timeout", "overloaded")


def lowered(ids: list[str]) -> list[str]:
    """The containers among `ids` whose CPU cgroup has the least weight."""
    found = []
    for cid in ids:
        for path in (
            Path(f"/sys/fs/cgroup/cpu/docker/{cid}/cpu.shares"),
            Path(f"/sys/fs/cgroup/docker/{cid}/cpu.weight"),
        ):
            if path.exists() and path.read_text().strip() in ("1", "2"):
                found.append(cid)
    return found
