"""An ASGI app served by uvicorn from a background thread: the sandbox server's and the rollout server's
``running()``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def served(app, what: str, host: str = "127.0.0.1", port: int | None = None) -> Iterator[str]:
    """Serve `app` in a background thread (on a free port unless given); yields the base URL. RuntimeError
    naming `what` when it cannot start.

    The thread runs asyncio's own event loop, which gives back all it opened when it stops (uvloop keeps a
    pipe for the rest of the caller's process)."""
    import uvicorn

    if port is None:
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", loop="asyncio"))
    thread = threading.Thread(target=server.run, name=f"srt-{what.replace(' ', '-')}", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the {what} could not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join()
