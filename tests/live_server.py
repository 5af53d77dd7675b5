"""A real uvicorn server on 127.0.0.1 (a free port) in a background thread, for tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator

import httpx
import uvicorn


@contextlib.contextmanager
def live_server(app: Any, wait_ready: bool = True, timeout_s: float = 30.0) -> Iterator[str]:
    """Serve ``app``; yields its base URL (http://127.0.0.1:PORT) and stops it afterwards."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        if wait_ready:
            wait_until_ready(url, deadline - time.monotonic())
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def wait_until_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not become ready"
        time.sleep(0.02)


def slow_down(engine: Any, seconds: float) -> Any:
    """Make every model forward take at least ``seconds`` (returns the hook handle)."""
    return engine.model.register_forward_pre_hook(lambda *_: time.sleep(seconds))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
