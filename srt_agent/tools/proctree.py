"""A running program's processes as Linux's /proc shows them: who descends from whom, how much CPU each
used and how long each waited for one, and the two things the sandbox server does to them (lower their
priority, kill them). Every call tolerates processes that end while it looks."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
        found.setdefault(int(fields[1]), []).append(int(name))
    return found


def descendants(roots: Iterable[int], children: dict[int, list[int]]) -> list[int]:
    """`roots` and every process below them."""
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, ())
    return found


def cpu_and_wait_s(pid: int) -> tuple[float, float] | None:
    """Seconds `pid` has run on a CPU and seconds it has waited, runnable, for one (/proc/PID/schedstat);
    None once it is gone or where the kernel keeps no such figures."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            ran, waited, _ = f.read().split()
    except (OSError, ValueError):
        return None
    return int(ran) / 1e9, int(waited) / 1e9


def set_nice(pid: int, nice: int) -> None:
    """Give `pid` the nice value `nice` (its children to come inherit it)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass


def lower_priority(pid: int) -> None:
    """Put `pid` in SCHED_IDLE: it runs when no normal process wants the CPU."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        pass


def kill(pids: Iterable[int], groups: Iterable[int] = ()) -> None:
    """SIGKILL the process groups `groups` and the processes `pids`."""
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
