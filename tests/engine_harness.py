"""Raw token-id requests through the engine's one step, on a bare model (no tokenizer files).

The sampler tests compare Celeris with reference samplers on tiny random models; they speak
token ids, so the engine gets a stand-in tokenizer that only knows the special ids. Every
request goes through ``Engine.submit`` and ``Engine.run_step`` exactly as served ones do.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Sequence

from celeris import (CelerisConfig, CelerisForMaskedDiffusion, Engine, EngineConfig,
                     GenerationResult)


class Special(NamedTuple):
    """The special ids the engine reads (``SpecialIds`` without requiring an EOS)."""
    mask: int
    pad: int
    stop: tuple[int, ...]


class IdsTokenizer:
    def __init__(self, mask: int, pad: int, stop: Sequence[int]) -> None:
        self.special = Special(mask, pad, tuple(stop))

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(t) for t in text.split()]


class Out(NamedTuple):
    """One step of one request: the StepEvent's fields, and the finish reason on its last."""
    request_id: str
    step: int
    block: int
    canvas: tuple[int, ...]
    committed: tuple[int, ...]
    nfe: int
    finish: str | None


def bare_engine(model, mask: int, pad: int, stop: Sequence[int], **config) -> Engine:
    config.setdefault("max_running", 64)
    return Engine(model, IdsTokenizer(mask, pad, stop), Path("bare"),
                  EngineConfig(device="cpu", **config))


def submit(engine: Engine, outs: dict, rid: str, prompt: Sequence[int], params,
           seed: int) -> None:
    outs[rid] = []

    def sink(item) -> None:
        if isinstance(item, GenerationResult):
            outs[rid][-1] = outs[rid][-1]._replace(finish=str(item.finish_reason))
        elif isinstance(item, BaseException):
            raise item
        else:
            outs[rid].append(Out(item.request_id, item.step, item.block, item.canvas,
                                 item.committed, item.nfe, None))
    engine.submit(list(prompt), params.replace(seed=seed), rid, None, sink)


def finish(engine: Engine) -> None:
    while engine.scheduler.has_work:
        engine.run_step()


def run_requests(engine: Engine, requests: Sequence[tuple]) -> dict[str, list[Out]]:
    """requests: (request_id, prompt ids, params, seed); every step of each, by id."""
    outs: dict[str, list[Out]] = {}
    for rid, prompt, params, seed in requests:
        submit(engine, outs, rid, prompt, params, seed)
    finish(engine)
    return outs


EDIT_MASK, EDIT_PAD, EDIT_STOP, EDIT_BLOCK = 3, 0, 2, 8


def editing_model():
    """A tiny random block-causal model (blocks of 8) whose confidences spread widely enough
    for LLaDA2.1's token editing to edit at moderate thresholds (tests/test_token_editing.py);
    its special ids are the EDIT_* constants."""
    import torch

    torch.manual_seed(5)
    cfg = CelerisConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, attention="block_causal",
                        block_size=EDIT_BLOCK, initializer_range=0.6, mask_token_id=EDIT_MASK)
    model = CelerisForMaskedDiffusion(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[EDIT_STOP] *= 0.2       # a stop token now and then, not at once
    return model


def write_runs(writes: Sequence[tuple[int, int, int, int]]) -> list[tuple[int, ...]]:
    """(row, column, slot, position) writes, as the runs ``SlotKVCache.bind`` takes: each
    stretch of consecutive columns going to consecutive positions of one slot is one run
    (row, column, slot, position, length)."""
    runs: list[list[int]] = []
    for row, col, slot, pos in writes:
        last = runs[-1] if runs else None
        if last and last[0] == row and last[2] == slot and \
                last[1] + last[4] == col and last[3] + last[4] == pos:
            last[4] += 1
        else:
            runs.append([row, col, slot, pos, 1])
    return [tuple(r) for r in runs]
