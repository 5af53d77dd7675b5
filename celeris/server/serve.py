"""``python -m celeris serve``: the API alone, under uvicorn, with a draining shutdown.

The port opens at once; the model loads in the background (/ready answers 503 meanwhile).
With ``--ray`` the same app runs as Ray Serve replicas instead (``ray_serve``).
SIGTERM or Ctrl+C stops admitting requests (503), lets running ones finish within
``--drain-timeout`` seconds, then exits 0; a second signal exits at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import Any

import uvicorn

from .. import Engine, EngineConfig, ModelLoadError
from .app import create_app
from .state import ServerState

log = logging.getLogger("celeris.server")
DRAIN_TIMEOUT_S = 30.0


def main(args: argparse.Namespace) -> int:
    if getattr(args, "ray", False):
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
    device, dtype = getattr(args, "device", "auto"), getattr(args, "dtype", "auto")
    EngineConfig(device=device, dtype=dtype, **options)   # bad options fail before the port
    failed = threading.Event()
    server: DrainingServer | None = None

    def load() -> Engine:
        try:
            return Engine.from_pretrained(getattr(args, "model", None), device=device,
                                          dtype=dtype, **options)
        except Exception:
            failed.set()
            if server is not None:
                server.should_exit = True
            raise

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = create_app(load, api_key=api_key, host=args.host)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                            access_log=True)
    server = DrainingServer(config, app.state.celeris,
                            float(getattr(args, "drain_timeout", None) or DRAIN_TIMEOUT_S))
    server.should_exit = failed.is_set()   # the loader may have failed before `server` existed
    server.run()
    if failed.is_set():   # reported by the CLI as "error: ..." with exit status 2
        raise ModelLoadError(app.state.celeris.failure or "loading the model failed")
    return 0


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains the engine before shutting down.

    uvicorn's own handler closes the socket at once and re-raises the signal at exit (which
    ends the process with a non-zero status); a second signal still forces the exit.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState,
                 drain_timeout: float) -> None:
        super().__init__(config)
        self.state, self.drain_timeout = state, drain_timeout
        self.draining = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.draining or self.should_exit:
            self.should_exit = self.force_exit = True
            return
        self.draining = True
        log.info("signal %s: draining for up to %.0f s, then exiting", sig, self.drain_timeout)
        threading.Thread(target=self._drain, name="celeris-drain", daemon=True).start()

    def _drain(self) -> None:
        if not self.state.drain_sync(self.drain_timeout):
            log.warning("drain timeout: the requests still running were aborted")
        self.should_exit = True
