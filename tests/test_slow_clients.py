"""Slow clients are closed: a request head must arrive whole within the head timeout (bytes
trickled in do not extend it), a request body may not pause longer than the body timeout, and
open connections are capped. Against a real uvicorn server on 127.0.0.1 built by
``uvicorn_config``, the settings ``serve`` and app.py run with (short timeouts here)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from celeris.server.serve import MAX_CONNECTIONS, uvicorn_config

HEAD_S = BODY_S = 1.0
GRACE_S = 4.0          # how long past a timeout a test waits for the close
HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


APP = Starlette(routes=[Route("/health", health), Route("/echo", echo, methods=["POST"])])


@contextlib.contextmanager
def served(**options) -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn_config(APP, "127.0.0.1", sock.getsockname()[1], head_timeout_s=HEAD_S,
                            body_timeout_s=BODY_S, log_level="warning", lifespan="off",
                            **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def connect(port: int, first: bytes = b"") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    if first:
        conn.sendall(first)
    return conn


def closed_within(conn: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``conn`` within ``seconds`` (any response bytes read)."""
    conn.settimeout(seconds)
    try:
        while conn.recv(4096):
            pass
    except (socket.timeout, TimeoutError):
        return False
    except ConnectionError:
        pass
    return True


def test_half_sent_and_silent_connections_are_closed_within_the_head_timeout():
    with served() as port:
        conns = [connect(port, HALF_HEAD) for _ in range(4)] + [connect(port) for _ in range(2)]
        try:
            assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
            assert all(closed_within(c, HEAD_S + GRACE_S) for c in conns)
        finally:
            for c in conns:
                c.close()


def test_a_head_trickled_in_is_closed_at_its_deadline():
    with served() as port, connect(port, HALF_HEAD) as conn:
        conn.settimeout(0.2)
        closed = False
        for _ in range(int((HEAD_S + GRACE_S) / 0.2)):   # one byte per 0.2 s, never a whole head
            try:
                conn.sendall(b"x")
                closed = conn.recv(4096) == b""
            except (socket.timeout, TimeoutError):
                continue
            except ConnectionError:
                closed = True
            if closed:
                break
        assert closed


def test_a_stalled_body_is_closed_and_a_slow_but_flowing_one_is_answered():
    head = b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 60\r\n\r\n"
    with served() as port:
        with connect(port, head + b"x" * 10) as stalled:
            assert closed_within(stalled, BODY_S + GRACE_S)
        with connect(port, head) as flowing:
            for _ in range(6):               # 6 pieces over ~2.4 s: past HEAD_S and BODY_S
                time.sleep(BODY_S * 0.4)
                flowing.sendall(b"y" * 10)
            flowing.settimeout(GRACE_S)
            answer = flowing.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"bytes":60}')


def test_open_connections_are_capped_and_freed_by_the_timeouts():
    assert uvicorn_config(APP, "127.0.0.1", 1).limit_concurrency == MAX_CONNECTIONS
    with served(limit_concurrency=3) as port:
        idle = [connect(port, HALF_HEAD) for _ in range(3)]
        try:
            url = f"http://127.0.0.1:{port}/health"
            assert httpx.get(url).status_code == 503
            assert all(closed_within(c, HEAD_S + GRACE_S) for c in idle)
            assert httpx.get(url).status_code == 200
        finally:
            for c in idle:
                c.close()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True, "5"])
def test_timeouts_must_be_positive_seconds(bad):
    with pytest.raises(ValueError, match="head_timeout_s must be a positive number"):
        uvicorn_config(APP, "127.0.0.1", 1, head_timeout_s=bad)
