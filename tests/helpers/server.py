"""``specgraft serve``'s app in a real uvicorn server, in a thread on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator

from specgraft.api import SpecDecoder
from specgraft.serve import ServerConfig, create_app
from specgraft.serve.run import server as serve_app

from tests.helpers.models import tiny_llama, tiny_tokenizer

#: seconds any wait on the server (start, stop, a client call) may take
TIMEOUT = 30.0


@contextlib.contextmanager
def running_server(config: ServerConfig, method: str = "pld", decoder: SpecDecoder | None = None) -> Iterator[tuple[str, object]]:
    """A uvicorn server in a thread on a free loopback port: (base url, app); ``decoder`` default:
    the tiny Llama with ``method``."""
    decoder = decoder if decoder is not None else SpecDecoder(tiny_llama(), tiny_tokenizer(), method=method)
    app = create_app(decoder, config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = serve_app(app, log_level="warning", grace=5)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"
        assert not app.state.worker._thread.is_alive(), "the model worker did not stop"
