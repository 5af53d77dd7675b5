"""Engine: the public face of Celeris (load, generate, stream, abort, info).

The engine turns prompts into ``SamplerRequest``s, runs them through ``DenoiseBatch`` steps and
turns the sampler's ``StepOutput``s into ``StepEvent``s (adding decoded text and timings) and
finally a ``GenerationResult``. Server, UI, bench and batch use only this surface.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from .config import EngineConfig, ModelLoadError
from .model import load_model
from .outputs import FinishReason, GenerationResult, StepEvent, Timings, Usage
from .params import GenerationParams
from .sampler import DenoiseBatch, SamplerRequest, SpecialTokens, StepOutput
from .tokenizer import Messages, Tokenizer

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "celeris-tiny"
Prompt = str | Messages | list[int]   # text, chat messages, or token ids


@dataclass
class _Tracker:
    """Per-request bookkeeping that turns StepOutputs into StepEvents and a result."""

    request_id: str
    prompt_len: int
    params: GenerationParams
    seed: int
    started: float
    text: str = ""
    prefix_len: int = -1
    first_block_s: float | None = None
    stopped_by_string: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    def __init__(self, model: Any, tokenizer: Tokenizer, model_dir: Path,
                 config: EngineConfig | None = None,
                 generation_defaults: dict[str, Any] | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_dir = Path(model_dir)
        self.config = config or EngineConfig()
        self.device = next(model.parameters()).device
        sp = tokenizer.special
        self.special = SpecialTokens(mask=sp.mask, pad=sp.pad, stop=sp.stop)
        self._defaults = GenerationParams.from_dict(generation_defaults or {})
        self._aborted: set[str] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path_or_id: str | Path | None = None, device: str = "auto",
                        dtype: str = "auto", **engine_options: Any) -> "Engine":
        """Load a local Hugging Face-format directory or a hub id (None = celeris-tiny)."""
        config = EngineConfig(device=device, dtype=dtype, **engine_options)
        if path_or_id is None:
            if not (DEFAULT_MODEL / "config.json").is_file():
                raise ModelLoadError(f"the shipped model is missing at {DEFAULT_MODEL}; train it "
                                     "with `python -m celeris train --out models/celeris-tiny`")
            path_or_id = DEFAULT_MODEL
        model, model_dir = load_model(path_or_id, device=config.device, dtype=config.dtype)
        tokenizer = Tokenizer.load(model_dir, model.config)
        return cls(model, tokenizer, model_dir, config, read_generation_defaults(model_dir))

    def default_params(self) -> GenerationParams:
        return self._defaults

    # ------------------------------------------------------------------ requests
    def prepare(self, prompt: Prompt, params: GenerationParams | None = None,
                request_id: str | None = None, canvas: Sequence[int] | None = None
                ) -> SamplerRequest:
        """Validate and tokenise one request (raises ValueError with a clear message)."""
        params = params or self._defaults
        ids = list(prompt) if _is_ids(prompt) else self.tokenizer.encode_prompt(prompt)
        limit = self.model.config.max_position_embeddings
        if len(ids) + params.gen_length > limit:
            raise ValueError(f"prompt ({len(ids)} tokens) + gen_length ({params.gen_length}) "
                             f"exceeds the model's context of {limit} tokens")
        if len(ids) > self.config.max_prompt_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens; the limit is "
                             f"{self.config.max_prompt_tokens}")
        seed = params.seed if params.seed is not None else secrets.randbits(62)
        return SamplerRequest(request_id or uuid.uuid4().hex[:16], tuple(ids), params, seed,
                              None if canvas is None else tuple(canvas))

    def stream(self, prompt: Prompt, params: GenerationParams | None = None,
               request_id: str | None = None, canvas: Sequence[int] | None = None
               ) -> Iterator[StepEvent | GenerationResult]:
        """Yield a StepEvent per denoising step as it happens, then the GenerationResult."""
        req = self.prepare(prompt, params, request_id, canvas)
        yield from self._run([req], stream=True)

    def stream_infill(self, text: str, params: GenerationParams | None = None,
                      span: int = 2, marker: str = "[MASK]", request_id: str | None = None
                      ) -> Iterator[StepEvent | GenerationResult]:
        """Fill the ``marker`` spans of ``text`` (each becomes ``span`` masked positions);
        every other token stays pinned. The text before the first span is the prompt."""
        prompt, canvas, params = self.infill_request(text, params, span, marker)
        req = self.prepare(prompt, params, request_id, canvas)
        yield from self._run([req], stream=True)

    def infill_request(self, text: str, params: GenerationParams | None, span: int,
                       marker: str) -> tuple[list[int], list[int], GenerationParams]:
        if not isinstance(span, int) or not 1 <= span <= 64:
            raise ValueError(f"span must be an integer in [1, 64], got {span!r}")
        parts = text.split(marker)
        if len(parts) < 2:
            raise ValueError(f"infill text must contain at least one {marker} span")
        mask, eos = self.special.mask, self.special.stop[0]
        ids = self.tokenizer.encode(parts[0]) if parts[0] else []
        canvas: list[int] = []
        for part in parts[1:]:
            canvas += [mask] * span + (self.tokenizer.encode(part) if part else [])
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
        ids = list(request_ids) if request_ids else [None] * len(prompts)
        reqs = [self.prepare(p, q, i) for p, q, i in zip(prompts, plist, ids)]
        results = {r.request_id: r for r in self._run(reqs, stream=False)}
        return [results[r.request_id] for r in reqs]

    def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    # ------------------------------------------------------------------ the loop
    def _run(self, reqs: list[SamplerRequest], stream: bool
             ) -> Iterator[StepEvent | GenerationResult]:
        groups: dict[tuple, list[SamplerRequest]] = {}
        for r in reqs:   # one batch per cache policy and block length
            groups.setdefault((r.params.cache, r.params.block_length), []).append(r)
        with self._lock, torch.inference_mode():
            for (cache, _), group in groups.items():
                yield from self._run_batch(group, cache, stream)

    def _run_batch(self, reqs: list[SamplerRequest], cache: str, stream: bool
                   ) -> Iterator[StepEvent | GenerationResult]:
        start = time.perf_counter()
        shift = 1 if getattr(self.model.config, "shift_logits", False) else 0
        batch = DenoiseBatch(self.model, self.special, self.device, cache=cache, shift=shift)
        batch.add(reqs)
        trackers = {r.request_id: _Tracker(r.request_id, len(r.prompt_ids), r.params, r.seed,
                                           start) for r in reqs}
        last: dict[str, StepOutput] = {}
        while len(batch):
            gone = [rid for rid in batch.request_ids if rid in self._aborted]
            if gone:
                batch.remove(gone)
                for rid in gone:
                    self._aborted.discard(rid)
                    yield self._result(trackers[rid], last.get(rid), FinishReason.ABORT)
            for out in batch.step():
                tr = trackers[out.request_id]
                last[out.request_id] = out
                event = self._event(tr, out)
                if stream:
                    yield event
                finish = out.finish
                if finish is None and tr.stopped_by_string:
                    batch.remove([out.request_id])
                    finish = "stop"
                if finish is not None:
                    yield self._result(tr, out, FinishReason(finish))

    def _event(self, tr: _Tracker, out: StepOutput) -> StepEvent:
        now = time.perf_counter() - tr.started
        if tr.first_block_s is None and (out.block > 0 or out.finish):
            tr.first_block_s = now
        answer = self.tokenizer.answer_ids(out.canvas)
        if len(answer) != tr.prefix_len:
            tr.prefix_len = len(answer)
            tr.text, tr.stopped_by_string = cut_at_stop(self.tokenizer.decode(answer),
                                                        tr.params.stop)
        return StepEvent(tr.request_id, out.step, out.block, out.canvas, out.committed,
                         out.confidences, out.nfe, now, tr.text, self.special.mask,
                         tr.params.block_length, out.finish is not None)

    def _result(self, tr: _Tracker, out: StepOutput | None, finish: FinishReason
                ) -> GenerationResult:
        canvas = out.canvas if out else ()
        answer = self.tokenizer.answer_ids(canvas)
        text, cut = cut_at_stop(self.tokenizer.decode(answer), tr.params.stop)
        ids = tuple(answer) if not cut else tuple(self.tokenizer.encode(text))
        if cut:
            finish = FinishReason.STOP
        total = time.perf_counter() - tr.started
        return GenerationResult(
            request_id=tr.request_id, text=text, token_ids=ids, canvas=tuple(canvas),
            finish_reason=finish, nfe=out.nfe if out else 0, steps=out.step if out else 0,
            timings=Timings(total_s=total, first_block_s=tr.first_block_s),
            usage=Usage(prompt_tokens=tr.prompt_len, completion_tokens=len(ids)),
            seed=tr.seed, params=tr.params.to_dict())

    # ------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        cfg = self.model.config
        n_params = sum(p.numel() for p in self.model.parameters())
        out = {"model": self.model_dir.name, "path": str(self.model_dir),
               "architecture": cfg.model_type, "parameters": n_params,
               "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
               "device": str(self.device), "context_length": cfg.max_position_embeddings,
               "defaults": self._defaults.to_dict()}
        out.update(memory_info(self.device))
        return out


def _is_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` at the first occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


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
