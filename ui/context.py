"""What every tab shares: the engine slot, running requests per browser session, error toasts.

The slot holds the engines the UI talks to, one per model directory, and which model each
browser session chose in the Model tab (a choice never changes another session's model); it
remembers which request each session is running so that Stop can abort it, and turns the
engine's user errors into Gradio toasts. No sampling happens here: runs go
through ``engine.stream`` / ``engine.stream_infill`` only.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import gradio as gr

import celeris
from celeris import (CelerisError, EngineBusyError, EngineClosedError, GenerationResult,
                     ModelLoadError)

from .trajectory import Trajectory

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_AR_PATH = REPO_ROOT / "models" / "celeris-tiny-ar"
DEFAULT_CANVAS_PATH = REPO_ROOT / "models" / "celeris-tiny"   # the full-attention model
LAST_FRAMES = 256   # sessions whose last run's final frame is kept for their Stop to show
NO_MODEL = ("No model is loaded. Open the Model tab and pick one of the models offered "
            "(the app's --models option lists them)")


# ---------------------------------------------------------------------- errors as toasts
def user_error(message: str, title: str = "Error") -> gr.Error:
    """A toast for the user's mistake: shown in the page, no traceback in the console."""
    return gr.Error(message, title=title, print_exception=False)


def toast(exc: BaseException) -> gr.Error:
    """A user-facing error (engine busy, invalid settings, model missing) as a Gradio toast."""
    if isinstance(exc, EngineBusyError):
        return user_error(f"The engine is busy: {exc} Try again in a moment.", "Busy")
    if isinstance(exc, EngineClosedError):
        return user_error(f"The engine is shutting down: {exc}", "Unavailable")
    if isinstance(exc, ModelLoadError):
        return user_error(str(exc), "Model not loaded")
    if isinstance(exc, ValueError):
        return user_error(str(exc), "Invalid settings")
    return user_error(f"{type(exc).__name__}: {exc}")


@contextmanager
def user_errors() -> Iterator[None]:
    """Re-raise the engine's user errors as toasts; the app keeps working afterwards."""
    try:
        yield
    except gr.Error:
        raise
    except (CelerisError, ValueError, FileNotFoundError) as exc:
        raise toast(exc) from None


@dataclass(frozen=True)
class Follow:
    """What a tab updates when a browser tab picks another model: ``fn(session, *inputs)``
    returns one value per output (``session``: ``EngineSlot.session``'s view)."""

    inputs: list[Any]
    outputs: list[Any]
    fn: Callable[..., list[Any]]


# ---------------------------------------------------------------------- one model's view
class ModelView:
    """One engine as the UI sees it: its info (cached briefly for live gauges), its token
    strings (cached per id) and the limits its controls follow. Shared by every session
    that uses the same model."""

    def __init__(self, engine: Any = None, error: str | None = None) -> None:
        self.engine = engine
        self.error = error
        self._strings: dict[int, str] = {}
        self._info: tuple[float, dict[str, Any] | None] = (0.0, None)

    def require(self) -> Any:
        if self.engine is None:
            raise user_error(self.error or NO_MODEL, "Model not loaded")
        return self.engine

    def info(self, max_age: float = 0.5) -> dict[str, Any] | None:
        """engine.info(), refreshed at most every ``max_age`` seconds (for live gauges)."""
        stamp, cached = self._info
        if self.engine is None:
            return None
        if cached is None or time.monotonic() - stamp > max_age:
            cached = self.engine.info()
            self._info = (time.monotonic(), cached)
        return cached

    def token_text(self, ids: list[int]) -> list[str]:
        """Display strings for token ids, cached per id (the engine decodes the unseen ones)."""
        missing = sorted({int(t) for t in ids} - self._strings.keys())
        if missing:
            decode = getattr(self.engine, "token_strings", None)
            strings = decode(missing) if decode else [f"<{t}>" for t in missing]
            self._strings.update(zip(missing, strings))
        return [self._strings[int(t)] for t in ids]

    def context_length(self) -> int | None:
        return (self.info() or {}).get("context_length")

    def block_size(self) -> int | None:
        """The model's block size when it is block-causal (block diffusion: gen length is a
        cap and block lengths divide this); None for a full-attention model or none."""
        engine = self.engine
        if not getattr(engine, "block_causal", False):
            return None
        size = getattr(engine, "block_size", None)
        return int(size) if size else None

    def prompt_tokens(self, prompt: Any) -> int | None:
        """Tokens the engine makes of ``prompt`` (text or messages); None when unknown
        (no model, empty prompt, a model without a chat template for messages)."""
        try:      # the engine's own reading (a single-turn family keeps the last request)
            return len(self.engine.prompt_ids(prompt))
        except (AttributeError, TypeError, ValueError):
            return None

    def decode(self, ids: list[int]) -> str:
        """Several ids decoded together: a character split over byte-level tokens comes out
        whole (special tokens as nothing)."""
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is None:
            return "".join(self.token_text(ids))
        return tokenizer.decode([int(t) for t in ids])


VIEW_NAMES = ("engine", "error", "require", "info", "token_text", "context_length",
              "block_size", "prompt_tokens", "decode")


def model_label(path: Path, taken: set[str]) -> str:
    """The name a model is offered under: its folder name, with its parent's when taken."""
    label = path.name or str(path)
    if label in taken:
        label = f"{path.parent.name}/{path.name}"
    while label in taken:
        label += "'"
    return label


def engine_key(path: str | Path) -> str:
    return str(Path(path).expanduser().resolve())


# ---------------------------------------------------------------------- the engine slot
class EngineSlot:
    """The engines the UI may run and which one each browser session chose.

    ``engine`` (the one the /v1 API serves) is every session's model until the session picks
    another of the ``models`` the operator offered (or, with ``allow_paths``, any local
    directory). Engines are loaded once per model directory and shared by every session on
    that model; a session's choice never changes another's. The slot's own engine methods
    (``info``, ``block_size``, ...) describe the default model; ``session(request)`` gives
    the same interface for one session's model."""

    def __init__(self, engine: Any = None, error: str | None = None, *,
                 models: Sequence[str | Path] = (), allow_paths: bool = False,
                 device: str = "auto", dtype: str = "auto",
                 engine_factory: Callable[..., Any] | None = None,
                 ar_path: str | Path | None = None, canvas_path: str | Path | None = None,
                 api_key_required: bool = False,
                 gpu: Callable[[Callable], Callable] | None = None, concurrency: int = 4,
                 frame_interval: float = 0.04) -> None:
        self.primary = engine   # the engine the /v1 API serves: never shut down from the UI
        self.default = ModelView(engine, error)
        self.concurrency = concurrency   # engine-bound UI events that may run at once
        self.frame_interval = frame_interval   # seconds between canvas frames sent (0 = all)
        self.engine_factory = engine_factory or celeris.Engine.from_pretrained
        self.device, self.dtype = device, dtype
        self.allow_paths = allow_paths
        self.ar_path = Path(ar_path) if ar_path else DEFAULT_AR_PATH
        self.canvas_path = Path(canvas_path) if canvas_path else DEFAULT_CANVAS_PATH
        self.api_key_required = api_key_required
        self.gpu = gpu or (lambda fn: fn)
        self._active: dict[str, tuple[Any, str]] = {}
        self._last: OrderedDict[tuple[str, str], Callable[[], Any]] = OrderedDict()
        self._views: dict[str, ModelView] = {}     # engine_key(dir) -> its view
        self._choice: dict[str, str] = {}          # session -> engine_key
        self._ar: Any = None
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()          # one load at a time
        self.models = self._offer(engine, models)   # label -> model directory

    def _offer(self, engine: Any, models: Sequence[str | Path]) -> dict[str, Path]:
        offered: dict[str, Path] = {}
        own = getattr(engine, "model_dir", None)
        if own is not None:
            self._views[engine_key(own)] = self.default
        seen: set[str] = set()
        for path in ([own] if own is not None else []) + [Path(m) for m in models]:
            key = engine_key(path)
            if key not in seen:
                seen.add(key)
                offered[model_label(Path(key), set(offered))] = Path(key)
        return offered

    # -------------------------------------------------------------- the default model
    engine = property(lambda self: self.default.engine)
    error = property(lambda self: self.default.error)

    def require(self) -> Any:
        return self.default.require()

    def info(self, max_age: float = 0.5) -> dict[str, Any] | None:
        return self.default.info(max_age)

    def token_text(self, ids: list[int]) -> list[str]:
        return self.default.token_text(ids)

    def context_length(self) -> int | None:
        return self.default.context_length()

    def block_size(self) -> int | None:
        return self.default.block_size()

    def prompt_tokens(self, prompt: Any) -> int | None:
        return self.default.prompt_tokens(prompt)

    def decode(self, ids: list[int]) -> str:
        return self.default.decode(ids)

    # -------------------------------------------------------------- sessions and models
    def session(self, request: Any) -> "SessionSlot":
        """The slot as the browser session of ``request`` sees it (its chosen model)."""
        return SessionSlot(self, self.view_for(session_of(request)))

    def view_for(self, session: str) -> ModelView:
        with self._lock:
            key = self._choice.get(session)
            return self._views.get(key, self.default) if key else self.default

    def chosen(self, session: str) -> str | None:
        """The label of the model this session uses (None: none chosen and no default)."""
        with self._lock:
            key = self._choice.get(session)
        if key is None:
            own = getattr(self.engine, "model_dir", None)
            key = engine_key(own) if own is not None else None
        if key is None:
            return None
        return next((label for label, path in self.models.items() if str(path) == key), key)

    def resolve(self, choice: str) -> Path:
        """The directory behind a choice: an offered model's label, or (only with
        ``allow_paths``) a local directory. Raises ValueError for anything else."""
        choice = (choice or "").strip()
        if choice in self.models:
            return self.models[choice]
        if self.allow_paths and choice:
            return Path(choice)
        offered = ", ".join(self.models) or "none"
        raise ValueError(f"model must be one of the offered models ({offered}); got "
                         f"{choice!r}")

    def choose(self, session: str, choice: str) -> ModelView:
        """Make ``choice`` this session's model, loading it once if no session had it."""
        path = self.resolve(choice)
        view = self.model_view(path)
        with self._lock:
            self._choice[session] = engine_key(path)
        return view

    def forget(self, session: str) -> None:
        """A closed browser tab: its choice is dropped (the engine stays for the others)."""
        with self._lock:
            self._choice.pop(session, None)

    def model_view(self, path: str | Path) -> ModelView:
        """The view of the model in ``path``: loaded on first use, on the operator's device
        and dtype, with its own background scheduler, then shared."""
        key = engine_key(path)
        with self._load_lock:
            view = self._views.get(key)
            if view is None:
                view = ModelView(self.load(str(path), device=self.device, dtype=self.dtype))
                with self._lock:   # readers hold _lock only
                    self._views[key] = view
        return view

    def loaded(self, path: str | Path) -> bool:
        return engine_key(path) in self._views

    def view_of(self, engine: Any) -> ModelView:
        """The shared view of a loaded engine (a fresh one for an engine not in the slot)."""
        with self._lock:
            found = [v for v in self._views.values() if v.engine is engine]
        if engine is self.default.engine:
            return self.default
        return found[0] if found else ModelView(engine)

    def spellers(self, engine: Any) -> tuple[Callable[[list[int]], list[str]],
                                              Callable[[list[int]], str]]:
        """(token_text, decode) for a run on ``engine``, cached per engine."""
        view = self.view_of(engine)
        return view.token_text, view.decode

    def load(self, path: str, device: str = "auto", dtype: str = "auto") -> Any:
        engine = self.engine_factory(path, device=device, dtype=dtype)
        engine.start()
        return engine

    def close(self) -> None:
        """Stop every engine the UI loaded (never the /v1 one)."""
        with self._load_lock, self._lock:
            views, self._views = list(self._views.values()), {}
        for view in views:
            if view.engine is not None and view.engine is not self.primary:
                view.engine.stop()

    # -------------------------------------------------------------- running requests
    def begin(self, session: str, engine: Any) -> str:
        rid = f"ui-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._active[session] = (engine, rid)
        return rid

    def end(self, session: str, rid: str) -> None:
        with self._lock:
            if self._active.get(session, (None, None))[1] == rid:
                del self._active[session]

    def keep_last(self, session: str, tab: str, frame: Callable[[], Any]) -> None:
        """Remember how to draw the last state of this session's run in ``tab``: once the
        run's event has ended (finished, or cut short by Stop), ``last_frame`` hands it to the
        tab, which draws gauges, summary and canvas from that one record."""
        with self._lock:
            self._last[(session, tab)] = frame
            self._last.move_to_end((session, tab))
            while len(self._last) > LAST_FRAMES:
                self._last.popitem(last=False)

    def recorded(self, session: str, tab: str, draw: Callable[[], Any],
                 frames: Iterator[Any]) -> Iterator[Any]:
        """Pass a run's ``frames`` on with ``draw`` kept as its last frame (``keep_last``);
        a run that fails leaves its error frame as the last word (the record is dropped)."""
        self.keep_last(session, tab, draw)
        try:
            yield from frames
        except Exception:
            self.last_frame(session, tab)
            raise

    def last_frame(self, session: str, tab: str) -> Callable[[], Any] | None:
        """The frame ``keep_last`` kept for the session's run in ``tab`` (taken: once)."""
        with self._lock:
            return self._last.pop((session, tab), None)

    def running(self, session: str) -> bool:
        """Whether this browser session has a request in the engine right now."""
        with self._lock:
            return session in self._active

    def abort(self, session: str) -> bool:
        """Abort the request this browser session is running (the Stop button)."""
        with self._lock:
            engine, rid = self._active.pop(session, (None, None))
        if engine is None:
            return False
        engine.abort(rid)
        return True

    # -------------------------------------------------------------- the autoregressive twin
    def ar_baseline(self) -> tuple[Any, str]:
        """(ARBaseline or None, why not): loaded once, on first use."""
        if self._ar is not None:
            return self._ar, ""
        cls = getattr(celeris, "ARBaseline", None)
        if cls is None:
            return None, "celeris.ARBaseline is not available in this build."
        if not (self.ar_path / "config.json").is_file():
            return None, f"no autoregressive twin at {self.ar_path}"
        try:
            self._ar = cls.from_pretrained(str(self.ar_path))
        except Exception as exc:   # a broken twin must not take the race down
            return None, f"could not load {self.ar_path}: {exc}"
        return self._ar, ""

    # -------------------------------------------------------------- the full-canvas model
    @property
    def canvas_loaded(self) -> bool:
        return self.loaded(self.canvas_path)

    def canvas_model(self) -> tuple[Any, str]:
        """(Engine or None, why not): the full-attention model the Race tab runs next to a
        block-diffusion one and the Infill tab fills with; loaded once (shared with the
        sessions that chose it)."""
        if not (self.canvas_path / "config.json").is_file():
            return None, f"no full-canvas model at {self.canvas_path}"
        try:
            engine = self.model_view(self.canvas_path).engine
        except Exception as exc:   # a broken model must not take the race down
            return None, f"could not load {self.canvas_path}: {exc}"
        if getattr(engine, "block_causal", False):
            return None, f"{self.canvas_path} is a block-diffusion model, not a full-canvas one"
        return engine, ""


class SessionSlot:
    """The slot as one browser session sees it: the shared slot (runs, Stop, the twin, the
    full-canvas model) with that session's model in place of the default one."""

    def __init__(self, slot: EngineSlot, view: ModelView) -> None:
        self._slot, self._view = slot, view

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view if name in VIEW_NAMES else self._slot, name)


def error_message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)


def with_error_frame(run: Iterator[Any], on_error: Callable[[str], Any]) -> Iterator[Any]:
    """Pass ``run``'s updates on; if it fails with a user error, first show
    ``on_error(message)`` (the canvas cleared, status "error", the message under it), then
    raise the toast. Without that frame a refused run kept its masks and "running"."""
    try:
        yield from run
    except gr.Error as exc:
        yield on_error(error_message(exc))
        raise


def session_of(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "anonymous"


FRAME_CELLS = 256   # a canvas this long gets slot.frame_interval; longer ones proportionally more


def frame_gap(interval: float, cells: int) -> float:
    """Seconds between frames of a canvas of ``cells`` positions: ``interval`` up to
    FRAME_CELLS, then in proportion (a 1,024-token canvas at a quarter of the rate), so that
    a browser sharing its cores with the model never falls behind the frames it is sent."""
    return interval * max(1.0, cells / FRAME_CELLS)


def paced(frames: Iterator[Any], interval: float,
          final: Callable[[Any], bool] = lambda traj: traj.finished,
          cells: Callable[[Any], int] = lambda traj: 0) -> Iterator[Any]:
    """Pass a frame on only when ``frame_gap(interval, cells(frame))`` seconds passed since
    the last one (a ``final`` frame always). A fast model can take hundreds of steps a
    second; a browser redrawing a 1,000-token canvas cannot, and the skipped states are in
    the next frame anyway."""
    last = float("-inf")
    try:
        for item in frames:
            now = time.monotonic()
            if final(item) or now - last >= frame_gap(interval, cells(item)):
                last = now
                yield item
    finally:   # closing us closes the stream (and so aborts the engine request) at once
        close = getattr(frames, "close", None)
        if close is not None:
            close()


def follow(slot: EngineSlot, session: str, engine: Any,
           start: Callable[[str], Iterator[Any]], traj: Trajectory) -> Iterator[Trajectory]:
    """Run one engine stream into ``traj``, yielding it once the engine accepted the request
    (nothing committed yet), after every StepEvent and at the end, paced to
    ``slot.frame_interval``.

    ``start(request_id)`` opens the stream. If the consumer stops early (Stop button, closed
    tab), the engine request is aborted and the stream closed, so the engine is free again.
    """
    return paced(_follow(slot, session, engine, start, traj), slot.frame_interval,
                 cells=lambda t: t.gen_length)


def _follow(slot: EngineSlot, session: str, engine: Any,
            start: Callable[[str], Iterator[Any]], traj: Trajectory) -> Iterator[Trajectory]:
    rid = slot.begin(session, engine)
    token_text, decode = slot.spellers(engine)
    done = False
    try:
        with user_errors(), closing(start(rid)) as events:
            first = next(events, None)   # validation and admission errors surface here,
            yield traj                   # before the first (all masked) frame is painted
            for item in itertools.chain([first] if first is not None else [], events):
                if isinstance(item, GenerationResult):
                    traj.finish(item)
                    done = True
                else:
                    traj.add(item, token_text, decode)
                yield traj
    finally:
        if not done:
            engine.abort(rid)
        slot.end(session, rid)
