"""Per-run cgroups: limits written, processes joined, groups removed, stale groups of dead hosts cleaned."""

from __future__ import annotations

import os
import subprocess

import pytest

from srt_agent.tools.cgroup import CgroupLimiter

LIMITER = CgroupLimiter.detect()
pytestmark = pytest.mark.skipif(LIMITER is None, reason="machine: no writable cgroup memory/pids controllers here")


def test_group_gets_limits_and_processes_and_is_removed():
    group = LIMITER.create(300 << 20, 17)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        limit_file = "memory.max" if group.version == 2 else "memory.limit_in_bytes"
        assert int((group.memory_dir / limit_file).read_text()) == 300 << 20
        assert (group.pids_dir / "pids.max").read_text().strip() == "17"
        group.add(sleeper.pid)
        assert str(sleeper.pid) in (group.pids_dir / "cgroup.procs").read_text().split()
        assert not group.oom_killed()
    finally:
        sleeper.kill()
        sleeper.wait()
        group.remove()
    assert not group.memory_dir.exists() and not group.pids_dir.exists()


def test_stale_groups_of_dead_hosts_are_removed():
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid now names no process
    stale = LIMITER.memory_base / f"run-{dead.pid}-stale"
    mine = LIMITER.memory_base / f"run-{os.getpid()}-alive"
    stale.mkdir()
    mine.mkdir()
    try:
        CgroupLimiter.detect()
        assert not stale.exists() and mine.exists()
    finally:
        for folder in (stale, mine):
            if folder.exists():
                folder.rmdir()
