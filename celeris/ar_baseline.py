"""ARBaseline: the autoregressive twin, run by Hugging Face transformers' own ``generate()``.

Bench compares Celeris against this and the playground races the two, so it deliberately uses
nothing of ours for decoding: plain ``AutoModelForCausalLM`` + ``AutoTokenizer``, greedy, with
transformers' KV cache. Prompts are left-padded in a batch; chat message lists go through the
tokenizer's chat template with the assistant turn opened, exactly as the Engine encodes them.
Counting follows docs/DESIGN.md: completion tokens stop before the first EOS/end-of-turn.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from .config import ModelLoadError
from .model.weights import resolve_device, resolve_dtype
from .tokenizer import EOT_NAMES, encode_messages, encode_text

Prompt = str | Sequence[dict[str, Any]]


class ARBaseline:
    def __init__(self, model: Any, tokenizer: Any, path: Path) -> None:
        self.model, self.tokenizer, self.path = model, tokenizer, Path(path)
        self.device = next(model.parameters()).device
        self.stop_ids = _stop_ids(tokenizer, model.config)
        self.pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else self.stop_ids[0])

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", dtype: str = "auto"
                        ) -> "ARBaseline":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"no autoregressive model at {path} (config.json missing); "
                                 "train it with `python -m celeris train --kind ar --out "
                                 f"{path}`")
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dt).to(dev).eval()
        return cls(model, tokenizer, path)

    # ------------------------------------------------------------------ encoding
    def encode(self, prompt: Prompt) -> list[int]:
        """Text as is (with the tokenizer's BOS; special-token text in it stays text);
        messages via the chat template, as the diffusion engine encodes them."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return encode_text(self.tokenizer, prompt)
        return encode_messages(self.tokenizer, prompt)

    def _batch_inputs(self, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.encode(p) for p in prompts]
        width = max(len(r) for r in rows)
        ids = [[self.pad_id] * (width - len(r)) + r for r in rows]                 # left padding
        real = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        return (torch.tensor(ids, device=self.device),                              # (B, P)
                torch.tensor(real, device=self.device))                             # (B, P)

    def _generate_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        return dict(max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                    eos_token_id=list(self.stop_ids), pad_token_id=self.pad_id,
                    temperature=None, top_p=None, top_k=None)

    def answer(self, ids: Sequence[int]) -> tuple[list[int], str]:
        """(ids before the first stop id, finish_reason)."""
        stop = set(self.stop_ids)
        for i, t in enumerate(ids):
            if t in stop:
                return list(ids[:i]), "stop"
        return list(ids), "length"

    # ------------------------------------------------------------------ generation
    def generate_batch(self, prompts: Sequence[Prompt], max_new_tokens: int
                       ) -> list[dict[str, Any]]:
        """Greedy decoding of all prompts in one left-padded batch; results in input order.

        ``elapsed_s`` is the wall time of the whole batch (every row waits for it).
        """
        kwargs = self._generate_kwargs(max_new_tokens)
        ids, real = self._batch_inputs(prompts)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=real, **kwargs)  # (B, P+N)
        elapsed = time.perf_counter() - start
        results = []
        for row in out[:, ids.shape[1]:].tolist():
            answer, finish = self.answer(row)
            results.append({"text": self.tokenizer.decode(answer, skip_special_tokens=True),
                            "token_ids": answer, "completion_tokens": len(answer),
                            "elapsed_s": elapsed, "finish_reason": finish})
        return results

    def stream(self, prompt: Prompt, max_new_tokens: int) -> Iterator[dict[str, Any]]:
        """Yield {text, tokens, elapsed, done} as tokens arrive; the last one has done=True
        and a finish_reason. Closing the iterator early stops the generation thread."""
        kwargs = self._generate_kwargs(max_new_tokens)
        ids, real = self._batch_inputs([prompt])
        streamer, cancel = _TokenQueue(), threading.Event()
        kwargs["stopping_criteria"] = _stopping_list(cancel)
        start = time.perf_counter()
        worker = threading.Thread(target=self._generate_into, daemon=True,
                                  args=(streamer, dict(input_ids=ids, attention_mask=real,
                                                       streamer=streamer, **kwargs)))
        worker.start()
        try:
            yield from self._drain(streamer, start)
        finally:
            cancel.set()
            worker.join()

    def _generate_into(self, streamer: "_TokenQueue", kwargs: dict[str, Any]) -> None:
        try:
            with torch.inference_mode():
                self.model.generate(**kwargs)
        except BaseException as exc:  # handed to the consuming thread
            streamer.fail(exc)

    def _drain(self, streamer: "_TokenQueue", start: float) -> Iterator[dict[str, Any]]:
        generated: list[int] = []
        while True:
            item = streamer.queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                break
            generated.extend(item)
            answer, finish = self.answer(generated)
            if finish == "stop":
                break
            yield {"text": self.tokenizer.decode(answer, skip_special_tokens=True),
                   "tokens": len(answer), "elapsed": time.perf_counter() - start,
                   "done": False}
        answer, finish = self.answer(generated)
        yield {"text": self.tokenizer.decode(answer, skip_special_tokens=True),
               "tokens": len(answer), "elapsed": time.perf_counter() - start, "done": True,
               "finish_reason": finish}

    def info(self) -> dict[str, Any]:
        cfg = self.model.config
        return {"model": self.path.name, "path": str(self.path),
                "architecture": cfg.model_type,
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
                "device": str(self.device),
                "context_length": getattr(cfg, "max_position_embeddings", None)}


# ---------------------------------------------------------------------- helpers
class _TokenQueue:
    """A transformers streamer that hands new token ids (not the prompt) to another thread."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:      # generate() first pushes the prompt itself
            self._prompt_seen = True
            return
        self.queue.put([int(t) for t in value.reshape(-1).tolist()])

    def end(self) -> None:
        self.queue.put(None)

    def fail(self, exc: BaseException) -> None:
        self.queue.put(exc)


def _stopping_list(cancel: threading.Event) -> Any:
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Cancelled(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([_Cancelled()])


def _stop_ids(tokenizer: Any, config: Any) -> tuple[int, ...]:
    """EOS (tokenizer, else config) and the end-of-turn token when the vocabulary has one."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
    vocab = tokenizer.get_vocab()
    ids += [vocab[n] for n in EOT_NAMES if n in vocab]
    if not ids:
        raise ModelLoadError("the autoregressive model has no EOS token in its tokenizer or "
                             "config")
    return tuple(dict.fromkeys(int(i) for i in ids))
