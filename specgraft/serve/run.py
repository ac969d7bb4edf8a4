"""Running the app under uvicorn with the server's shutdown rule.

On SIGINT/SIGTERM uvicorn stops accepting connections and waits for the open ones. In-flight
requests may finish for ``grace`` seconds; then they are cancelled in the engine, so each
stream ends with an error event and ``data: [DONE]`` (a non-streaming request gets a 503)
rather than being cut by uvicorn's own timeout (kept as a backstop). The lifespan's shutdown
then stops the model worker, and the process exits with status 0.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from fastapi import FastAPI

#: Seconds uvicorn waits beyond the grace period before it cancels what is still open.
BACKSTOP_S = 10.0


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` that cancels the app's in-flight requests ``grace`` seconds into a
    shutdown (module docstring)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace: float):
        if grace < 0:
            raise ValueError(f"the shutdown grace period must be >= 0 seconds, got {grace}")
        super().__init__(config)
        self.worker = app.state.worker
        self.grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace, self.worker.cancel_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
        # uvicorn would raise the signal again once it has shut down; the shutdown was clean, so
        # the process exits 0 instead
        self._captured_signals.clear()


def server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", grace: float = 30.0) -> GracefulServer:
    """A server for ``app`` (``create_app``); ``server(...).run()`` serves until SIGINT/SIGTERM
    (``run(sockets=[sock])`` serves on a bound socket instead of ``host``/``port``)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace + BACKSTOP_S)
    return GracefulServer(config, app, grace)
