"""Docker sandbox containers started ahead of their runs, and the removal of used ones off the runs' path.

A container is started with its launcher waiting for the word to go (docker_sandbox.py), so a run that takes
one skips the engine's create and start (most of a container call's cost). Each container runs one program
only and is then removed: a program may leave processes, files or memory behind, so a used container is
never handed out again, while one that only waited is as fresh as one started for its run. The last
`reserve` waiting containers are kept for interactive runs, so a `print(1)` sent into a flood finds one.
One background thread starts containers (per set of create options runs have asked for) and removes used
ones; `close` removes what waits and what is left to remove.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RETRY_S = 1.0  # after the engine failed to start one, the pool waits this long before the next try


@dataclass
class Warm:
    """A started container waiting for its program: the container, its attach socket (the SDK's and the raw
    connection under it) and its first process's pid on the host (0 when unknown)."""

    container: Any
    sock: Any
    raw: Any
    pid: int


class WarmPool:
    """Up to `size` waiting containers per set of create options (a `key`), made by the `launch` the first
    `take` of that key gave; used containers to remove are handed to `discard`."""

    def __init__(self, size: int, reserve: int = 1, hang_up: Callable[[Warm], None] = lambda warm: None):
        self.size, self.reserve, self._hang_up = size, reserve, hang_up
        self._ready: dict[str, list[Warm]] = {}
        self._launchers: dict[str, Callable[[], Warm]] = {}
        self._doomed: list[Any] = []
        self._cond = threading.Condition()
        self._closed = False
        self._failed_at = 0.0
        self.counts = {"taken": 0, "started": 0, "removed": 0}
        self._thread = threading.Thread(target=self._loop, name="srt-docker-pool", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def want(self, key: str, launch: Callable[[], Warm]) -> None:
        """Keep containers of `key` waiting from now on."""
        with self._cond:
            self._launchers.setdefault(key, launch)
            self._cond.notify()

    def take(self, key: str, launch: Callable[[], Warm], interactive: bool = False) -> Warm | None:
        """A waiting container of `key`, or None (none waits, or only the interactive reserve is left)."""
        with self._cond:
            self._launchers.setdefault(key, launch)
            stock = self._ready.get(key, [])
            warm = stock.pop(0) if len(stock) > (0 if interactive else self.reserve) else None
            self.counts["taken"] += warm is not None
            self._cond.notify()
        return warm

    def discard(self, container: Any) -> None:
        """Remove `container` in the background (it ran its program)."""
        with self._cond:
            self._doomed.append(container)
            self._cond.notify()

    def waiting(self) -> int:
        with self._cond:
            return sum(map(len, self._ready.values()))

    def close(self) -> None:
        """Stop starting containers; remove the waiting ones and those left to remove (waits for it)."""
        with self._cond:
            self._closed = True
            waiting = [warm for stock in self._ready.values() for warm in stock]
            self._ready.clear()
            self._cond.notify_all()
        self._thread.join(timeout=60)
        for warm in waiting:
            self._hang_up(warm)
        with self._cond:
            doomed, self._doomed = self._doomed + [warm.container for warm in waiting], []
        for container in doomed:
            remove_container(container)

    def _short(self) -> str | None:
        """A key with fewer than `size` waiting, unless the engine failed a moment ago."""
        if time.monotonic() - self._failed_at < RETRY_S:
            return None
        return next((key for key in self._launchers if len(self._ready.get(key, [])) < self.size), None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._doomed and self._short() is None:
                    self._cond.wait(RETRY_S)
                if self._closed:
                    return
                key = self._short()
                doomed = None if key is not None else self._doomed.pop(0)
                launch = self._launchers.get(key) if key is not None else None
            if doomed is not None:
                remove_container(doomed)
                self.counts["removed"] += 1
                continue
            try:
                warm = launch()
            except Exception:  # noqa: BLE001 - the engine failed: runs start their own, the pool tries later
                self._failed_at = time.monotonic()
                continue
            self.counts["started"] += 1
            with self._cond:
                if self._closed:
                    self._doomed.append(warm.container)
                    self._hang_up(warm)
                else:
                    self._ready.setdefault(key, []).append(warm)


def remove_container(container: Any) -> None:
    """Remove a container, running or not; an engine that fails here leaves it to
    `docker container prune --filter label=srt-agent.sandbox`."""
    try:
        container.remove(force=True)
    except Exception:  # noqa: BLE001 - whatever the engine says, the run is over
        pass
