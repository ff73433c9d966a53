"""The hostile battery (sandbox_hostile.py) through every backend, with the same expectations: the local
bubblewrap sandbox, Docker, and `srt-agent sandbox serve` (SandboxFusion's API) on each of them.

Each backend runs the whole battery once, concurrently; then the host listener was never reached, no
process the programs started outlives them, no container is left, and the backend still runs a program.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sandbox_hostile import (
    MAX_OUTPUT,
    MEMORY_MB,
    TIMEOUT_S,
    Listener,
    battery,
    failures,
    leftover_processes,
    run_battery,
    with_canary,
)

from srt_agent.tools import CodeSandbox, DockerSandbox, LocalSandbox, SandboxFusionSandbox
from srt_agent.tools.local import bwrap_path

BACKENDS = ("local", "docker", "server", "server-docker")
WORKERS = 6
DOCS = Path(__file__).resolve().parents[1] / "docs" / "sandboxes.md"


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
    from test_server import cli_server

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


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_hostile_program_is_contained(backend: str):
    listener = Listener()
    try:
        with with_canary(), backend_sandbox(backend) as sandbox:
            created = recorded_containers(sandbox) if backend == "docker" else []
            results = run_battery(sandbox, battery(listener.port), workers=WORKERS)
            after = sandbox.run("print('still running programs')", timeout_s=60)
    finally:
        listener.close()
    assert failures(battery(listener.port), results) == []
    assert listener.hits == []
    assert (after.status, after.stdout) == ("ok", "still running programs\n")
    deadline = time.monotonic() + 5
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes() == []
    if created:
        assert containers_left(docker_client_or_skip(), created) == []
    pid = os.fork()  # the host still forks
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def test_the_docs_table_has_a_row_per_case_and_a_column_per_backend():
    lines = DOCS.read_text().splitlines()
    start = lines.index("| case | expected | " + " | ".join(BACKENDS) + " |")
    rows = [line for line in lines[start + 2 :] if line.startswith("|")][: len(battery(0))]
    assert [row.split("|")[1].strip(" `") for row in rows] == [case.name for case in battery(0)]
    assert all(row.count("|") == len(BACKENDS) + 3 and "not contained" not in row for row in rows)
