"""Ctrl-C inside the RL loop (real SIGINTs to this process): it cancels a running event loop's tasks, or
it is held until a safe point; updates hold it until they end."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from srt_agent.rl.interrupt import cooperative_interrupt, deferred_interrupt


def _sigint_soon(loop: asyncio.AbstractEventLoop, delay: float = 0.05) -> None:
    loop.call_later(delay, os.kill, os.getpid(), signal.SIGINT)


def test_a_ctrl_c_during_rollouts_cancels_them_and_leaves_as_keyboard_interrupt():
    cleaned = []

    async def rollouts():
        _sigint_soon(asyncio.get_running_loop())
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)  # cancellation unwinds the coroutine like any other

    before = signal.getsignal(signal.SIGINT)  # pytest-xdist's workers ignore SIGINT
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with cooperative_interrupt():
            asyncio.run(rollouts())
    assert cleaned == [True] and time.monotonic() - start < 10
    assert signal.getsignal(signal.SIGINT) == before


def test_a_ctrl_c_outside_an_event_loop_is_held_until_check():
    with pytest.raises(KeyboardInterrupt):
        with cooperative_interrupt() as check:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            finished = True  # the line after the signal still runs
            check()
    assert finished


def test_a_cancellation_not_caused_by_ctrl_c_stays_a_cancellation():
    async def cancelled():
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        with cooperative_interrupt():
            asyncio.run(cancelled())


def test_an_update_holds_ctrl_c_until_it_ends():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupt() as interrupted:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append(bool(interrupted))
    assert done == [True]
