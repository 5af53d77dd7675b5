"""Celeris composition root: args -> Engine -> FastAPI (/v1, /health) + Gradio playground at /,
all on one port. The only module where celeris, celeris.server and ui meet.

    python app.py [--model DIR] [--models DIR,DIR] [--host 127.0.0.1] [--port 7860]
                  [--api-key KEY]

Each browser tab picks its model among the ``--models`` the operator offers (default: the
shipped ones); engines are loaded once per directory and shared. With an API key, the
playground asks for it too (any user name, the key as password), and so does every Gradio
endpoint.

Also the Hugging Face Space entry point (README front matter: app_file: app.py); Spaces set
GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, which are honoured. Importing this module starts
nothing: tests call ``build_app(engine)``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import re
import sys
from typing import Any, Callable, Sequence

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from starlette.requests import HTTPConnection  # noqa: E402
from starlette.routing import Mount  # noqa: E402

import celeris  # noqa: E402
import ui  # noqa: E402
from celeris.hints import free_port, missing_model_dir, port_free, port_problem  # noqa: E402
from celeris.server import create_app  # noqa: E402
from celeris.server.auth import (LoginGate, add_loopback_host_check, is_loopback,  # noqa: E402
                                  same_origin_only)
from celeris.server.guards import CallCheck  # noqa: E402
from celeris.server.serve import DRAIN_TIMEOUT_S, DrainingServer, uvicorn_config  # noqa: E402

try:   # Hugging Face ZeroGPU: optional; elsewhere the UI handlers run undecorated
    import spaces  # type: ignore[import-not-found]
    GPU_DECORATOR: Callable[[Callable], Callable] | None = spaces.GPU
except ImportError:
    GPU_DECORATOR = None


ROOT = os.path.dirname(os.path.abspath(__file__))
SHIPPED_MODELS = tuple(os.path.join(ROOT, "models", name)
                       for name in ("celeris-tiny-bd", "celeris-tiny"))
# What the playground's login page loads (with a key set, nothing else answers without it).
LOGIN_PAGE = frozenset({"/", "/theme.css", "/favicon.ico", "/manifest.json", "/pwa_icon",
                        "/robots.txt", "/logout"})
LOGIN_PAGE_FILES = ("/assets/", "/static/", "/pwa_icon/")   # scripts, styles, fonts, icons
# Gradio's API calls: by name (/call, /call/v2, /run, /api) or by listener index (queue/join).
GRADIO_CALL = re.compile(r"/gradio_api/(?:(?:call/v2|call|run|api)/(?P<name>[^/]+)|queue/join)/?")
log = logging.getLogger("celeris.playground")
LOGIN_MESSAGE = ("This Celeris server requires its API key: enter any user name and the key "
                 "(CELERIS_API_KEY) as the password.")


# ---------------------------------------------------------------------- arguments
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="app.py", description="Celeris playground + OpenAI API")
    p.add_argument("--model", default=None,
                   help="local model directory or hub id (default: models/celeris-tiny-bd, "
                        "block diffusion; models/celeris-tiny is the full-canvas one)")
    p.add_argument("--models", default=None, metavar="DIR,DIR",
                   help="the models a visitor may pick in the playground's Model tab, "
                        "comma-separated local directories (default: the shipped "
                        "models/celeris-tiny-bd and models/celeris-tiny); --model is always "
                        "offered")
    p.add_argument("--allow-model-paths", action="store_true",
                   help="also let visitors load any local model directory the server can "
                        "read (off by default: only --models are offered)")
    p.add_argument("--host", default=env.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="interface to bind (default 127.0.0.1; env GRADIO_SERVER_NAME)")
    p.add_argument("--port", type=int, default=env.get("GRADIO_SERVER_PORT", "7860"),
                   help="port for the playground and the API, 1-65535 (default 7860; env "
                        "GRADIO_SERVER_PORT)")
    p.add_argument("--api-key", default=env.get("CELERIS_API_KEY") or None,
                   help="require this bearer key on /v1 (default: env CELERIS_API_KEY)")
    p.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT_S, metavar="S",
                   help="on Ctrl+C/SIGTERM, let running API requests finish for up to S "
                        "seconds (default 30); a second signal exits at once")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--device-map", default=None, choices=("auto",),
                   help="--model only: spread its layers over the GPUs, then CPU memory, then "
                        "disk (accelerate), for a model that does not fit one device")
    p.add_argument("--max-memory", default=None, metavar="SPEC",
                   help="--device-map auto: per-device caps, e.g. 0=20GiB,cpu=60GiB")
    p.add_argument("--offload-folder", default=None, metavar="DIR",
                   help="--device-map auto: where layers that fit nowhere else go (disk)")
    p.add_argument("--quantize", default=None, choices=("int8", "int4", "fp8"),
                   help="--model only: weight-only quantization of its layers' linear weights "
                        "(torchao: pip install -r requirements-quant.txt); int8/int4 on the "
                        "CPU and CUDA, fp8 on CUDA GPUs of compute capability >= 8.9")
    p.add_argument("--ar-model", default=None,
                   help="autoregressive twin for the Race tab (default models/celeris-tiny-ar)")
    p.add_argument("--canvas-model", default=None,
                   help="full-attention model that the Race tab runs next to a block-diffusion "
                        "one and that the Infill tab fills with (default models/celeris-tiny)")
    p.add_argument("--share", action="store_true",
                   help="public share link (not available for the mounted app; see message)")
    p.add_argument("--require-key", action="store_true",
                   help="refuse to listen beyond loopback without an API key (the Docker "
                        "image passes this)")
    p.add_argument("--allow-no-key", action="store_true",
                   default=env.get("CELERIS_ALLOW_NO_KEY", "") == "1",
                   help="with --require-key: serve an open demo anyway "
                        "(env CELERIS_ALLOW_NO_KEY=1)")
    return p.parse_args(argv)


def key_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--require-key`` forbids this start (beyond loopback, no key, not allowed)."""
    if not args.require_key or args.api_key or args.allow_no_key or is_loopback(args.host):
        return None
    return (f"refusing to listen on {args.host} without an API key: anyone who can connect "
            "could use the model. Set CELERIS_API_KEY (or --api-key), or pass --allow-no-key "
            "(env CELERIS_ALLOW_NO_KEY=1) to serve an open demo")


def offered_models(spec: str | None) -> tuple[list[str], str | None]:
    """(directories, None) from ``--models``, or ([], why) when one is not a model directory.
    Without ``--models``: the shipped models that are present."""
    if spec is None:
        return [m for m in SHIPPED_MODELS if os.path.isfile(os.path.join(m, "config.json"))], None
    dirs = [part.strip() for part in spec.split(",") if part.strip()]
    for d in dirs:
        if not os.path.isfile(os.path.join(d, "config.json")):
            return [], f"--models: {d} is not a model directory (no config.json in it)"
    return dirs, None


# ---------------------------------------------------------------------- engine
def load_engine(model: str | None, device: str = "auto", dtype: str = "auto",
                **options: Any) -> tuple[Any, str | None]:
    """(engine, None) or (None, why): a missing model is reported, not raised.
    ``options``: EngineConfig fields (device_map, max_memory, offload_folder, quantize)."""
    try:
        engine = celeris.Engine.from_pretrained(model, device=device, dtype=dtype, **options)
    except (celeris.CelerisError, ValueError, FileNotFoundError, OSError) as exc:
        return None, str(exc)
    return engine.start(), None   # the background scheduler: UI and /v1 share its batches


def stop_engine(engine: Any) -> None:
    engine.stop()


# ---------------------------------------------------------------------- the FastAPI app
def no_model_api(error: str | None, host: str) -> FastAPI:
    """The API side when no model could be loaded: the playground still starts (its Model tab
    can load one), /health answers, and /ready and every /v1 route say why there is no model."""
    api = FastAPI(title="Celeris", docs_url=None, redoc_url=None, openapi_url=None)
    detail = error or "no model is loaded"

    @api.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/ready")
    def ready() -> JSONResponse:
        return JSONResponse({"status": "no_model", "detail": detail}, status_code=503)

    @api.api_route("/v1/{path:path}", methods=["GET", "POST"])
    def v1(path: str) -> JSONResponse:
        return JSONResponse({"error": {"message": f"no model is loaded: {detail}",
                                       "type": "model_unavailable", "code": None}},
                            status_code=503)

    if is_loopback(host):
        add_loopback_host_check(api)
    return api


def build_api(engine: Any, api_key: str | None, host: str, error: str | None) -> FastAPI:
    if engine is None:
        return no_model_api(error, host)
    return create_app(engine, api_key=api_key, host=host)


def build_app(engine: Any, api_key: str | None = None, *, host: str = "127.0.0.1",
              error: str | None = None, ar_path: str | None = None,
              canvas_path: str | None = None, concurrency: int = 4,
              frame_interval: float = 0.04, models: Sequence[str] | None = None,
              allow_model_paths: bool = False, device: str = "auto",
              dtype: str = "auto") -> FastAPI:
    """The one FastAPI app: /v1, /health and /ready routes first, then the playground at /.
    With ``api_key``, the playground and every Gradio endpoint need it too (Gradio's login:
    any user name, the key as password)."""
    api = build_api(engine, api_key, host, error)
    slot = ui.EngineSlot(engine, error, ar_path=ar_path, canvas_path=canvas_path,
                         models=offered_models(None)[0] if models is None else models,
                         allow_paths=allow_model_paths, device=device, dtype=dtype,
                         api_key_required=bool(api_key),
                         gpu=GPU_DECORATOR, concurrency=concurrency,
                         frame_interval=frame_interval)
    api.state.ui_slot = slot
    demo = ui.build_blocks(slot)
    ui.quiet_queue(demo, max_size=64, default_concurrency_limit=concurrency)   # idle: no CPU
    login = dict(auth=password_check(api_key), auth_message=LOGIN_MESSAGE) if api_key else {}
    app = gr.mount_gradio_app(api, demo, path="/", theme=ui.theme(), css=ui.css(),
                              head=ui.HEAD, ssr_mode=False, show_error=True, **login)
    gradio_app = next(r.app for r in app.routes if isinstance(r, Mount) and r.path == "")
    gradio_app.add_middleware(CallCheck, wants=GRADIO_CALL.fullmatch,
                              check=input_count_check(demo))
    quiet_input_errors(demo)
    if api_key:
        guard_playground(app, gradio_app)
    return app


def input_count_check(demo: gr.Blocks) -> Callable[[str, Any], tuple[str, str] | None]:
    """A refusal for a Gradio call whose ``data`` has not as many values as its listener
    takes (Gradio would answer 500 with its components' reprs and log the inputs)."""
    by_name = {fn.api_name: fn for fn in demo.fns.values() if fn.api_name}

    def check(path: str, body: Any) -> tuple[str, str] | None:
        data = body.get("data") if isinstance(body, dict) else None
        name = GRADIO_CALL.fullmatch(path)["name"]
        index = body.get("fn_index") if isinstance(body, dict) else None
        fn = by_name.get(name) if name else (demo.fns.get(index) if type(index) is int else None)
        if fn is None or not isinstance(data, list):
            return None   # Gradio answers those itself (404, 422)
        takes = sorted({len(fn.inputs), len([b for b in fn.inputs if not b.skip_api])})
        if len(data) in takes:
            return None
        return (fn.api_name or f"listener {index}",
                f"{len(data)} inputs given, it takes {' or '.join(map(str, takes))}")

    return check


def quiet_input_errors(demo: gr.Blocks) -> None:
    """A value an input component cannot take becomes a plain error (which input, what
    kind) and one log line without the value, instead of Gradio's traceback and reprs."""
    preprocess = demo.preprocess_data

    async def checked(block_fn: Any, inputs: list, state: Any, explicit_call: bool = False
                      ) -> Any:
        try:
            return await preprocess(block_fn, inputs, state, explicit_call)
        except gr.Error:
            raise
        except ValueError as exc:   # gradio's ComponentProcessingError, or a count mismatch
            where = re.search(r"index (\d+) \(a `(\w+)`", str(exc))
            why = (f"input {where[1]} (a {where[2]}) cannot take the value given" if where
                   else "the inputs do not fit this listener")
            name = block_fn.api_name or "a listener"
            log.warning("refused a call to %s: %s", name, why)
            raise gr.Error(f"{name}: {why}", print_exception=False) from None

    demo.preprocess_data = checked


def guard_playground(app: FastAPI, gradio_app: Any) -> None:
    """With a key: Gradio's own login protects its event endpoints, but not its heartbeat,
    route list or session routes, and its CORS allows any localhost origin with credentials.
    So every playground route but the login page's needs a logged-in session, and no other
    origin may call in."""
    def logged_in(scope: dict) -> bool:   # Gradio's session cookie, as its /login set it
        cookies, cid = HTTPConnection(scope).cookies, gradio_app.cookie_id
        token = cookies.get(f"access-token-{cid}") or cookies.get(f"access-token-unsecure-{cid}")
        return token is not None and token in gradio_app.tokens

    gradio_app.add_middleware(LoginGate, public=login_page, logged_in=logged_in)
    same_origin_only(app)


def login_page(method: str, path: str) -> bool:
    """Whether a request is one the login page makes before there is a session."""
    if path in ("/login", "/login/"):
        return method == "POST"
    return method in ("GET", "HEAD") and (path in LOGIN_PAGE or path.startswith(LOGIN_PAGE_FILES))


def password_check(api_key: str) -> Callable[[str, str], bool]:
    """The playground's login (Gradio's ``auth``): any user name, the API key as the
    password, compared in constant time (digests of equal length, like the bearer key)."""
    expected = hashlib.sha256(api_key.encode("utf-8")).digest()

    def check(username: str, password: str) -> bool:
        given = hashlib.sha256((password or "").encode("utf-8")).digest()
        return hmac.compare_digest(given, expected)

    return check


# ---------------------------------------------------------------------- serving
def port_in_use(host: str, port: int) -> bool:
    return not port_free(host, port)


def public_url(host: str, port: int) -> str:
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "::", "localhost") else host
    return f"http://{shown}:{port}"


def argument_problem(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot start a server, before anything loads. Port 0 is refused
    like any port outside [1, 65535]: the operating system would pick one that the address
    printed here and by launch.sh could not name."""
    return (port_problem(args.port) or key_refusal(args)
            or (missing_model_dir(args.model) if args.model else None))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problem = argument_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if port_in_use(args.host, args.port):
        print(f"error: port {args.port} is already in use on {args.host}; start on one "
              f"that is free now, e.g. --port {free_port(args.host, args.port)}",
              file=sys.stderr)
        return 1
    if args.share:
        print("note: --share is not available when the playground is mounted next to the API; "
              "use a Hugging Face Space or your own tunnel instead", file=sys.stderr)
    models, why = offered_models(args.models)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    engine, error = load_engine(args.model, args.device, args.dtype,
                                **{k: v for k in ("device_map", "max_memory", "offload_folder",
                                                  "quantize")
                                   if (v := getattr(args, k)) is not None})
    if engine is None and args.model is not None:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if engine is None:
        print(f"warning: {error}\n         the playground starts without a model; pick one "
              "in its Model tab", file=sys.stderr)
    app = build_app(engine, args.api_key, host=args.host, error=error, ar_path=args.ar_model,
                    canvas_path=args.canvas_model, models=models,
                    allow_model_paths=args.allow_model_paths, device=args.device,
                    dtype=args.dtype)
    url = public_url(args.host, args.port)
    print(f"Celeris playground: {url}   API: {url}/v1   (Ctrl+C to stop)", flush=True)
    server = make_server(app, args.host, args.port, args.drain_timeout)
    try:
        server.run()
    finally:
        app.state.ui_slot.close()   # the models visitors picked (never the /v1 one)
        if engine is not None:
            stop_engine(engine)
    return server.exit_code()


def make_server(app: FastAPI, host: str, port: int,
                drain_timeout: float = DRAIN_TIMEOUT_S) -> DrainingServer:
    """uvicorn; with a model, Ctrl+C first drains running requests (celeris.server)."""
    config = uvicorn_config(app, host, port, log_level="warning",
                            timeout_graceful_shutdown=5)   # open browser streams end too
    return DrainingServer(config, getattr(app.state, "celeris", None), drain_timeout)


if __name__ == "__main__":
    sys.exit(main())
