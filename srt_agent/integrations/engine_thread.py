"""Awaiting work on an AsyncEngine's thread (weight loads, cache exports) from any event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from ..engine import AsyncEngine, Engine

T = TypeVar("T")


async def on_engine_thread(front: AsyncEngine, fn: Callable[[Engine], T]) -> T:
    """Run `fn(engine)` on the engine's thread between steps and await its result (or exception)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def job(engine: Engine) -> None:
        try:
            result, error = fn(engine), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
            result, error = None, exc
        loop.call_soon_threadsafe(settle, result, error)

    front.call(job)
    return await future
