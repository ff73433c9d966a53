"""AsyncEngine: an engine's step loop in a background thread, awaited by many coroutines at once.

It drives anything with the stepping interface (:class:`~.interfaces.SteppingEngine`): our :class:`~.engine.Engine`, or
an adapter over another engine (``srt_agent.backends.vllm.vllm_engine.VLLMEngine``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..drafting.request_kind import RequestKind
from .interfaces import SteppingEngine
from .params import RequestOutput, SamplingParams

log = logging.getLogger(__name__)


E = TypeVar("E", bound=SteppingEngine)
STEP_FAILURES_IN_A_ROW = 2  # steps failing one after another (their requests aborted between) mean the engine is stuck


@dataclass
class _Submission:
    """A `generate` call on its way to the engine thread, with the future its caller awaits."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams | None
    prompt_key: Hashable | None
    kind: RequestKind
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future

    def answer(self, output: RequestOutput) -> None:
        try:
            self.loop.call_soon_threadsafe(_set_result, self.future, output)
        except RuntimeError:  # the caller's event loop is closed (e.g. Ctrl-C ended it): nobody waits
            pass

    def fail(self, reason: str) -> None:
        self.answer(_error_output(self.request_id, reason))


@dataclass
class _Command:
    """Work for the engine thread between steps; `fail` tells whoever waits when it can no longer run."""

    run: Callable[[], None]
    fail: Callable[[str], None] = lambda reason: None


class AsyncEngine(Generic[E]):
    """Thread-safe front of a stepping engine: `await generate(...)` from any number of coroutines.

    All engine calls run on one background thread; submissions and releases reach it through a queue,
    results come back to each caller's event loop. Follows verl's server API: every turn passes the
    full token list so far under the same `request_id` (see Engine.add_request).

    Faults stay with their request: bad input (marked `rejected`), a failing drafter or a model fault in one
    request comes back as that request's "error" output, and a failing `call` reaches only its own future. A
    step that raises fails the requests of that step (each told why) and the engine serves on; when it
    cannot go on (steps fail STEP_FAILURES_IN_A_ROW times in a row, or the engine's `needs_restart(exc)`
    says so) `restart(engine)` replaces it (its trees kept, see the backend's), requests arriving meanwhile
    wait, and `health()` says "restarting". Without `restart`, or should it fail, or the step loop itself
    die, every waiting caller gets an "error" output at once, the front reports itself `closed` (with the
    cause in `error`), and later calls raise instead of waiting.
    """

    def __init__(self, engine: E, restart: Callable[[E], E] | None = None):
        self.engine = engine
        self._restart = restart
        self._commands: queue.Queue[_Command | _Submission] = queue.Queue()
        self._waiters: dict[str, _Submission] = {}
        self._lock = threading.Lock()  # orders submissions against the loop's end
        self._closed = False
        self.error: BaseException | None = None  # what killed the step loop, if anything did
        self._state = "ready"
        self.faults = {"step_failures": 0, "restarts": 0, "last": None}
        self._failed_in_a_row = 0
        self._thread = threading.Thread(target=self._loop, name="srt-engine", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """True after `close()` or once the step loop has died (see `error`)."""
        return self._closed

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        prompt_key: Hashable | None = None,
        kind: RequestKind = RequestKind.ROLLOUT,
    ) -> RequestOutput:
        """Generate one turn (`kind`: what the drafter does with it); bad input comes back as finish_reason "error" (never raises for it).

        Raises RuntimeError when the front is closed (see `closed`).
        """
        loop = asyncio.get_running_loop()
        submission = _Submission(request_id, prompt_ids, params, prompt_key, kind, loop, loop.create_future())
        self._put(submission)
        return await submission.future

    def release(self, request_id: str) -> None:
        """Forget a request (frees its held KV and ends it in the drafter); one still running is aborted and its
        caller gets an "error" output. Nothing once closed."""

        def release() -> None:
            self.engine.release(request_id)
            self._resolve(request_id, _error_output(request_id, "released while it ran"))

        try:
            self._put(_Command(release))
        except RuntimeError:
            pass

    def call(self, fn: Callable[[E], object]) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between steps (e.g. update_weights, end_step).

        Returns a future with its result or exception; a raise reaches that future only.
        """
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn(self.engine))
                except Exception as exc:  # noqa: BLE001 - the caller's fault, reported to the caller
                    log.warning("engine call %r failed: %s: %s", fn, type(exc).__name__, exc)
                    done.set_exception(exc)

        command = _Command(run, lambda reason: done.set_exception(RuntimeError(reason)))
        try:
            self._put(command)
        except RuntimeError as exc:
            command.fail(str(exc))
        return done

    def idle_capacity(self) -> int:
        return self.engine.idle_capacity()

    def health(self) -> dict:
        """``status``: "ready", "restarting" (a new engine is starting; requests wait for it), "failed" (the
        engine stopped: see ``error``) or "closed"; with the step failures and restarts so far."""
        status = self._state
        if self._closed:
            status = "failed" if self.error is not None else "closed"
        error = f"{type(self.error).__name__}: {self.error}" if self.error is not None else None
        return {"status": status, **self.faults, "error": error}

    def close(self) -> None:
        """Stop the loop; requests still running get an "error" output."""
        with self._lock:
            self._closed = True
        self._commands.put(_Command(lambda: None))  # wake the loop
        self._thread.join()

    # ----- the engine thread ----------------------------------------------------------------------

    def _put(self, command: _Command | _Submission) -> None:
        """Queue work for the engine thread; RuntimeError once the front is closed."""
        with self._lock:
            if not self._closed:
                self._commands.put(command)
                return
        raise RuntimeError(self._closed_reason())

    def _closed_reason(self) -> str:
        return f"the engine stopped: {self.error!r}" if self.error is not None else "the engine is closed"

    def _submit(self, sub: _Submission) -> None:
        if sub.request_id in self._waiters:
            sub.answer(_error_output(sub.request_id, f"request {sub.request_id!r} is already running"))
            return
        self._waiters[sub.request_id] = sub
        try:
            self.engine.add_request(sub.prompt_ids, sub.params, sub.request_id, sub.prompt_key, sub.kind)
        except Exception as exc:  # noqa: BLE001 - bad input (ValueError) or any other fault of this request
            rejected = isinstance(exc, ValueError)
            message = str(exc) if rejected else f"{type(exc).__name__}: {exc}"
            self._resolve(sub.request_id, _error_output(sub.request_id, message, rejected))

    def _run(self, command: _Command | _Submission) -> None:
        if isinstance(command, _Submission):
            self._submit(command)
            return
        try:
            command.run()
        except Exception:  # noqa: BLE001 - a failing release or call never stops the loop
            log.exception("an engine command failed")

    def _resolve(self, request_id: str, output: RequestOutput) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None:
            waiter.answer(output)

    def _step_failed(self, exc: Exception) -> None:
        """Fail (and abort) the requests of the step that raised `exc`; restart the engine if it is stuck.
        Raises (ending the loop) when it is stuck and cannot be restarted."""
        reason = f"the backend's step failed ({type(exc).__name__}: {exc}); this step's requests were aborted"
        log.warning("%s", reason, exc_info=exc)
        self.faults["step_failures"] += 1
        self.faults["last"] = reason
        for request_id in list(self._waiters):
            try:
                self.engine.release(request_id)
            except Exception:  # noqa: BLE001 - the engine may be past helping; the restart below settles it
                log.exception("aborting %s after a failed step failed", request_id)
            self._resolve(request_id, _error_output(request_id, reason))
        self._failed_in_a_row += 1
        stuck = getattr(self.engine, "needs_restart", lambda _: False)(exc)
        if not stuck and self._failed_in_a_row < STEP_FAILURES_IN_A_ROW:
            return
        if self._restart is None:
            raise RuntimeError(f"the engine cannot go on: {reason}") from exc
        self._state = "restarting"
        log.warning("restarting the engine after: %s", reason)
        self.engine = self._restart(self.engine)  # a raise here ends the loop: the front is failed
        self.faults["restarts"] += 1
        self._failed_in_a_row = 0
        self._state = "ready"
        log.warning("the engine restarted (%d restart(s) so far)", self.faults["restarts"])

    def _loop(self) -> None:
        try:
            while True:
                busy = self.engine.has_work() and not self._closed
                try:
                    command = self._commands.get(block=not busy, timeout=None)
                except queue.Empty:
                    command = None
                while command is not None:
                    self._run(command)
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                if self._closed:
                    break
                if self.engine.has_work():
                    try:
                        outs = self.engine.step()
                    except Exception as exc:  # noqa: BLE001 - fails this step's requests (or, stuck, restarts)
                        self._step_failed(exc)
                        continue
                    self._failed_in_a_row = 0
                    for out in outs:
                        self._resolve(out.request_id, out)
        except BaseException as exc:  # the engine itself failed: fail every waiter, loudly
            self.error = exc
            log.exception("the engine's step loop died; every waiting request gets an error")
        finally:
            with self._lock:
                self._closed = True
            reason = self._closed_reason()
            for request_id in list(self._waiters):
                self._waiters.pop(request_id).fail(reason)
            while True:  # work queued before the end: tell whoever waits on it
                try:
                    self._commands.get_nowait().fail(reason)
                except queue.Empty:
                    break


def _set_result(future: asyncio.Future, output: RequestOutput) -> None:
    if not future.done():
        future.set_result(output)


def _error_output(request_id: str, message: str, rejected: bool = False) -> RequestOutput:
    return RequestOutput(request_id, [], [], "error", error=message, rejected=rejected)
