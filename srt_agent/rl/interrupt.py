"""Ctrl-C during an RL run, taken only where it leaves nothing half done.

A KeyboardInterrupt raised at an arbitrary line can leave a lock held (a progress bar's, a queue's) and
hang the process on its way out. Inside the RL loop Ctrl-C therefore never raises where it lands: it
cancels the rollouts' event loop when one runs (asyncio unwinds it like any cancellation), or it is held
until the loop reaches a safe point; updates and checkpoints hold it until they are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


@contextlib.contextmanager
def cooperative_interrupt() -> Iterator[Callable[[], None]]:
    """For the block, Ctrl-C cancels a running event loop's tasks or is held; yields `check()`, which
    raises KeyboardInterrupt once a Ctrl-C was caught (call it at safe points). A cancellation that a
    Ctrl-C caused leaves the block as KeyboardInterrupt."""
    caught: list = []

    def check() -> None:
        if caught:
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield check
        return

    def on_sigint(*_args) -> None:
        caught.append(True)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no rollouts running: held until the next check()
            return
        loop.call_soon_threadsafe(_cancel_all, loop)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield check
    except asyncio.CancelledError:
        if caught:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[list]:
    """Hold Ctrl-C until the block ends (an update or a checkpoint is never left half done); yields a
    list that is non-empty once a Ctrl-C is held."""
    caught: list = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt
