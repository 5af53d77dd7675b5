"""Score a model on the checkable tasks (exact match on the fixed held-out sets) and, for the
diffusion model, the masked-token cross-entropy on held-out stories.

    evaluate("models/celeris-tiny")                          # Engine, chat prompts, batched
    evaluate("models/celeris-tiny-ar", kind="ar")            # transformers generate, greedy
    evaluate(overrides={"gen_length": 256, "block_length": 32, "steps": 256}, limit=20)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from celeris.synthetic import corpus as _corpus
from celeris.synthetic import tasks as _tasks
from celeris.train import objective
from celeris.train.blockdiff import block_eval_loss

DEFAULT_MODELS = {"diffusion": Path("models/celeris-tiny-bd"), "ar": Path("models/celeris-tiny-ar")}
CHUNK = 32
N_SAMPLES_PER_TASK = 2
HELDOUT_STORIES = 200
AR_DEFAULT_NEW_TOKENS = 64


def _task_sets(limit: int | None, second: bool = False) -> dict[str, list[_tasks.Example]]:
    n = _tasks.EVAL_N if limit is None else limit
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    draw = _tasks.second_examples if second else _tasks.eval_examples
    return {t: draw(t, n) for t in _tasks.TASKS}


def _report(model: str, kind: str, params: dict[str, Any], preds: dict[str, list[str]],
            sets: dict[str, list[_tasks.Example]], started: float,
            extra: dict[str, Any]) -> dict[str, Any]:
    acc: dict[str, float] = {}
    samples = []
    for task, examples in sets.items():
        ok = [_tasks.score(task, p, ex.answer) for p, ex in zip(preds[task], examples)]
        acc[task] = sum(ok) / len(ok)
        for p, ex, good in list(zip(preds[task], examples, ok))[:N_SAMPLES_PER_TASK]:
            samples.append({"task": task, "prompt": ex.prompt, "prediction": p,
                            "answer": ex.answer, "correct": good})
    report = {"model": model, "kind": kind, "params": params, "tasks": acc,
              "n": {task: len(examples) for task, examples in sets.items()},
              "mean_accuracy": sum(acc.values()) / len(acc),
              "masked_loss": None, "n_per_task": len(next(iter(sets.values()))),
              "elapsed_s": 0.0, "samples": samples}
    report.update(extra)
    report["elapsed_s"] = round(time.time() - started, 2)
    return report


def _story_ids(encode, bos: int | None, eos: int) -> list[list[int]]:
    pre = [] if bos is None else [bos]
    return [pre + encode(s) + [eos] for s in _corpus.heldout_stories(HELDOUT_STORIES)]


# ----------------------------------------------------------------------------- diffusion
def _eval_diffusion(model, overrides, sets, device, started, batch_size: int = CHUNK,
                    loss_batch_size: int = 32) -> dict[str, Any]:
    from celeris import Engine, GenerationParams

    engine = model if isinstance(model, Engine) else Engine.from_pretrained(
        str(model), device=device)
    name = str(getattr(engine, "model_dir", model))
    params = GenerationParams.from_dict(dict(overrides or {}), base=engine.default_params())
    preds: dict[str, list[str]] = {task: [] for task in sets}
    nfe, gen_tokens, finish = 0, 0, {}
    seconds = {task: 0.0 for task in sets}   # a batch's time shared equally by its rows
    t_gen = time.time()
    todo = [(task, ex) for task, examples in sets.items() for ex in examples]
    for i in range(0, len(todo), batch_size):   # rows are independent: tasks share batches
        chunk = todo[i:i + batch_size]
        t_chunk = time.time()
        results = engine.generate_batch([ex.messages() for _, ex in chunk], params)
        share = (time.time() - t_chunk) / len(chunk)
        for (task, _), r in zip(chunk, results):
            seconds[task] += share
            preds[task].append(r.text)
            nfe += r.nfe
            gen_tokens += len(r.token_ids)
            key = str(r.finish_reason)
            finish[key] = finish.get(key, 0) + 1
    gen_s = time.time() - t_gen
    n = sum(len(v) for v in sets.values())
    extra: dict[str, Any] = {"nfe_mean": nfe / n, "generated_tokens": gen_tokens,
                             "generation_s": round(gen_s, 2), "finish_reasons": finish,
                             "task_seconds": {t: round(v, 3) for t, v in seconds.items()}}
    extra.update(_story_loss(engine, loss_batch_size))
    return _report(name, "diffusion", params.to_dict(), preds, sets, started, extra)


def _story_loss(engine, batch_size: int) -> dict[str, Any]:
    """A celeris model's held-out story loss: block-causal, the block-diffusion loss of
    training; full attention, the masked loss at three ratios. {} for other models."""
    model, special, device = engine.model, engine.tokenizer.special, str(engine.device)
    if engine.family.name != "celeris":     # trained by this repo: its story grammar
        return {}
    hf = engine.tokenizer.hf
    seqs = _story_ids(lambda s: list(hf(s, add_special_tokens=False)["input_ids"]),
                      hf.bos_token_id, special.eos)
    if model.config.block_causal:
        return {"masked_loss": block_eval_loss(model, seqs, model.config.block_size, special.mask,
                                               special.pad, device=device)["masked_loss"]}
    ml = objective.masked_eval_loss(
        model, seqs, special.mask, special.pad, device=device,
        skip_first=0 if hf.bos_token_id is None else 1, batch_size=batch_size,
        autocast=(next(model.parameters()).dtype == torch.float32
                  and objective.bf16_is_fast(device)))
    return {"masked_loss": ml["masked_loss"], "masked_loss_by_ratio": ml["by_ratio"]}


# ----------------------------------------------------------------------------- AR twin
def _eval_ar(model, overrides, sets, device, started) -> dict[str, Any]:
    from celeris import ARBaseline

    max_new = int((overrides or {}).get("gen_length", AR_DEFAULT_NEW_TOKENS))
    ar = ARBaseline.from_pretrained(str(model), device=device, dtype="float32")
    preds: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    gen_tokens, t_gen = 0, time.time()
    for task, examples in sets.items():
        t_task = time.time()
        rows = [r for i in range(0, len(examples), CHUNK) for r in ar.generate_batch(
            [ex.messages() for ex in examples[i:i + CHUNK]], max_new)]
        preds[task] = [r["text"] for r in rows]
        gen_tokens += sum(r["completion_tokens"] for r in rows)
        seconds[task] = round(time.time() - t_task, 3)
    gen_s = time.time() - t_gen
    tok = ar.tokenizer
    seqs = _story_ids(lambda s: list(tok(s, add_special_tokens=False)["input_ids"]),
                      tok.bos_token_id, tok.eos_token_id)
    loss = objective.ar_eval_loss(ar.model, seqs, tok.pad_token_id, device=str(ar.device),
                                  autocast=False)
    params = {"max_new_tokens": max_new, "decoding": "greedy", "kv_cache": True}
    extra = {"ar_loss": loss["ar_loss"], "generated_tokens": gen_tokens,
             "generation_s": round(gen_s, 2), "task_seconds": seconds}
    return _report(str(model), "ar", params, preds, sets, started, extra)


def evaluate(model: Any = None, *, kind: str = "diffusion",
             overrides: dict[str, Any] | None = None, limit: int | None = None,
             device: str = "cpu", batch_size: int = CHUNK,
             loss_batch_size: int = 32, second_sample: bool = False) -> dict[str, Any]:
    """Exact-match accuracy per task on the held-out eval sets (+ held-out loss).

    model:     a model directory (default: models/celeris-tiny-bd, or models/celeris-tiny-ar for
               kind="ar"); for kind="diffusion" also an ``Engine``.
    overrides: GenerationParams fields applied over the model's defaults (AR: only gen_length,
               used as max_new_tokens; decoding is greedy with the KV cache).
    limit:     problems per task (default 100, the full fixed eval set).
    second_sample: score ``tasks.second_examples`` instead, disjoint from the fixed set.
    batch_size / loss_batch_size: rows per forward when generating (diffusion) and when
               measuring the masked loss (answers do not depend on the batch).
    """
    if kind not in DEFAULT_MODELS:
        raise ValueError(f"kind must be one of {', '.join(DEFAULT_MODELS)}; got {kind!r}")
    started = time.time()
    model = DEFAULT_MODELS[kind] if model is None else model
    if not hasattr(model, "generate_batch") and not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(f"no model at {model} (config.json missing)")
    sets = _task_sets(limit, second_sample)
    if kind == "diffusion":
        report = _eval_diffusion(model, overrides, sets, device, started, batch_size,
                                 loss_batch_size)
    else:
        report = _eval_ar(model, overrides, sets, device, started)
    report["problems"] = "second sample" if second_sample else "fixed eval set"
    return report
