"""``python -m celeris serve``: the API alone, under uvicorn, with a draining shutdown.

The port opens at once; the model loads in the background (/ready and the API answer 503
meanwhile). With ``--ray`` the same app runs as Ray Serve replicas instead
(``ray_serve``). SIGTERM or Ctrl+C stops admitting requests (503), lets running ones finish within
``--drain-timeout`` seconds, then exits 0; a second signal stops at once: running requests are
aborted, and the process exits with 128 + the signal number, without tracebacks.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
import threading
from typing import Any

import uvicorn

from .. import Engine, EngineConfig, ModelLoadError
from ..config import BIG_MODEL_FIELDS
from ..hints import free_port
from .app import create_app
from .slow_clients import BODY_TIMEOUT_S, HEAD_TIMEOUT_S, timed_h11
from .state import ServerState

log = logging.getLogger("celeris.server")
DRAIN_TIMEOUT_S = 30.0
MAX_HEAD_BYTES = 20 * 1024   # a request head arriving in pieces (h11; whole ones: HeaderLimit)
MAX_CONNECTIONS = 512        # open connections (or running requests) beyond which uvicorn says 503
KEEP_ALIVE_S = 5             # an idle keep-alive connection is closed after this


def main(args: argparse.Namespace) -> int:
    if getattr(args, "ray", False):
        big = [f"--{k.replace('_', '-')}" for k in BIG_MODEL_FIELDS
               if k != "quantize" and getattr(args, k, None) is not None]
        if big:     # each replica loads its model on its own device (--gpus-per-replica)
            raise ValueError(f"{', '.join(big)} do not apply with --ray: every replica loads "
                             "the model on its own device; give --gpus-per-replica instead")
        from .ray_serve import main as ray_main
        return ray_main(args)
    ray_only = [f"--{dest.replace('_', '-')}" for dest in
                ("replicas", "autoscale", "address", "gpus_per_replica", "cpus_per_replica")
                if getattr(args, dest, None) is not None]
    if ray_only:
        raise ValueError(f"{', '.join(ray_only)} only apply with --ray")
    api_key = getattr(args, "api_key", None) or os.environ.get("CELERIS_API_KEY") or None
    options = {k: v for k in ("max_running", "max_queue")
               if (v := getattr(args, k, None)) is not None}
    if getattr(args, "request_timeout", None) is not None:
        options["request_timeout_s"] = args.request_timeout
    if getattr(args, "compile", False):
        options["compile"] = True
    options.update({k: v for k in BIG_MODEL_FIELDS
                    if (v := getattr(args, k, None)) is not None})
    device, dtype = getattr(args, "device", "auto"), getattr(args, "dtype", "auto")
    EngineConfig(device=device, dtype=dtype, **options)   # bad options fail before the port
    drain_timeout = _drain_timeout(getattr(args, "drain_timeout", None))
    check_port(args.port)
    try:   # before the model loads: no thread is running yet when this fails
        sock = bind_socket(args.host, args.port)
    except PortUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = threading.Event()
    server: DrainingServer | None = None

    def give_up() -> None:   # loading or warming up failed for good: exit non-zero
        failed.set()
        if server is not None:
            server.should_exit = True

    def load() -> Engine:
        try:
            return Engine.from_pretrained(getattr(args, "model", None), device=device,
                                          dtype=dtype, **options)
        except Exception:
            give_up()
            raise

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = create_app(load, api_key=api_key, host=args.host, on_fatal=give_up)
    server = DrainingServer(uvicorn_config(app, args.host, args.port), app.state.celeris,
                            drain_timeout)
    server.should_exit = failed.is_set()   # the loader may have failed before `server` existed
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if failed.is_set():   # reported by the CLI as "error: ..." with exit status 2
        raise ModelLoadError(app.state.celeris.failure or "loading the model failed")
    return server.exit_code()


class PortUnavailable(OSError):
    """The port cannot be listened on (in use, or not allowed)."""


def check_port(port: object) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"--port must be in [1, 65535], got {port!r}")


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), handed to uvicorn; binding here, before the model
    loads, turns a busy port into one line instead of uvicorn's exit from a running server."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortUnavailable(f"port {port} is already in use on {host}; start on "
                                  f"another one with --port {free_port(host, port)}"
                                  ) from None
        raise PortUnavailable(f"cannot listen on {host}:{port}: "
                              f"{exc.strerror or exc}") from None
    return sock


def _drain_timeout(value: Any) -> float:
    value = DRAIN_TIMEOUT_S if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"--drain-timeout must be a number of seconds >= 0, got {value!r}")
    return float(value)


def uvicorn_config(app: Any, host: str, port: int, *, head_timeout_s: float = HEAD_TIMEOUT_S,
                   body_timeout_s: float = BODY_TIMEOUT_S, **options: Any) -> uvicorn.Config:
    """uvicorn settings shared by ``serve`` and app.py: h11 with a cap on a request head that
    arrives in pieces, read timeouts for slow clients (``slow_clients``), a cap on open
    connections, and an access log that never records query strings."""
    config = uvicorn.Config(app, host=host, port=port,
                            http=timed_h11(head_timeout_s, body_timeout_s),
                            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                            **{"log_level": "info", "timeout_graceful_shutdown": 10,
                               "limit_concurrency": MAX_CONNECTIONS,
                               "timeout_keep_alive": KEEP_ALIVE_S, **options})
    logging.getLogger("uvicorn.access").addFilter(strip_query_strings)
    return config


def strip_query_strings(record: logging.LogRecord) -> bool:
    """An access-log filter: "GET /v1/models?api_key=..." is logged as "GET /v1/models"."""
    args = record.args
    if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
        record.args = args[:2] + (args[2].split("?", 1)[0],) + args[3:]
    return True


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains the engine before shutting down.

    uvicorn's own handler closes the socket at once and re-raises the signal at exit (which
    ends the process by that signal). A second signal here aborts the running requests and
    shuts down as usual (``exit_code`` is then 128 + the signal); a third stops waiting.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState | None,
                 drain_timeout: float) -> None:
        super().__init__(config)
        self.state, self.drain_timeout = state, drain_timeout
        self.draining = False
        self.forced_by: int | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.forced_by is not None:      # a third signal: stop waiting for anything
            self.force_exit = True
        elif self.draining or self.should_exit:
            log.warning("signal %s again: aborting the running requests and exiting", sig)
            self.forced_by = sig
            threading.Thread(target=self._abort_all, name="celeris-stop", daemon=True).start()
        else:
            self.draining = True
            log.info("signal %s: draining for up to %g s, then exiting (a second signal exits "
                     "at once)", sig, self.drain_timeout)
            threading.Thread(target=self._drain, name="celeris-drain", daemon=True).start()

    def _drain(self) -> None:
        if self.state is not None and not self.state.drain_sync(self.drain_timeout):
            log.warning("drain timeout: the requests still running were aborted")
        self.should_exit = True

    def _abort_all(self) -> None:
        """Stop the engine (its requests end with an error event at once), then let uvicorn
        close the connections as in any shutdown."""
        aengine = self.state.aengine if self.state is not None else None
        if aengine is not None:
            aengine.engine.stop()
        self.should_exit = True

    def exit_code(self) -> int:
        return 0 if self.forced_by is None else 128 + int(self.forced_by)


__all__ = ["main", "DrainingServer", "uvicorn_config"]
