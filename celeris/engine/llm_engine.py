"""Engine: the public face of Celeris (load, generate, stream, abort, info) and its one step.

``Engine.step()`` is the whole engine: schedule a batch, run it (one forward; CFG rows ride
along as extra rows), commit, check which requests finished, free them. Requests reach it
through ``submit``; their events and results go to each request's sink. Who calls ``step``
is the only difference between the synchronous API and serving: without ``start()`` a caller
of ``generate``/``stream`` steps the engine itself until its requests are done; after
``start()`` the background loop (``async_engine.EngineLoop``) steps it and every caller,
synchronous or asyncio (``AsyncEngine``), waits on its sink.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from .. import families
from ..families.infill import infill_canvas, split_infill
from ..config import (ContextLengthError, EngineBusyError, EngineClosedError, EngineConfig,
                      EngineOutOfMemoryError, ModelLoadError)
from ..model.compiled import CompiledForward
from ..model.dispatch import main_device, memory_info
from ..model.quantize import weight_bytes
from ..outputs import GenerationResult, StepEvent, StepTiming, TokenLogprob
from ..params import GenerationParams
from ..tokenizer import Messages, Tokenizer
from .request import Request, Status
from .runner import Runner
from .scheduler import Scheduler
from .scoring import can_score, score_tokens

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "celeris-tiny-bd"   # the shipped block-diffusion model
Prompt = str | Messages | list[int]   # text, chat messages, or token ids


class Engine:
    def __init__(self, model: Any, tokenizer: Tokenizer, model_dir: Path,
                 config: EngineConfig | None = None,
                 generation_defaults: dict[str, Any] | None = None,
                 family: families.Family | None = None) -> None:
        self.model, self.tokenizer, self.model_dir = model, tokenizer, Path(model_dir)
        # the family the loader found; a model built in code: the one its config names
        self.family = family or families.family_of(model.config)
        self.config = config or EngineConfig()
        self.device = main_device(model)     # device_map: the map's main device
        # small models on CPU pay per op, not per flop: decode with packed weights
        # (model/packed.py; the module path stays the reference and the training path)
        self.packed = bool(self.device.type == "cpu" and hasattr(model, "pack_for_inference")
                           and model.pack_for_inference())
        self.special = tokenizer.special
        self.layout: families.Layout = self.family.layout(model.config, self.special.mask)
        self.block_causal = self.layout.block_causal     # the server and bench read it
        self._defaults = self.family.request_defaults(self.layout, generation_defaults or {})
        self.scheduler = Scheduler(self.config)
        self.runner = Runner(model, self.layout, self.special, self.device,
                             max(4, self.config.max_running))
        if self.config.compile:              # the forward under torch.compile (CUDA graphs)
            self.runner.model = CompiledForward(model)
        self._model_lock = threading.Lock()      # one step at a time
        self._lock = threading.Lock()            # guards starting/stopping the loop
        self._loop: Any = None                   # async_engine.EngineLoop once started
        self.step_timing = StepTiming()          # every step (bench: host time per step)
        self.step_failures = self.step_failures_total = 0
        self._grammars: Any = None               # structured output's compiler, when asked

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path_or_id: str | Path | None = None, device: str = "auto",
                        dtype: str = "auto", **engine_options: Any) -> "Engine":
        """Load a local Hugging Face-format directory or a hub id (None = the shipped
        block-diffusion model, models/celeris-tiny-bd; the full-attention one, which can also
        infill, is models/celeris-tiny). ``engine_options`` are EngineConfig's fields, e.g.
        ``device_map="auto", max_memory={0: "20GiB", "cpu": "60GiB"}, offload_folder=DIR``
        for a model that does not fit one device (layers over GPUs, CPU memory and disk);
        ``quantize="int8"`` (int4, fp8) quantizes the layers' weights after loading
        (``model/quantize.py``: what runs on which device, what is refused)."""
        config = EngineConfig(device=device, dtype=dtype, **engine_options)
        family, model, model_dir = families.load(
            path_or_id or _shipped_model(), device=config.device, dtype=config.dtype,
            device_map=config.device_map, max_memory=config.max_memory,
            offload_folder=config.offload_folder, quantize=config.quantize)
        tokenizer = Tokenizer.load(model_dir, model.config, family.special_ids)
        return cls(model, tokenizer, model_dir, config, family.generation_defaults(model_dir),
                   family)

    def default_params(self) -> GenerationParams:
        return self._defaults

    @property
    def block_size(self) -> int | None:
        """A block-causal model's block size (from its config); None for full attention."""
        return self.layout.block_size

    @property
    def _kv(self) -> Any:
        return self.runner.kv

    # ------------------------------------------------------------------ the step
    def step(self) -> list[Request]:
        """schedule -> run -> commit -> finish -> free; returns the requests touched."""
        start = time.perf_counter()
        batch, joined, ended = self.scheduler.schedule(start, self.layout.stops_at_eos)
        for req in joined:
            self.runner.admit(req)
        if batch:
            self._run(batch)                 # one forward, choose, one host sync, commit
            for req in batch:
                self._settle(req)
            self.step_timing.add(time.perf_counter() - start, self.runner.forward_s)
        done = [r for r in (*batch, *ended) if r.finished]
        for req in done:
            self.runner.release(req)
        self.scheduler.retire(done)
        return [*batch, *ended]

    def _settle(self, req: Request) -> None:
        """After a request's commit: has it finished, its event, its next unit."""
        req.check_finish(time.perf_counter(), self.layout.stops_at_eos(req))
        if (req.events or req.finished) and req.failure is None:   # a failure: no event
            req.pending = req.event(self.special.mask, req.params.block_length)
        if not req.finished:
            self.layout.advance(req)
            req.note_progress()

    def _run(self, batch: list[Request]) -> None:
        """The forward of a step; a failure ends requests, not the engine."""
        self._forward(batch)
        failed = any(r.failure is not None for r in batch)
        self.step_failures = self.step_failures + 1 if failed else 0
        self.step_failures_total += int(failed)

    def _forward(self, batch: list[Request]) -> None:
        """Out of memory fails the batch (a capacity problem); any other error is a
        request's own: each row is then run alone, and only the rows that fail alone fail
        (a step that raised committed nothing, so the others take their step as if alone)."""
        try:
            self.runner.run(batch)
        except Exception as exc:
            failure = capacity_error(exc, self.scheduler.retry_after())
            if failure is exc and len(batch) > 1:
                log.warning("a batched step failed (%s); running its rows alone",
                            type(exc).__name__)
                for req in batch:
                    self._forward([req])
                return
            log.exception("denoising step failed")
            for req in batch:
                req.failure = failure

    def run_step(self) -> None:
        """Step under the model lock and deliver what the step produced."""
        with self._model_lock, torch.inference_mode():
            touched = self.step()
        self.deliver(touched)

    def deliver(self, reqs: Sequence[Request]) -> None:
        for req in reqs:
            event, req.pending = req.pending, None
            if event is not None and req.events:
                _send(req, event)
            if req.finished:
                _send(req, req.outcome(self._encode_plain))

    def _encode_plain(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ------------------------------------------------------------------ requests
    def prepare(self, prompt: Prompt, params: GenerationParams | None = None,
                request_id: str | None = None, canvas: Sequence[int] | None = None
                ) -> Request:
        """Validate and tokenise one request (raises ValueError with a clear message)."""
        params = params or self._defaults
        ids = self.prompt_ids(prompt)
        limit = self.model.config.max_position_embeddings
        if len(ids) + params.gen_length > limit:
            raise ContextLengthError(len(ids), params.gen_length, limit)
        if len(ids) > self.config.max_prompt_tokens:
            raise ContextLengthError(len(ids), 0, self.config.max_prompt_tokens)
        self.layout.check(params, canvas, self.model_dir.name)   # what the family refuses
        top = params.logit_bias[-1][0] if params.logit_bias else -1      # sorted by id
        if top >= self.model.config.vocab_size:
            raise ValueError(f"logit_bias token ids must be in [0, "
                             f"{self.model.config.vocab_size}) (this model's vocabulary), "
                             f"got {top}")
        grammar = None
        if params.structured is not None:
            grammar = self._grammar_row(params.structured, canvas)
            params = params if params.early_stop else params.replace(early_stop=True)
        seed = params.seed if params.seed is not None else secrets.randbits(62)
        return Request(request_id or new_request_id(), tuple(ids), params, seed,
                       None if canvas is None else tuple(canvas), decode=self.tokenizer.decode,
                       grammar=grammar)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The token ids a prompt is denoised after (validated as ``prepare`` does)."""
        if _is_ids(prompt):
            ids = list(prompt)
            vocab = self.model.config.vocab_size
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(f"prompt token ids must be in [0, {vocab}), got {bad}")
        else:     # the turns its family's model can use (celeris: the last request)
            ids = self.tokenizer.encode_prompt(self.family.chat_messages(prompt))
        Tokenizer.check_prompt_ids(ids, self.tokenizer.special)
        return ids

    def score(self, prompt: Prompt, top: int = 0) -> list[TokenLogprob | None]:
        """Each prompt token's log p(x_i | x_<i) with i and what follows masked (the first
        None), with its ``top`` alternatives (``scoring.py``); between denoising steps."""
        why = can_score(self.model)
        if why is not None:
            raise ValueError(f"{self.family.display}: {why}")
        ids = self.prompt_ids(prompt)
        limit = self.model.config.max_position_embeddings
        if len(ids) > limit:
            raise ContextLengthError(len(ids), 0, limit)
        return score_tokens(self.model, ids, self.special.mask, top, self.device,
                            lock=lambda: self._model_lock)

    def suffix_request(self, prompt: str, suffix: str, params: GenerationParams | None
                       ) -> tuple[list[int], list[int], GenerationParams]:
        """(prompt ids, canvas, params) to fill the gap between ``prompt`` and ``suffix``
        (at most gen_length tokens, ending early at a stop token): the Infill path."""
        params = params or self._defaults
        marker = "\x00gap\x00"
        return self.infill_request(prompt + marker + suffix, params, params.gen_length,
                                   marker, max_span=params.gen_length)

    def _grammar_row(self, structured: tuple[str, str], canvas: Any) -> Any:
        """A request's grammar state (the compiler is built at the first such request)."""
        if canvas is not None:
            raise ValueError("structured output cannot be combined with infill (the grammar "
                             "reads the answer left to right from its start)")
        hf = getattr(self.tokenizer, "hf", None)
        if hf is None:
            raise ValueError("structured output needs the model's own tokenizer")
        if self._grammars is None:
            from ..sampler.grammar import Grammars
            self._grammars = Grammars(hf, self.model.config.vocab_size, self.special.stop)
        return self._grammars.row(*structured)

    def submit(self, prompt: Prompt, params: GenerationParams | None, request_id: str | None,
               canvas: Sequence[int] | None, sink: Any, events: bool = True) -> str:
        """Reserve capacity (refusing at once when full), then tokenise, then queue."""
        request_id = request_id or new_request_id()
        self.scheduler.reserve(request_id)
        try:
            req = self.prepare(prompt, params, request_id, canvas)
        except BaseException:
            self.scheduler.release(request_id)
            raise
        req.sink, req.events = sink, events
        req.deadline = req.arrival + self.config.request_timeout_s
        self.scheduler.submit(req)
        return request_id

    def stream(self, prompt: Prompt, params: GenerationParams | None = None,
               request_id: str | None = None, canvas: Sequence[int] | None = None
               ) -> Iterator[StepEvent | GenerationResult]:
        """Yield a StepEvent per denoising step as it happens, then the GenerationResult."""
        yield from self._generate([(prompt, params, request_id, canvas)], stream=True)

    def stream_infill(self, text: str, params: GenerationParams | None = None,
                      span: int = 2, marker: str = "[MASK]", request_id: str | None = None
                      ) -> Iterator[StepEvent | GenerationResult]:
        """Fill the ``marker`` spans of ``text`` (each becomes ``span`` masked positions);
        every other token stays pinned. The text before the first span is the prompt."""
        prompt, canvas, params = self.infill_request(text, params, span, marker)
        yield from self._generate([(prompt, params, request_id, canvas)], stream=True)

    def infill_text(self, text: str, params: GenerationParams | None = None, span: int = 2,
                    marker: str = "[MASK]") -> str:
        """``text`` with its ``marker`` spans filled: stream_infill run to the end, the pinned
        text before the first span glued back in front."""
        prompt, canvas, params = self.infill_request(text, params, span, marker)
        (result,) = self._generate([(prompt, params, None, canvas)], stream=False)
        return split_infill(text, marker)[0] + result.text

    def infill_request(self, text: str, params: GenerationParams | None, span: int,
                       marker: str, max_span: int = 64
                       ) -> tuple[list[int], list[int], GenerationParams]:
        """(prompt ids, pinned canvas, params) for an infill text (``infill.py``); the
        layout refuses it where its family writes left to right."""
        prompt, canvas, params = infill_canvas(self.tokenizer, text, params or self._defaults,
                                               span, marker, max_span)
        self.layout.check(params, canvas, self.model_dir.name)
        return prompt, canvas, params

    def generate(self, prompt: Prompt, params: GenerationParams | None = None,
                 request_id: str | None = None) -> GenerationResult:
        return self.generate_batch([prompt], params, [request_id] if request_id else None)[0]

    def generate_batch(self, prompts: Sequence[Prompt],
                       params: GenerationParams | Sequence[GenerationParams] | None = None,
                       request_ids: Sequence[str] | None = None) -> list[GenerationResult]:
        """Denoise several prompts in one batch; results in input order."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = [i or new_request_id() for i in (request_ids or [None] * len(prompts))]
        if len(set(ids)) != len(ids):
            raise ValueError("request_ids must be unique")
        specs = [(p, q, i, None) for p, q, i in zip(prompts, plist, ids)]
        results = {r.request_id: r for r in self._generate(specs, stream=False)}
        return [results[i] for i in ids]

    def _generate(self, specs: list[tuple], stream: bool
                  ) -> Iterator[StepEvent | GenerationResult]:
        """Submit ``specs`` and yield their items. A batch larger than the free capacity
        waits for its own requests to finish; one with nothing in flight is refused
        (EngineBusyError) like any other caller."""
        box: queue.SimpleQueue = queue.SimpleQueue()
        todo, pending = deque(specs), set()
        try:
            while todo or pending:
                while todo:
                    prompt, params, rid, canvas = todo[0]
                    rid = rid or new_request_id()
                    try:
                        self.submit(prompt, params, rid, canvas,
                                    lambda item, rid=rid: box.put((rid, item)), stream)
                    except EngineBusyError:
                        if not pending:
                            raise
                        break
                    pending.add(rid)
                    todo.popleft()
                rid, item = self._next_item(box)
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, GenerationResult):
                    pending.discard(rid)
                yield item
        finally:
            for rid in pending:
                self.abort(rid)
            while pending and not self.started and self.scheduler.busy:
                self.run_step()          # inline: nobody else would reap them
                pending = {r for r in pending if r in self.scheduler.reserved}

    def _next_item(self, box: queue.SimpleQueue) -> tuple[str, Any]:
        while True:
            try:
                return box.get(block=self.started, timeout=1.0 if self.started else None)
            except queue.Empty:
                if not self.started:
                    self.run_step()      # no background loop: the caller steps the engine

    def abort(self, request_id: str) -> None:
        """Stop a request; it finishes with finish_reason "abort" at the next step."""
        self.scheduler.abort(request_id)

    # ------------------------------------------------------------------ background loop
    def start(self) -> "Engine":
        """Start the background loop: from now on a thread steps the engine."""
        from .async_engine import EngineLoop
        with self._lock:
            self.scheduler.closed = False            # a drained engine takes requests again
            if self._loop is None or not self._loop.alive:
                self._loop = EngineLoop(self)
                self._loop.start()
        return self

    def drain(self, timeout: float | None = 30.0) -> bool:
        """Refuse new requests (EngineClosedError) and let running ones finish; True if
        they all did within ``timeout`` seconds (the rest are aborted)."""
        if self._loop is None:
            return True
        drained = self.scheduler.wait_idle(timeout)
        if not drained:
            for rid in list(self.scheduler.reserved):
                self.scheduler.abort(rid)
        return drained

    def stop(self) -> None:
        """Stop the background loop (its requests are aborted); calls run inline again."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.stop()
        now = time.perf_counter()
        reqs = self.scheduler.take_all()
        for req in reqs:
            req.abort_requested = True
            req.check_finish(now, True)
            if req.status is not Status.WAITING:
                self.runner.release(req)
        self.deliver(reqs)
        self.scheduler.closed = False

    @property
    def started(self) -> bool:
        return self._loop is not None and self._loop.alive

    def stats(self) -> dict[str, Any]:
        """Queue depth and running batch size, and the failed-step counters."""
        return {**self.scheduler.stats(), "step_failures": self.step_failures,
                "step_failures_total": self.step_failures_total}

    # ------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        cfg = self.model.config
        n_params = sum(p.numel() for p in self.model.parameters())
        out = {"model": self.model_dir.name, "path": str(self.model_dir),
               "architecture": cfg.model_type, "family": self.family.display,
               "parameters": n_params,
               "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
               "device": str(self.device), "context_length": cfg.max_position_embeddings,
               "attention": "block_causal" if self.block_causal else "bidirectional",
               "block_size": self.block_size, "defaults": self._defaults.to_dict()}
        out.update(self.weights_info())
        out.update(memory_info(self.device))
        out.update({f"scheduler_{k}": v for k, v in self.stats().items()})
        return out

    def weights_info(self) -> dict[str, Any]:
        """``weight_bytes`` (the parameters' real storage: a quantized tensor's int data,
        scales and zero points; tied weights once), ``quantize`` (the mode, None at full
        width) and ``quantization`` (what was quantized, what stayed full width, the layout;
        a pre-quantized checkpoint's format), and whether the CPU decode path is packed."""
        report = getattr(self.model, "celeris_quantization", None)
        return {"weight_bytes": weight_bytes(self.model)["total"],
                "quantize": (report or {}).get("mode"), "quantization": report,
                "packed": self.packed}

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id decoded on its own, special tokens as "" (for drawing a canvas per token)."""
        return [self.tokenizer.decode([int(t)]) for t in ids]


def capacity_error(exc: BaseException, retry_after: float) -> BaseException:
    """Out of memory is a capacity problem, not a bug: EngineOutOfMemoryError (the server
    answers 503 with Retry-After); any other exception is returned as it is."""
    if not isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return exc
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    error = EngineOutOfMemoryError("the engine ran out of memory for the running batch; "
                                   "retry later or with a shorter request",
                                   retry_after=retry_after)
    error.__cause__ = exc
    return error


def _send(req: Request, item: Any) -> None:
    if req.sink is None:
        return
    try:
        req.sink(item)
    except Exception:   # a consumer that went away must not stop the engine
        log.debug("dropping an item for request %s", req.request_id, exc_info=True)


def _shipped_model() -> Path:
    if not (DEFAULT_MODEL / "config.json").is_file():
        raise ModelLoadError(
            f"the shipped model is missing at {DEFAULT_MODEL}; give another model directory "
            "(e.g. models/celeris-tiny) or rebuild it from its recipe "
            "(models/celeris-tiny-bd/recipe.toml)")
    return DEFAULT_MODEL


def _is_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


__all__ = ["DEFAULT_MODEL", "Engine", "EngineClosedError", "capacity_error", "new_request_id"]
