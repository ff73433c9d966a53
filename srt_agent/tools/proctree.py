"""A running program's processes as Linux's /proc shows them: who descends from whom, how much CPU each
used and how long each waited for one, and the two things the sandbox server does to them (lower their
priority, kill them). Every call tolerates processes that end while it looks."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

CGROUP_ROOT = "/sys/fs/cgroup"


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
    """Give `pid` the nice value `nice`, and its whole process group when it leads one (bubblewrap's: the
    sandbox's init, forked already, is in it); the children to come inherit it."""
    try:
        group = os.getpgid(pid) == pid
        os.setpriority(os.PRIO_PGRP if group else os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass


def lower_priority(pid: int) -> None:
    """Put `pid` in SCHED_IDLE: it runs when no normal process wants the CPU. When it runs in a CPU cgroup
    other than this process's (a Docker container's), that group gets the least CPU weight too: the kernel
    shares the CPU between groups before the processes within them."""
    _set_policy(pid, os.SCHED_IDLE, cgroup_weights=("2", "1"))


def restore_priority(pid: int) -> None:
    """Undo `lower_priority` (a killed process at idle priority would wait for an idle CPU to die)."""
    _set_policy(pid, os.SCHED_OTHER, cgroup_weights=("1024", "100"))


def _set_policy(pid: int, policy: int, cgroup_weights: tuple[str, str]) -> None:
    """`pid`'s scheduling policy, and the weight (v1 shares, v2 weight) of its CPU cgroup unless it is ours."""
    try:
        os.sched_setscheduler(pid, policy, os.sched_param(0))
    except OSError:
        pass
    group = cpu_cgroup(pid)
    if group is None or group == cpu_cgroup(os.getpid()):
        return
    for folder, name, weight in zip((f"cpu{group}", group.lstrip("/")), ("cpu.shares", "cpu.weight"), cgroup_weights):
        try:
            with open(os.path.join(CGROUP_ROOT, folder, name), "w") as f:
                f.write(weight)
            return
        except OSError:
            continue


def cpu_cgroup(pid: int) -> str | None:
    """The cgroup `pid` is scheduled in (v1's `cpu` hierarchy, else v2's), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    v1 = [path for _, controllers, path in lines if "cpu" in controllers.split(",")]
    v2 = [path for hierarchy, controllers, path in lines if hierarchy == "0" and not controllers]
    return (v1 or v2 or [None])[0]


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
