"""When the sandbox server's programs start, how long each may take, and who goes first under overload.

Every request has a deadline counted from its arrival (the server sets it from the request's timeouts), so
time spent queued counts against it; a request still queued at its deadline is answered at once, and a
program started late gets only the time left. Programs start at nice PROGRAM_NICE (the server itself keeps
the CPU it needs to answer), while fewer than `max_running` run and fewer than `fresh_slots` are fresh.
Once a program has used `quantum_s` of CPU its processes drop to SCHED_IDLE, so a short program started
later (a `print(1)` behind a hundred busy loops, which needs a few hundredths of a second) gets the CPU
first; a program seen to use less than that in its first FRESH_S (it sleeps) keeps its priority. Either
way its fresh slot passes on, and only then: at most `fresh_slots` programs compete at normal priority, and
at most that many sandboxes are being set up at once (a busy Docker engine is asked for a few containers
at a time, the rest wait in the queue; one that shows no process in SETUP_S passes its slot on). A
sandbox whose programs run in a CPU cgroup of their own (Docker's containers) has that group's CPU weight
lowered as well (proctree.lower_priority).

Interactive requests (run timeout at most INTERACTIVE_S, or marked so) have `interactive_slots` fresh slots
of their own beyond `max_running` and `fresh_slots`, start ahead of every other queued request, and run at
the server's priority: a `print(1)` never waits behind a flood's queue. Among the requests that may start,
the caller with the fewest programs running goes first (a fair share per caller), then the request with the
most time left: the oldest ones are the least likely to finish in time anyway. A cancelled request (its
client left) has its processes killed.

A program that timed out without having had its time is reported ``overloaded``, not ``timeout``: it never
started, it was allowed less than half its limit once it started, or it spent at least half of its time
runnable but waiting for a CPU and got less than half a core on average — unless it ran more processes than
the machine has cores (a fork bomb waits for its own processes).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import proctree
from .base import SandboxResult

TICK_S = 0.2  # how often running programs are looked at (priority, CPU figures, cancellations)
FRESH_S = 0.5  # a program that used less than its CPU quantum in this long is not CPU-bound
SETUP_S = 5.0  # a sandbox that shows no process this long after its start passes its fresh slot on
PROGRAM_NICE = 5  # programs start this much below the server's priority
MIN_START_S = 0.05  # a request with less time than this left is not started
STARVED_SHARE = 0.5  # allowed less than this share of its limit, or waiting this share of its time: starved
SANDBOX_PROCESSES = 2  # bubblewrap's own processes (it and the sandbox's init) beside the program's
MEMORY_PER_RUN_MB = 128  # what the default `max_running` budgets per program (a Python program takes 10-30 MB)
INTERACTIVE_S = 5.0  # a request whose run timeout is at most this is interactive

Work = Callable[[float, Callable[[int], None]], SandboxResult]  # (deadline, watch) -> result


def default_max_running(cores: int | None = None, memory_mb: int | None = None) -> int:
    """Programs at once by default: 64 per core, at most one per MEMORY_PER_RUN_MB of the machine's memory."""
    cores = cores or os.cpu_count() or 1
    if memory_mb is None:
        memory_mb = meminfo_mb().get("MemTotal", 4096)
    return max(1, min(64 * cores, memory_mb // MEMORY_PER_RUN_MB))


def default_fresh_slots(cores: int | None = None) -> int:
    """Programs starting (fresh) at once by default: two per core."""
    return 2 * (cores or os.cpu_count() or 1)


def default_interactive_slots(cores: int | None = None) -> int:
    """Interactive programs starting at once beyond the others, by default: one per core."""
    return cores or os.cpu_count() or 1


def meminfo_mb() -> dict[str, int]:
    """/proc/meminfo's figures in MiB ({} where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    return {key: int(value.split()[0]) >> 10 for key, _, value in (line.partition(":") for line in lines)}


@dataclass
class RunLoad:
    """How the server treated one request: seconds before its program started (queue and sandbox set-up),
    seconds its program was allowed once started (its limit, or less when the wait took the rest), CPU
    seconds its processes used, and the longest any of them waited for a CPU while runnable. The CPU figures are sampled every TICK_S while the program runs:
    None for one that ended before the first sample."""

    queued_s: float = 0.0
    allowed_s: float = 0.0
    cpu_s: float | None = 0.0
    cpu_wait_s: float | None = 0.0
    processes: int = 0  # the most processes its sandbox held at once
    started: bool = True  # False: its program never started


@dataclass
class Job:
    """One request in the scheduler: its work, deadline and time limit, and what is known of its processes."""

    work: Work
    deadline: float
    limit_s: float
    memory_mb: int
    caller: str = ""
    interactive: bool = False
    arrival: float = field(default_factory=time.monotonic)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    started: float | None = None
    program_started: float | None = None  # when the sandbox showed its first process
    in_lane: bool = False  # it holds one of the interactive slots while fresh
    roots: list[int] = field(default_factory=list)
    seen: dict[int, tuple[float, float]] = field(default_factory=dict)
    demoted: set[int] = field(default_factory=set)
    processes: int = 0
    lowered: bool = False  # it has used its CPU quantum: its processes run at idle priority
    sleeper: bool = False  # it used less than its quantum in its first FRESH_S: it keeps its priority
    cancelled: bool = False
    restored: bool = False  # past its end, its lowered processes were given their priority back to die

    def end(self) -> float:
        """When its program is to be stopped: its limit after its start, or its deadline if sooner."""
        return min(self.deadline, (self.program_started or self.started or self.arrival) + self.limit_s)

    @property
    def fresh(self) -> bool:
        return self.started is not None and not (self.lowered or self.sleeper)

    def load(self, now: float) -> RunLoad:
        start = self.program_started or self.started or now
        cpu = sum(ran for ran, _ in self.seen.values()) if self.seen or not self.roots else None
        wait = max((waited for _, waited in self.seen.values()), default=0.0) if cpu is not None else None
        allowed = max(0.0, min(self.limit_s, self.deadline - start))
        return RunLoad(start - self.arrival, allowed, cpu, wait, self.processes, self.started is not None)


def starved(load: RunLoad, limit_s: float, cores: int | None = None) -> bool:
    """Whether the program did not get its time (see the module docstring)."""
    if not load.started or load.allowed_s < STARVED_SHARE * limit_s:
        return True
    if load.processes > (cores or os.cpu_count() or 1) + SANDBOX_PROCESSES:
        return False
    cpu, wait = load.cpu_s or 0.0, load.cpu_wait_s or 0.0
    return cpu < STARVED_SHARE * load.allowed_s and wait >= STARVED_SHARE * load.allowed_s


def judged(result: SandboxResult, load: RunLoad, limit_s: float) -> SandboxResult:
    """`result` with a timeout the program did not cause reported ``overloaded``."""
    timed_out = result.status == "timeout" or (result.compile is not None and result.compile.status == "timeout")
    if timed_out and starved(load, limit_s):
        result.status = "overloaded"
        note = (
            f"the sandbox server was overloaded: the program waited {load.queued_s:.1f} s to start and "
            f"{load.cpu_wait_s or 0.0:.1f} s for a CPU, and used {load.cpu_s or 0.0:.1f} s of CPU before its limit"
        )
        if not load.started:
            note = f"the sandbox server was overloaded: the program waited {load.queued_s:.1f} s and never started"
        result.stderr = f"{result.stderr.rstrip()}\n{note}".lstrip("\n")
    return result


class RunScheduler:
    """Starts jobs within the limits above; `submit` returns a job whose `future` resolves to
    ``(SandboxResult, RunLoad)``. Thread-safe; `shutdown` cancels what is queued and kills what runs."""

    def __init__(
        self,
        max_running: int | None = None,
        fresh_slots: int | None = None,
        quantum_s: float = 0.2,
        memory_reserve_mb: int | None = None,
        interactive_slots: int | None = None,
    ):
        self.max_running = max_running or default_max_running()
        self.fresh_slots = fresh_slots or default_fresh_slots()
        self.interactive_slots = default_interactive_slots() if interactive_slots is None else interactive_slots
        if self.max_running < 1 or self.fresh_slots < 1 or quantum_s <= 0 or self.interactive_slots < 0:
            raise ValueError(
                f"max_running and fresh_slots must be >= 1, interactive_slots >= 0 and quantum_s > 0, got "
                f"{self.max_running}, {self.fresh_slots}, {self.interactive_slots}, {quantum_s}"
            )
        self.quantum_s = quantum_s
        total = meminfo_mb().get("MemTotal", 0)
        self.memory_reserve_mb = total // 20 if memory_reserve_mb is None else memory_reserve_mb
        self._queued: list[Job] = []
        self._running: list[Job] = []
        self._lock = threading.Condition()
        threads = self.max_running + self.interactive_slots
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sandbox-run")
        self._closed = False
        self.counts = {"started": 0, "expired_in_queue": 0, "cancelled": 0, "overloaded": 0, "interactive": 0}
        self._monitor = threading.Thread(target=self._watch_loop, name="sandbox-scheduler", daemon=True)
        self._monitor.start()

    def submit(
        self, work: Work, deadline: float, limit_s: float, memory_mb: int, caller: str = "", interactive: bool = False
    ) -> Job:
        job = Job(work, deadline, limit_s, memory_mb, caller, interactive)
        with self._lock:
            if self._closed:
                job.future.set_exception(RuntimeError("the sandbox server is shutting down"))
                return job
            self._queued.append(job)
            self._dispatch(time.monotonic())
        return job

    def cancel(self, job: Job) -> None:
        """Drop a queued job, or kill a running one's processes (its client is gone)."""
        with self._lock:
            if job in self._queued:
                self._queued.remove(job)
                job.future.cancel()
            job.cancelled = True
            self.counts["cancelled"] += 1
            self._kill(job)

    def stats(self) -> dict:
        """What runs and waits now (in all, interactive, per caller), the limits, and counts since the start."""
        with self._lock:
            callers: dict[str, dict[str, int]] = {}
            for state, jobs in (("running", self._running), ("queued", self._queued)):
                for job in jobs:
                    callers.setdefault(job.caller, {"running": 0, "queued": 0})[state] += 1
            return {
                "running": len(self._running),
                "queued": len(self._queued),
                "fresh": self._fresh(lane=False),
                "interactive_running": sum(1 for job in self._running if job.interactive),
                "interactive_queued": sum(1 for job in self._queued if job.interactive),
                "max_running": self.max_running,
                "fresh_slots": self.fresh_slots,
                "interactive_slots": self.interactive_slots,
                "callers": callers,
                **self.counts,
            }

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            for job in self._queued:
                job.future.cancel()
            self._queued.clear()
            for job in self._running:
                job.cancelled = True
                self._kill(job)
            self._lock.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ----- under the lock ---------------------------------------------------------------------------

    def _fresh(self, lane: bool) -> int:
        return sum(1 for job in self._running if job.fresh and job.in_lane == lane)

    def _room_in_memory(self, job: Job) -> bool:
        available = meminfo_mb().get("MemAvailable")
        return available is None or available - job.memory_mb >= self.memory_reserve_mb or not self._running

    def _next(self, jobs: list[Job]) -> Job:
        """Interactive first, then the caller with the fewest programs running, then the most time left."""
        running: dict[str, int] = {}
        for job in self._running:
            running[job.caller] = running.get(job.caller, 0) + 1
        return min(jobs, key=lambda j: (not j.interactive, running.get(j.caller, 0), -j.deadline))

    def _dispatch(self, now: float) -> None:
        """Answer the queued jobs out of time, then start jobs while there is room: interactive ones in their
        own slots first, then any in the others."""
        for job in [j for j in self._queued if j.deadline - now < MIN_START_S]:
            self._queued.remove(job)
            self.counts["expired_in_queue"] += 1
            result = SandboxResult(status="timeout", stderr="no time was left to run it", wall_s=0.0)
            load = job.load(now)
            self._settle(job, judged(result, load, job.limit_s), load)
        threads = self.max_running + self.interactive_slots
        while self._fresh(lane=True) < self.interactive_slots and len(self._running) < threads:
            if not self._start([j for j in self._queued if j.interactive], now, lane=True):
                break
        while len([j for j in self._running if not j.in_lane]) < self.max_running and len(self._running) < threads:
            if self._fresh(lane=False) >= self.fresh_slots or not self._start(self._queued, now, lane=False):
                break

    def _start(self, candidates: list[Job], now: float, lane: bool) -> bool:
        """Start the next of `candidates` (in the interactive slots if `lane`); False when none can start."""
        if not candidates:
            return False
        job = self._next(candidates)
        if not self._room_in_memory(job):
            return False
        self._queued.remove(job)
        job.started, job.in_lane = now, lane
        self._running.append(job)
        self.counts["started"] += 1
        self.counts["interactive"] += job.interactive
        self._pool.submit(self._run, job)
        return True

    def _settle(self, job: Job, result: SandboxResult, load: RunLoad) -> None:
        if result.status == "overloaded":
            self.counts["overloaded"] += 1
        if not job.future.done():
            job.future.set_result((result, load))

    def _kill(self, job: Job) -> None:
        for pid in job.demoted:  # at idle priority a killed process could wait seconds to die
            proctree.restore_priority(pid)
        if job.roots:
            proctree.kill(proctree.descendants(job.roots, proctree.children_by_parent()), groups=job.roots)

    # ----- threads ----------------------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        def watch(pid: int) -> None:
            if not job.interactive:  # interactive programs keep the server's priority
                proctree.set_nice(pid, PROGRAM_NICE)  # before the program starts: all it forks inherits it
            with self._lock:
                job.program_started = job.program_started or time.monotonic()
                job.roots.append(pid)
                if job.cancelled:
                    self._kill(job)

        try:
            result = job.work(job.deadline, watch)
        except Exception as exc:  # noqa: BLE001 - reaches this request's caller only
            with self._lock:
                self._running.remove(job)
                self._dispatch(time.monotonic())
            job.future.set_exception(exc)
            return
        with self._lock:
            now = time.monotonic()
            self._running.remove(job)
            load = job.load(now)
            self._settle(job, judged(result, load, job.limit_s), load)
            self._dispatch(now)

    def _sample(self, figures: dict[int, tuple[Job, list[int], dict]]) -> list[int]:
        """Record the jobs' CPU figures (read outside the lock); the pids to lower, of jobs past their quantum."""
        lower = []
        for job, pids, seen in figures.values():
            if job not in self._running or job.restored:
                continue
            job.processes = max(job.processes, len(pids))
            for pid, (ran, waited) in seen.items():
                before = job.seen.get(pid, (0.0, 0.0))
                job.seen[pid] = (max(before[0], ran), max(before[1], waited))
            used = sum(ran for ran, _ in job.seen.values())
            job.lowered = job.lowered or used >= self.quantum_s
            job.sleeper = not job.lowered and time.monotonic() - (job.program_started or job.started) >= FRESH_S
            for pid in pids if job.lowered else ():
                if pid not in job.demoted:
                    lower.append(pid)
                    job.demoted.add(pid)
        return lower

    def _past_their_end(self, now: float) -> list[int]:
        """The lowered processes of jobs past their end, which their sandbox kills now: at idle priority on
        a busy machine they would take seconds to die, holding their sandbox (the flood's reaping)."""
        restore = []
        for job in self._running:
            if job.demoted and not job.restored and now >= job.end():
                job.restored = True
                restore += job.demoted
        return restore

    def _watch_loop(self) -> None:
        """Every TICK_S: read the running jobs' CPU figures (the lock is held only to note them, so a request
        never waits for /proc), lower those past their quantum, and start what may start."""
        while True:
            with self._lock:
                if self._closed:
                    return
                self._lock.wait(TICK_S)
                watched = [(job, list(job.roots)) for job in self._running if job.roots]
            children = proctree.children_by_parent() if watched else {}
            figures = {}
            for job, roots in watched:
                pids = proctree.descendants(roots, children)
                seen = {pid: found for pid in pids if (found := proctree.cpu_and_wait_s(pid)) is not None}
                figures[id(job)] = (job, pids, seen)
            with self._lock:
                lower = self._sample(figures)
                restore = self._past_their_end(time.monotonic())
            for pid in lower:
                proctree.lower_priority(pid)
            for pid in restore:
                proctree.restore_priority(pid)
            with self._lock:
                now = time.monotonic()
                for job in self._running:  # still being set up (a container starting): it keeps its slot a while
                    job.sleeper = job.sleeper or (not job.roots and now - job.started >= SETUP_S)
                self._dispatch(now)
