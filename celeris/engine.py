"""Engine: the public face of Celeris (load, generate, stream, abort, info).

The engine turns prompts into ``SamplerRequest``s and runs them through a ``StepLoop``
(celeris/scheduler.py), which steps ``DenoiseBatch``es and turns the sampler's ``StepOutput``s
into ``StepEvent``s and finally a ``GenerationResult``. Without ``start()`` a call runs inline in
the caller's thread (CLI, tests); after ``start()`` every call goes through the shared
background ``Scheduler``, so concurrent callers share one batch. ``AsyncEngine`` is the asyncio
face of the started engine. Server, UI, bench and batch use only this surface.
"""

from __future__ import annotations

import asyncio
import json
import queue
import secrets
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Sequence

import torch

from .config import EngineBusyError, EngineClosedError, EngineConfig, ModelLoadError
from .model import load_model
from .outputs import GenerationResult, StepEvent, StepTiming
from .params import GenerationParams
from .cache import SlotKVCache
from .sampler import SamplerRequest, SpecialTokens, new_slot_cache
from .scheduler import Scheduler
from .steploop import StepLoop, cut_at_stop, is_final  # noqa: F401 (cut_at_stop: public)
from .tokenizer import Messages, Tokenizer

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "celeris-tiny-bd"   # the shipped block-diffusion model
Prompt = str | Messages | list[int]   # text, chat messages, or token ids


class ContextLengthError(ValueError):
    """The prompt (plus the answer canvas) does not fit a token limit; carries the numbers."""

    def __init__(self, prompt_tokens: int, gen_length: int, limit: int) -> None:
        self.prompt_tokens, self.gen_length, self.limit = prompt_tokens, gen_length, limit
        if gen_length:
            message = (f"prompt ({prompt_tokens} tokens) + gen_length ({gen_length}) = "
                       f"{prompt_tokens + gen_length} tokens exceeds the model's context of "
                       f"{limit} tokens")
        else:
            message = f"prompt has {prompt_tokens} tokens; the limit is {limit}"
        super().__init__(message)


class Engine:
    def __init__(self, model: Any, tokenizer: Tokenizer, model_dir: Path,
                 config: EngineConfig | None = None,
                 generation_defaults: dict[str, Any] | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_dir = Path(model_dir)
        self.config = config or EngineConfig()
        self.device = next(model.parameters()).device
        # small models on CPU pay per op, not per flop: decode with packed weights
        # (model/packed.py; the module path stays the reference and the training path)
        self.packed = bool(self.device.type == "cpu" and hasattr(model, "pack_for_inference")
                           and model.pack_for_inference())
        sp = tokenizer.special
        self.special = SpecialTokens(mask=sp.mask, pad=sp.pad, stop=sp.stop)
        self._defaults = GenerationParams.from_dict(generation_defaults or {})
        self._model_lock = threading.Lock()      # one forward at a time
        self._lock = threading.Lock()            # guards starting/stopping the scheduler
        self._scheduler: Scheduler | None = None
        self._inline: dict[str, StepLoop] = {}   # request id -> its inline loop (for abort)
        self._kv: SlotKVCache | None = None      # block-causal models: one KV cache (slots grow on demand)
        self.step_timing = StepTiming()          # every step of every loop (bench: host time)
        self.block_causal = bool(getattr(model.config, "block_causal", False))
        if self.block_causal:
            self._defaults = block_defaults(self._defaults, model.config.block_size,
                                            generation_defaults or {})

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path_or_id: str | Path | None = None, device: str = "auto",
                        dtype: str = "auto", **engine_options: Any) -> "Engine":
        """Load a local Hugging Face-format directory or a hub id (None = the shipped
        block-diffusion model, models/celeris-tiny-bd; the full-attention one, which can also
        infill, is models/celeris-tiny)."""
        config = EngineConfig(device=device, dtype=dtype, **engine_options)
        if path_or_id is None:
            if not (DEFAULT_MODEL / "config.json").is_file():
                raise ModelLoadError(
                    f"the shipped model is missing at {DEFAULT_MODEL}; train it with `python -m "
                    "celeris train --kind bd --out models/celeris-tiny-bd --init-from "
                    "models/celeris-tiny-ar` (its model card has the exact command), or give "
                    "another model directory (e.g. models/celeris-tiny)")
            path_or_id = DEFAULT_MODEL
        model, model_dir = load_model(path_or_id, device=config.device, dtype=config.dtype)
        tokenizer = Tokenizer.load(model_dir, model.config)
        return cls(model, tokenizer, model_dir, config, read_generation_defaults(model_dir))

    def default_params(self) -> GenerationParams:
        return self._defaults

    @property
    def block_size(self) -> int | None:
        """A block-causal model's block size (from its config); None for full attention."""
        return int(self.model.config.block_size) if self.block_causal else None

    # ------------------------------------------------------------------ requests
    def prepare(self, prompt: Prompt, params: GenerationParams | None = None,
                request_id: str | None = None, canvas: Sequence[int] | None = None
                ) -> SamplerRequest:
        """Validate and tokenise one request (raises ValueError with a clear message)."""
        params = params or self._defaults
        if _is_ids(prompt):
            ids = list(prompt)
            vocab = self.model.config.vocab_size
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(f"prompt token ids must be in [0, {vocab}), got {bad}")
        else:
            ids = self.tokenizer.encode_prompt(prompt)
        limit = self.model.config.max_position_embeddings
        if len(ids) + params.gen_length > limit:
            raise ContextLengthError(len(ids), params.gen_length, limit)
        if len(ids) > self.config.max_prompt_tokens:
            raise ContextLengthError(len(ids), 0, self.config.max_prompt_tokens)
        if canvas is not None and self.block_causal:
            raise ValueError(infill_refusal(self.model_dir.name))
        if canvas is not None and len(canvas) != params.canvas_length:
            raise ValueError(f"canvas has {len(canvas)} positions but gen_length "
                             f"{params.gen_length} needs {params.canvas_length}")
        if self.block_causal:
            check_block_params(params, self.model.config.block_size, canvas)
        seed = params.seed if params.seed is not None else secrets.randbits(62)
        return SamplerRequest(request_id or new_request_id(), tuple(ids), params, seed,
                              None if canvas is None else tuple(canvas))

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
        rid = new_request_id()
        (result,) = self._generate([(prompt, params, rid, canvas)], stream=False)
        return split_infill(text, marker)[0] + result.text

    def infill_request(self, text: str, params: GenerationParams | None, span: int,
                       marker: str) -> tuple[list[int], list[int], GenerationParams]:
        if self.block_causal:
            raise ValueError(infill_refusal(self.model_dir.name))
        if not isinstance(span, int) or not 1 <= span <= 64:
            raise ValueError(f"span must be an integer in [1, 64], got {span!r}")
        parts = split_infill(text, marker)
        if len(parts) < 2:
            raise ValueError(f"infill text must contain at least one {marker} span")
        mask, eos = self.special.mask, self.special.stop[0]
        ids = self.tokenizer.encode(parts[0]) if parts[0] else []
        canvas: list[int] = []
        for part in parts[1:]:
            # pinned text inside the canvas: no BOS in the middle of the sequence
            canvas += [mask] * span + (self.tokenizer.encode(part, add_special_tokens=False)
                                       if part else [])
        if not ids:   # a leading span: the first pinned token becomes the prompt
            ids = [self.special.pad]
        params = params or self._defaults
        bl = min(params.block_length, 32)
        gen = -(-len(canvas) // bl) * bl
        canvas += [eos] * (gen - len(canvas))       # pinned end of text
        params = params.replace(gen_length=gen, block_length=bl, steps=None)
        return ids, canvas, params

    def generate(self, prompt: Prompt, params: GenerationParams | None = None,
                 request_id: str | None = None) -> GenerationResult:
        return self.generate_batch([prompt], params, [request_id] if request_id else None)[0]

    def generate_batch(self, prompts: Sequence[Prompt],
                       params: GenerationParams | Sequence[GenerationParams] | None = None,
                       request_ids: Sequence[str] | None = None) -> list[GenerationResult]:
        """Denoise several prompts in one batch (left-padded); results in input order."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = [i or new_request_id() for i in (request_ids or [None] * len(prompts))]
        if len(set(ids)) != len(ids):
            raise ValueError("request_ids must be unique")
        specs = [(p, q, i, None) for p, q, i in zip(prompts, plist, ids)]
        results = {r.request_id: r for r in self._generate(specs, stream=False)}
        return [results[i] for i in ids]

    def abort(self, request_id: str) -> None:
        """Stop a request; it finishes with finish_reason "abort" within one step."""
        scheduler = self._scheduler
        if scheduler is not None and scheduler.abort(request_id):
            return
        loop = self._inline.get(request_id)
        if loop is not None:
            loop.abort(request_id)

    # ------------------------------------------------------------------ background loop
    def start(self) -> "Engine":
        """Start the background scheduler: from now on every request shares its batch."""
        with self._lock:
            old = self._scheduler
            if old is None or not old.alive or old.closed:   # none, stopped or drained
                if old is not None:
                    old.stop()
                self._scheduler = Scheduler(self._new_loop(), self.config, self._model_lock)
                self._scheduler.start()
        return self

    def drain(self, timeout: float | None = 30.0) -> bool:
        """Refuse new requests (EngineClosedError) and let running ones finish; True if
        they all did within ``timeout`` seconds (the rest are aborted)."""
        scheduler = self._scheduler
        return True if scheduler is None else scheduler.drain(timeout)

    def stop(self) -> None:
        """Stop the background scheduler (its requests are aborted); calls run inline again."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.stop()

    @property
    def started(self) -> bool:
        return self._scheduler is not None and self._scheduler.alive

    def stats(self) -> dict[str, Any]:
        """Queue depth and running batch size (zeros when no background loop runs)."""
        scheduler = self._scheduler
        if scheduler is None:
            return {"running": len(self._inline), "queued": 0,
                    "max_running": self.config.max_running,
                    "max_queue": self.config.max_queue, "draining": False}
        return scheduler.stats()

    # ------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        cfg = self.model.config
        n_params = sum(p.numel() for p in self.model.parameters())
        out = {"model": self.model_dir.name, "path": str(self.model_dir),
               "architecture": cfg.model_type, "parameters": n_params,
               "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
               "device": str(self.device), "context_length": cfg.max_position_embeddings,
               "attention": "block_causal" if self.block_causal else "bidirectional",
               "block_size": self.block_size, "defaults": self._defaults.to_dict()}
        out.update(memory_info(self.device))
        out.update({f"scheduler_{k}": v for k, v in self.stats().items()})
        return out

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id decoded on its own, special tokens as "" (for drawing a canvas per token)."""
        return [self.tokenizer.decode([int(t)]) for t in ids]

    # ------------------------------------------------------------------ the loops
    def _new_loop(self) -> StepLoop:
        shift = 1 if getattr(self.model.config, "shift_logits", False) else 0
        if self.block_causal and self._kv is None:
            self._kv = new_slot_cache(self.model, max(4, self.config.max_running))
        return StepLoop(self.model, self.tokenizer, self.special, self.device, shift, self._kv,
                        self.step_timing)

    def _generate(self, specs: list[tuple], stream: bool
                  ) -> Iterator[StepEvent | GenerationResult]:
        scheduler = self._scheduler
        if scheduler is not None and scheduler.alive:
            yield from self._run_scheduled(scheduler, specs, stream)
        else:
            yield from self._run_inline([self.prepare(*s) for s in specs], stream)

    def _run_inline(self, reqs: list[SamplerRequest], stream: bool
                    ) -> Iterator[StepEvent | GenerationResult]:
        """Denoise ``reqs`` in the caller's thread with a private StepLoop."""
        loop = self._new_loop()
        now = time.perf_counter()
        states = [loop.new_state(r, now, self.config.request_timeout_s, None, stream)
                  for r in reqs]
        for r in reqs:
            self._inline[r.request_id] = loop
        try:
            with self._model_lock, torch.inference_mode():
                items = loop.add(states)
            while True:
                for _, item in items:
                    if isinstance(item, BaseException):
                        raise item
                    if stream or isinstance(item, GenerationResult):
                        yield item
                if not len(loop):
                    return
                with self._model_lock, torch.inference_mode():
                    items = loop.step()
        finally:
            for r in reqs:
                self._inline.pop(r.request_id, None)

    def _run_scheduled(self, scheduler: Scheduler, specs: list[tuple], stream: bool
                       ) -> Iterator[StepEvent | GenerationResult]:
        """Submit ``specs`` to the shared scheduler. A batch larger than the free capacity
        waits for its own requests to finish; a caller with nothing in flight is refused
        (EngineBusyError) like any other."""
        box: queue.SimpleQueue = queue.SimpleQueue()
        todo, pending = deque(specs), set()
        try:
            while todo or pending:
                while todo:
                    try:
                        pending.add(self._submit(scheduler, todo[0], box.put, stream))
                    except EngineBusyError:
                        if not pending:
                            raise
                        break
                    todo.popleft()
                item = box.get()
                if isinstance(item, BaseException):
                    raise item
                if is_final(item):
                    pending.discard(item.request_id)
                yield item
        finally:
            for rid in pending:
                scheduler.abort(rid)

    def _submit(self, scheduler: Scheduler, spec: tuple, sink: Any, events: bool) -> str:
        """Reserve a slot (refusing at once when full), then tokenise, then queue."""
        prompt, params, request_id, canvas = spec
        request_id = request_id or new_request_id()
        slot = scheduler.reserve(request_id)
        try:
            req = self.prepare(prompt, params, request_id, canvas)
            scheduler.submit(slot, req, sink, events)
        except BaseException:
            scheduler.release(slot)
            raise
        return req.request_id


class AsyncEngine:
    """The asyncio face of an Engine whose background scheduler runs (started here).

    ``async for item in aengine.stream(prompt, params)`` yields StepEvents, then the
    GenerationResult; ``await aengine.generate(...)``. Admission errors (EngineBusyError,
    EngineClosedError) and validation errors (ValueError) are raised by the first ``__anext__``,
    before anything was generated. Leaving the loop early, or cancelling the task (a client
    that disconnected), aborts the request.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine.start()

    async def stream(self, prompt: Prompt, params: GenerationParams | None = None,
                     request_id: str | None = None, canvas: Sequence[int] | None = None, *,
                     events: bool = True) -> AsyncIterator[StepEvent | GenerationResult]:
        """events=False yields only the GenerationResult."""
        scheduler = self._scheduler()
        loop = asyncio.get_running_loop()
        box: asyncio.Queue = asyncio.Queue()

        def sink(item: Any) -> None:
            loop.call_soon_threadsafe(box.put_nowait, item)

        request_id = request_id or new_request_id()
        slot = scheduler.reserve(request_id)
        try:   # tokenising a long prompt must not block the event loop
            req = await asyncio.to_thread(self.engine.prepare, prompt, params, request_id,
                                          canvas)
            scheduler.submit(slot, req, sink, events)
        except BaseException:
            scheduler.release(slot)
            raise
        finished = False
        try:
            while not finished:
                item = await box.get()
                finished = is_final(item)
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not finished:
                scheduler.abort(request_id)

    async def generate(self, prompt: Prompt, params: GenerationParams | None = None,
                       request_id: str | None = None) -> GenerationResult:
        result = None
        async for item in self.stream(prompt, params, request_id, events=False):
            result = item
        assert isinstance(result, GenerationResult)
        return result

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def drain(self, timeout: float | None = 30.0) -> bool:
        return await asyncio.to_thread(self.engine.drain, timeout)

    @property
    def queue_depth(self) -> int:
        return self.engine.stats()["queued"]

    @property
    def running(self) -> int:
        return self.engine.stats()["running"]

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def _scheduler(self) -> Scheduler:
        scheduler = self.engine._scheduler
        if scheduler is None:
            raise EngineClosedError("the engine's background loop was stopped")
        return scheduler


def _is_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)


def split_infill(text: str, marker: str = "[MASK]") -> list[str]:
    """The pinned pieces of an infill text around its ``marker`` spans.

    A space right before a span moves into the span: byte-level BPE and SentencePiece
    vocabularies spell a word with its leading space (``" cat"``), so ``"a [MASK]"`` must
    become ``"a"`` + masked positions, not ``"a "`` + a lone space token the model never saw
    in training followed by space-less words.
    """
    parts = text.split(marker)
    return [p[:-1] if i < len(parts) - 1 and p.endswith(" ") else p
            for i, p in enumerate(parts)]


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def read_generation_defaults(model_dir: Path) -> dict[str, Any]:
    """The GenerationParams fields found in generation_config.json (others are ignored)."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    known = set(GenerationParams.field_names())
    defaults = {k: v for k, v in raw.items() if k in known}
    if "alg" in raw and "remasking" not in defaults:     # Dream's spelling
        defaults["remasking"] = raw["alg"]
    try:
        GenerationParams.from_dict(defaults)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return defaults


def block_defaults(defaults: GenerationParams, block_size: int,
                   given: dict[str, Any]) -> GenerationParams:
    """A block-causal model's defaults: sub-blocks of the model's block size unless its
    generation_config says otherwise, and the exact KV cache."""
    changes: dict[str, Any] = {}
    if "block_length" not in given:
        changes["block_length"] = block_size
    if "cache" not in given:
        changes["cache"] = "prefix"
    if "steps" not in given:
        changes["steps"] = None
    return defaults.replace(**changes) if changes else defaults


def check_block_params(params: GenerationParams, block_size: int,
                       canvas: Sequence[int] | None) -> None:
    """What a block-causal model needs of a request, beyond GenerationParams' own checks."""
    if block_size % params.block_length:
        divisors = [d for d in range(1, block_size + 1) if block_size % d == 0]
        raise ValueError(f"block_length must divide the model's block size {block_size} "
                         f"(one of {', '.join(map(str, divisors))}), got {params.block_length}")
    if canvas is not None:
        raise ValueError(infill_refusal("this model"))
    if params.cfg_scale > 0:
        raise ValueError("cfg_scale > 0 is not supported for block-causal models")


def infill_refusal(model: str) -> str:
    """Why a block-causal model does not infill, and which model does."""
    return (f"{model} is a block-diffusion (block-causal) model: it writes left to right, "
            "block after block, so it cannot fill [MASK] spans between pinned text; infill "
            "with a full-attention model such as models/celeris-tiny "
            "(Engine.from_pretrained(\"models/celeris-tiny\"), or --model models/celeris-tiny)")


def memory_info(device: torch.device) -> dict[str, Any]:
    """GPU memory via torch on CUDA, process RSS on CPU, labelled which."""
    if device.type == "cuda":
        return {"memory_kind": "gpu", "memory_bytes": torch.cuda.memory_allocated(device),
                "memory_peak_bytes": torch.cuda.max_memory_allocated(device)}
    try:
        import psutil
        rss = psutil.Process().memory_info().rss
    except ImportError:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"memory_kind": "rss", "memory_bytes": rss}
