"""DockerSandbox.run against a stand-in Docker client.

No Docker engine runs on the test machines, so `docker.from_env()` returns the fakes below (a test
double): they replay what the engine's API gives back (attach stream chunks, wait status, OOM flag)
so that the sandbox's own logic is checked — limits passed to `create`, status mapping, the deadline
kill, the output cap, cleanup, and errors that must come back as results, never as exceptions.
The unreachable-daemon error runs against the real SDK in test_sandbox_backends.py.
"""

from __future__ import annotations

import threading

import pytest

docker = pytest.importorskip("docker", reason="the docker client is an optional extra: pip install 'srt-agent[docker]'")
requests = pytest.importorskip("requests")

from srt_agent.tools import DockerSandbox, SandboxUnavailable  # noqa: E402


class FakeContainer:
    def __init__(self, chunks=(), status=0, oom=False, block=False, wait_error=None):
        self.chunks, self.status, self.block, self.wait_error = list(chunks), status, block, wait_error
        self.attrs = {"State": {"OOMKilled": oom}}
        self.killed, self.removed, self.archive = threading.Event(), False, None

    def put_archive(self, path, data):
        self.archive = (path, data)

    def attach(self, **kwargs):
        assert kwargs["demux"] and kwargs["stream"]
        yield from self.chunks
        if self.block:  # a program still running: the stream ends when the container is killed
            assert self.killed.wait(10)

    def start(self):
        pass

    def kill(self):
        self.killed.set()

    def wait(self, timeout):
        if self.wait_error is not None:
            raise self.wait_error
        return {"StatusCode": 137 if self.killed.is_set() else self.status}

    def reload(self):
        pass

    def remove(self, force):
        self.removed = True


class FakeImages:
    def __init__(self, present=True, pull_error=None):
        self.present, self.pull_error, self.pulled = present, pull_error, []

    def get(self, name):
        if not self.present:
            raise docker.errors.ImageNotFound(f"no such image: {name}")

    def pull(self, name):
        if self.pull_error is not None:
            raise self.pull_error
        self.pulled.append(name)


class FakeClient:
    def __init__(self, container=None, images=None):
        self.container, self.images, self.created = container, images or FakeImages(), []
        self.containers = self

    def ping(self):
        return True

    def create(self, image, **kwargs):
        self.created.append((image, kwargs))
        return self.container


def sandbox_with(monkeypatch, client, **options) -> DockerSandbox:
    monkeypatch.setattr(docker, "from_env", lambda: client)
    return DockerSandbox(**options)


def test_a_clean_run_passes_the_limits_and_removes_the_container(monkeypatch):
    container = FakeContainer(chunks=[(b"42\n", None)])
    client = FakeClient(container)
    result = sandbox_with(monkeypatch, client, memory_mb=256, cpus=0.5, max_processes=16).run("print(42)")
    assert (result.status, result.stdout, result.exit_code) == ("ok", "42\n", 0)
    ((image, kwargs),) = client.created
    assert image == "python:3.11-slim" and kwargs["network_mode"] == "none"
    assert (kwargs["mem_limit"], kwargs["nano_cpus"], kwargs["pids_limit"]) == ("256m", 500_000_000, 16)
    assert kwargs["user"] != "root" and container.archive[0] == "/" and container.removed


@pytest.mark.parametrize(
    "container,status,exit_code",
    [
        (FakeContainer(chunks=[(None, b"Traceback\nZeroDivisionError\n")], status=1), "error", 1),
        (FakeContainer(chunks=[(None, b"Killed\n")], status=137, oom=True), "memory", 137),
        (FakeContainer(status=137), "killed", -9),
    ],
)
def test_exit_statuses_map_to_ours(monkeypatch, container, status, exit_code):
    result = sandbox_with(monkeypatch, FakeClient(container)).run("...")
    assert (result.status, result.exit_code) == (status, exit_code) and container.removed


def test_the_deadline_kills_the_container(monkeypatch):
    container = FakeContainer(chunks=[(b"started\n", None)], block=True)
    result = sandbox_with(monkeypatch, FakeClient(container), timeout_s=0.2).run("while True: pass")
    assert result.status == "timeout" and container.killed.is_set() and result.stdout == "started\n"
    assert container.removed


def test_output_past_the_cap_kills_the_container(monkeypatch):
    container = FakeContainer(chunks=[(b"x" * 60, None), (b"y" * 60, None)], block=True)
    result = sandbox_with(monkeypatch, FakeClient(container), max_output_bytes=100).run("...")
    assert result.status == "output_limit" and result.truncated and len(result.stdout) == 100
    assert container.killed.is_set() and container.removed


def test_engine_errors_come_back_as_results(monkeypatch):
    container = FakeContainer(chunks=[(b"ok", None)], wait_error=requests.exceptions.ReadTimeout("engine stalled"))
    result = sandbox_with(monkeypatch, FakeClient(container)).run("print('ok')")
    assert result.status == "sandbox_error" and "engine stalled" in result.stderr and container.removed


def test_a_missing_image_is_pulled_once_or_named_in_the_error(monkeypatch):
    images = FakeImages(present=False)
    sandbox_with(monkeypatch, FakeClient(images=images), image="python:3.12-slim")
    assert images.pulled == ["python:3.12-slim"]
    images = FakeImages(present=False, pull_error=docker.errors.APIError("pull access denied"))
    with pytest.raises(SandboxUnavailable, match="'python:3.12-slim' is missing and cannot be pulled"):
        sandbox_with(monkeypatch, FakeClient(images=images), image="python:3.12-slim")
