"""Per-run control groups: one memory and process budget for a whole sandbox, all its processes together.

rlimits bound each process; a program that forks 64 children of 512 MB each would still reach 32 GB.
Where the host lets us create cgroups (root with a writable cgroup v2 tree, or v1 `memory` and `pids`
hierarchies), every run gets its own group with `memory` (RAM, its /tmp included) and `pids` caps,
and the group's OOM counter tells a memory kill from any other SIGKILL.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "srt-agent-sandbox"
_V1_MEMORY_FILES = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")


@dataclass
class RunCgroup:
    """The cgroup(s) of one run: v2 has one folder; v1 one in `memory` and one in `pids`."""

    version: int
    memory_dir: Path
    pids_dir: Path

    def add(self, pid: int) -> None:
        for folder in {self.memory_dir, self.pids_dir}:
            (folder / "cgroup.procs").write_text(str(pid))

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this run for going over its memory cap."""
        try:
            if self.version == 2:
                events = (self.memory_dir / "memory.events").read_text().split()
                counts = dict(zip(events[::2], events[1::2]))
                return int(counts.get("oom_kill", "0")) > 0
            control = (self.memory_dir / "memory.oom_control").read_text().split()
            counts = dict(zip(control[::2], control[1::2]))
            if "oom_kill" in counts:
                return int(counts["oom_kill"]) > 0
            return int((self.memory_dir / "memory.failcnt").read_text()) > 0  # kernels without the counter
        except (OSError, ValueError):
            return False

    def remove(self, wait_s: float = 2.0) -> None:
        """Delete the group once its last process is gone (killed processes take a moment to exit)."""
        deadline = time.monotonic() + wait_s
        for folder in {self.memory_dir, self.pids_dir}:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


@dataclass
class CgroupLimiter:
    """Makes per-run groups under `memory_base`/`pids_base` (the same folder on cgroup v2)."""

    version: int
    memory_base: Path
    pids_base: Path

    @classmethod
    def detect(cls, root: Path = CGROUP_ROOT) -> CgroupLimiter | None:
        """A limiter when this process may create memory- and pids-limited groups, else None."""
        if os.geteuid() != 0:
            return None
        try:
            if (root / "cgroup.controllers").exists():
                if not {"memory", "pids"} <= set((root / "cgroup.subtree_control").read_text().split()):
                    return None
                base = root / GROUP_NAME
                base.mkdir(exist_ok=True)
                (base / "cgroup.subtree_control").write_text("+memory +pids")
                limiter = cls(2, base, base)
            else:
                memory, pids = root / "memory" / GROUP_NAME, root / "pids" / GROUP_NAME
                memory.mkdir(exist_ok=True)
                pids.mkdir(exist_ok=True)
                limiter = cls(1, memory, pids)
        except OSError:
            return None
        limiter.remove_stale()
        return limiter

    def remove_stale(self) -> None:
        """Remove the (empty) groups left by runs whose host process died mid-run."""
        for base in {self.memory_base, self.pids_base}:
            for folder in base.glob("run-*"):
                owner = folder.name.split("-")[1]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    try:
                        folder.rmdir()
                    except OSError:
                        pass

    def create(self, memory_bytes: int, max_pids: int) -> RunCgroup:
        """A fresh group capped at `memory_bytes` of RAM (no swap) and `max_pids` tasks."""
        name = f"run-{os.getpid()}-{secrets.token_hex(6)}"
        run = RunCgroup(self.version, self.memory_base / name, self.pids_base / name)
        for folder in {run.memory_dir, run.pids_dir}:
            folder.mkdir()
        try:
            limit, swap = ("memory.max", "memory.swap.max") if self.version == 2 else _V1_MEMORY_FILES
            (run.memory_dir / limit).write_text(str(memory_bytes))
            if (run.memory_dir / swap).exists():  # only with swap accounting; v1 counts RAM + swap here
                (run.memory_dir / swap).write_text("0" if self.version == 2 else str(memory_bytes))
            (run.pids_dir / "pids.max").write_text(str(max_pids))
        except OSError:
            run.remove()
            raise
        return run
