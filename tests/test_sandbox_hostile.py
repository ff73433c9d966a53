"""The hostile battery (helpers/sandbox_hostile.py) through every backend, with the same expectations: the local
bubblewrap sandbox, Docker, and `srt-agent sandbox serve` (SandboxFusion's API) on each of them.

Each backend runs the whole battery once, concurrently; then the host listener was never reached, no
process the programs started outlives them, no container is left, and the backend still runs a program.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers.sandbox_hostile import (
    Listener,
    battery,
    failures,
    leftover_processes,
    run_battery,
    with_canary,
)
from helpers.sandboxes import (
    BACKENDS,
    WORKERS,
    backend_sandbox,
    containers_left,
    docker_client_or_skip,
    recorded_containers,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "sandboxes.md"


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
