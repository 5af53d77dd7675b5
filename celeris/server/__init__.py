"""OpenAI-compatible API server: /v1/models, /v1/completions, /v1/chat/completions, /health,
/ready, /metrics. ``create_app(engine)`` for a standalone app, ``add_routes(app, engine)`` to
put the routes on an existing one, ``main(args)`` for ``python -m celeris serve``. (The serving
benchmark is ``celeris.bench.load.bench_serve``.)"""

from .app import add_routes, create_app
from .serve import main
from .state import ServerState

__all__ = ["create_app", "add_routes", "main", "ServerState"]
