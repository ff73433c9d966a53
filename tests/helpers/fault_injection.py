"""What the fault-injection tests share: the injected exception, and what "nothing leaks" means for the
host (processes, threads, fds, temp files) and for an engine (sequences, KV slots, drafter requests,
cache bytes)."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass

import psutil

from srt_agent.engine import Engine


class InjectedFault(RuntimeError):
    """The exception every injected fault raises, so a test can tell it from a real bug."""


@dataclass(frozen=True)
class HostState:
    """What this process holds that a contained fault must give back: child processes, threads, fds,
    and entries in the temp directory."""

    children: frozenset[int]
    threads: frozenset[int]
    fds: frozenset[str]
    temp_files: frozenset[str]

    @classmethod
    def now(cls) -> HostState:
        return cls(
            children=frozenset(p.pid for p in psutil.Process().children(recursive=True)),
            threads=frozenset(t.ident for t in threading.enumerate()),
            fds=frozenset(os.listdir("/proc/self/fd")),
            # vLLM engines that other test workers start leave their rendezvous files here (not ours to give back).
            temp_files=frozenset(n for n in os.listdir(tempfile.gettempdir()) if not n.startswith("vllm_dist_")),
        )


def host_leaks(before: HostState, wait_s: float = 10.0) -> list[str]:
    """What is held now and was not `before` (after giving stragglers `wait_s` to finish)."""
    deadline = time.monotonic() + wait_s
    while True:
        now = HostState.now()
        leaks = [f"process {pid}" for pid in now.children - before.children]
        leaks += [f"thread {ident}" for ident in now.threads - before.threads]
        leaks += [f"fd {fd}" for fd in now.fds - before.fds]
        leaks += [f"temp file {name}" for name in now.temp_files - before.temp_files]
        if not leaks or time.monotonic() > deadline:
            return leaks
        time.sleep(0.05)


def engine_leaks(engine: Engine) -> list[str]:
    """What an engine still holds once every request was released: sequences, KV slots, requests the
    drafter still follows, and (for SRT) a byte counter that differs from the trees' real sizes."""
    leaks = [f"sequence {rid}" for rid in engine.sequences]
    sched = engine.scheduler
    leaks += [f"slot {s}" for s in set(range(sched.num_slots)) - set(sched.free_slots)]
    leaks += [f"queued {s.request_id}" for s in list(sched.running) + list(sched.waiting) + list(sched.held.values())]
    cache = getattr(engine.drafter, "cache", None)
    if cache is not None:
        stats = cache.stats()
        leaks += [f"drafter request {i}" for i in range(stats.active_requests)]
        real = sum(entry.tree.nbytes for entry in cache._prompts.values())
        if stats.bytes != real:
            leaks.append(f"cache counts {stats.bytes} bytes, its trees hold {real}")
    return leaks
