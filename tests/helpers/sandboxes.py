"""The sandbox backends the hostile battery runs through, Docker's bookkeeping, and `srt-agent sandbox
serve` on a free port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from helpers.sandbox_hostile import MAX_OUTPUT, MEMORY_MB, TIMEOUT_S
from srt_agent.tools import CodeSandbox, DockerSandbox, LocalSandbox, SandboxFusionSandbox
from srt_agent.tools.local import bwrap_path

BACKENDS = ("local", "docker", "server", "server-docker")


WORKERS = 6


def docker_client_or_skip():
    """A client of a Docker engine that answers, else a machine skip (none runs here, or none may)."""
    docker = pytest.importorskip(
        "docker", reason="the docker client is an optional extra: pip install 'srt-agent[docker]'"
    )
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(
            f"machine: no Docker engine answers here ({exc}); as root, bash scripts/install_docker.sh starts one"
        )
    return client


def recorded_containers(sandbox: DockerSandbox | Any) -> list[str]:
    """The ids of the containers `sandbox` (or a docker client) creates from now on (filled as it creates them)."""
    client = getattr(sandbox, "client", sandbox)
    created, create = [], client.api.create_container

    def recording(*args, **kwargs):
        answer = create(*args, **kwargs)
        created.append(answer["Id"])
        return answer

    client.api.create_container = recording
    return created


def containers_left(client, ids: list[str]) -> list[str]:
    return [cid for cid in ids if client.containers.list(all=True, filters={"id": cid})]


@contextmanager
def backend_sandbox(backend: str) -> Iterator[CodeSandbox]:
    """The battery's limits on `backend`; the servers are `srt-agent sandbox serve` on a free port."""
    limits = {"timeout_s": TIMEOUT_S, "max_output_bytes": MAX_OUTPUT, "memory_mb": MEMORY_MB}
    if "docker" in backend:
        docker_client_or_skip()
    elif bwrap_path() is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    if backend == "local":
        yield LocalSandbox(**limits)
    elif backend == "docker":
        box = DockerSandbox(**limits)
        try:
            yield box
        finally:
            box.close()  # its waiting containers go too
    else:
        options = ["--workers", str(WORKERS), "--max-output-bytes", str(MAX_OUTPUT), "--memory-mb", str(MEMORY_MB)]
        with cli_server(options + (["--backend", "docker"] if backend == "server-docker" else [])) as url:
            yield SandboxFusionSandbox(url, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB, retries=1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def cli_server(options: list[str]):
    """`srt-agent sandbox serve` with `options` on a free loopback port; yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "srt_agent.cli", "sandbox", "serve", "--port", str(port), *options]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/ping", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not start: {server.stdout.read().decode()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
