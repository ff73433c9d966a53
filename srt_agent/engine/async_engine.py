"""AsyncEngine: the engine's step loop in a background thread, awaited by many coroutines at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable, Hashable

from .engine import Engine
from .params import RequestOutput, SamplingParams


class AsyncEngine:
    """Thread-safe front of an Engine: `await generate(...)` from any number of coroutines.

    All engine calls run on one background thread; submissions and releases reach it through a queue,
    results come back to each caller's event loop. Follows verl's server API: every turn passes the
    full token list so far under the same `request_id` (see Engine.add_request).
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._waiters: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="srt-engine", daemon=True)
        self._thread.start()

    async def generate(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams | None = None, prompt_key: Hashable | None = None
    ) -> RequestOutput:
        """Generate one turn; bad input comes back as finish_reason "error" (never raises for it)."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def submit() -> None:
            if request_id in self._waiters:
                message = f"request {request_id!r} is already running"
                loop.call_soon_threadsafe(_set_result, future, _error_output(request_id, message))
                return
            self._waiters[request_id] = (loop, future)
            try:
                self.engine.add_request(prompt_ids, params, request_id, prompt_key)
            except ValueError as exc:
                self._resolve(request_id, _error_output(request_id, str(exc)))

        self._commands.put(submit)
        return await future

    def release(self, request_id: str) -> None:
        """Forget a finished request (frees its held KV and ends it in the drafter)."""
        self._commands.put(lambda: self.engine.release(request_id))

    def call(self, fn: Callable[[Engine], object]) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between steps (e.g. update_weights, end_step).

        Returns a future of its result (``.result()`` waits; an exception in `fn` is raised there).
        """
        if self._closed:
            raise RuntimeError("the engine is closed")
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

        self._commands.put(run)
        return future

    def idle_capacity(self) -> int:
        return self.engine.idle_capacity()

    def close(self) -> None:
        """Stop the loop; requests still running get an "error" output."""
        self._closed = True
        self._commands.put(lambda: None)
        self._thread.join()

    def _resolve(self, request_id: str, output: RequestOutput) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None:
            loop, future = waiter
            loop.call_soon_threadsafe(_set_result, future, output)

    def _loop(self) -> None:
        try:
            while True:
                busy = self.engine.has_unfinished() and not self._closed
                try:
                    command = self._commands.get(block=not busy, timeout=None)
                except queue.Empty:
                    command = None
                while command is not None:
                    command()
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                if self._closed:
                    break
                if self.engine.has_unfinished():
                    for out in self.engine.step():
                        self._resolve(out.request_id, out)
        except BaseException as exc:  # the engine itself failed: fail every waiter, loudly
            self._error = exc
            raise
        finally:
            reason = f"engine stopped: {self._error!r}" if self._error else "engine closed"
            for request_id in list(self._waiters):
                self._resolve(request_id, _error_output(request_id, reason))


def _set_result(future: asyncio.Future, output: RequestOutput) -> None:
    if not future.done():
        future.set_result(output)


def _error_output(request_id: str, message: str) -> RequestOutput:
    return RequestOutput(request_id, [], [], "error", error=message)
