"""Train the shipped tiny models on CPU: the masked-diffusion ``celeris-tiny`` and its
autoregressive twin ``celeris-tiny-ar`` (same size, same data stream, same tokenizer).

    train("models/celeris-tiny", steps=N, seed=0)                  # masked diffusion (LLaDA)
    train("models/celeris-tiny-ar", steps=N, seed=0, kind="ar")    # LlamaForCausalLM twin

The shipped recipe trains the twin first (12000 steps, ~33 min on 2 threads), adapts its
weights to masked diffusion (``init_from="models/celeris-tiny-ar"``, 8000 steps, lr 1e-3,
~64 min), as Dream-7B was adapted from Qwen2.5, and then continues 1000 steps (lr 3e-4, ~6 min)
with a story-heavier mix and semi-autoregressive story rows (``mix``, ``semi_ar_prob``), which
made left-to-right stories grammatical; the model cards record every command. (Trained from
scratch on the current tasks, with an earlier task weighting, the diffusion model had learned
none of copy/reverse/sort after 4200 steps; the twin on that data was near 50% at 4600. Semi-
autoregressive rows from the start of the adaptation instead, 8000 steps, left the model worse
at everything but block-1 stories: 86.7% on tasks, 23% grammatical stories at block 32. Going
on from the shipped model with infill-shaped story rows, or with 2000 more steps of its own
recipe, did not improve infilling or wide-block stories; docs/BENCHMARKS.md has the numbers.)

A run is deterministic for a seed on one machine and thread count (``CELERIS_THREADS``):
model init from ``torch.manual_seed``, data from a seeded ``random.Random``, masking from a
seeded ``torch.Generator``. Checkpoints under ``out/checkpoints/`` carry all of that state, so
``resume=True`` continues the loss curve exactly.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from celeris.train import corpus as _corpus
from celeris.train import blockdiff, objective, tokenizer_train as tt
from celeris.train.data import IGNORE, Batcher, positions

KINDS = ("diffusion", "ar", "bd")     # bd: block diffusion (block-causal, celeris-tiny-bd)

# CelerisConfig kwargs (the AR twin reuses the size fields). shift_logits=True is Dream's
# shifted prediction: a masked position reads its left neighbour's state, which gets a tiny
# model off the unigram plateau (NOTES-MACHINE.md); conv_kernel_size stays 0 (off).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                 rope_theta=10000.0, rms_norm_eps=1e-5, shift_logits=True, qkv_bias=False,
                 tie_word_embeddings=False),
    "micro": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                  rope_theta=10000.0, rms_norm_eps=1e-5, shift_logits=True, qkv_bias=False,
                  tie_word_embeddings=False),
}

# Optimisation and data settings per preset.
TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(lr=2e-3, min_lr_ratio=0.1, warmup_steps=100, weight_decay=0.1,
                 betas=(0.9, 0.95), grad_clip=1.0, tokens_per_batch=2048, prefix_prob=0.25,
                 semi_ar_prob=0.0, mix=None, tokenizer_texts=20000, vocab_size=tt.VOCAB_SIZE,
                 eval_stories=128, block_size=8, certainty=0.0, selfgen=None, selfgen_prob=0.0,
                 log_every=10, ckpt_every=200, eval_every=500, keep_checkpoints=2),
    "micro": dict(lr=3e-3, min_lr_ratio=0.1, warmup_steps=4, weight_decay=0.1,
                  betas=(0.9, 0.95), grad_clip=1.0, tokens_per_batch=512, prefix_prob=0.25,
                  semi_ar_prob=0.0, mix=None, tokenizer_texts=600, vocab_size=512, eval_stories=8,
                  block_size=4, certainty=0.0, selfgen=None, selfgen_prob=0.0,
                  log_every=1, ckpt_every=10, eval_every=0, keep_checkpoints=2),
}

DIFFUSION_DEFAULTS = {"gen_length": 64, "block_length": 32, "steps": 64, "temperature": 0.0,
                      "remasking": "low_confidence", "decoding": "fixed"}
# Block diffusion: a cap rather than a canvas, sub-blocks = the model's blocks, the exact cache
# and threshold (parallel) decoding.
BLOCK_DEFAULTS = {"gen_length": 256, "temperature": 0.0, "remasking": "low_confidence",
                  "decoding": "threshold", "threshold": 0.9, "cache": "prefix"}


# ----------------------------------------------------------------------------- helpers
def set_threads() -> int:
    n = int(os.environ.get("CELERIS_THREADS", "2"))
    torch.set_num_threads(n)
    return n


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def round_vocab(n: int, multiple: int = 64) -> int:
    return int(math.ceil(n / multiple) * multiple)


def build_model(kind: str, preset: str, vocab_size: int, block_size: int = 8):
    """A freshly initialised model (call after ``torch.manual_seed``)."""
    cfg = dict(PRESETS[preset])
    ids = dict(bos_token_id=tt.SPECIAL_IDS["bos"], eos_token_id=tt.SPECIAL_IDS["eos"],
               pad_token_id=tt.SPECIAL_IDS["pad"])
    if kind == "bd":
        cfg.update(attention="block_causal", block_size=block_size)
    if kind in ("diffusion", "bd"):
        from celeris import CelerisConfig, CelerisForMaskedDiffusion
        config = CelerisConfig(vocab_size=vocab_size, mask_token_id=tt.SPECIAL_IDS["mask"],
                               eot_token_id=tt.SPECIAL_IDS["eot"], **ids, **cfg)
        return CelerisForMaskedDiffusion(config)
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        max_position_embeddings=cfg["max_position_embeddings"], rope_theta=cfg["rope_theta"],
        rms_norm_eps=cfg["rms_norm_eps"], tie_word_embeddings=cfg["tie_word_embeddings"],
        attention_bias=False, mlp_bias=False, **ids)
    return LlamaForCausalLM(config)


def make_schedule(opt: torch.optim.Optimizer, warmup: int, total: int, min_ratio: float,
                  last_step: int = -1) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the peak learning rate, then a half cosine down to ``min_ratio`` x the
    peak at ``total`` steps (transformers' schedule). ``last_step`` continues a run whose
    length became known later (a time budget)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    return get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, total,
                                                       min_lr_rate=min_ratio,
                                                       last_epoch=last_step)


def make_optimizer(model, tp: dict[str, Any]) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tp["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tp["lr"], betas=tuple(tp["betas"]), eps=1e-8)


def autocast_ctx(device: str):
    dev = device.split(":")[0]
    return torch.autocast(device_type=dev, dtype=torch.bfloat16,
                          enabled=objective.bf16_is_fast(device))


# ----------------------------------------------------------------------------- losses
def diffusion_step_loss(model, batch, gen: torch.Generator, device: str) -> torch.Tensor:
    noisy, masked, t = objective.mask_batch(batch.input_ids, batch.maskable,
                                            tt.SPECIAL_IDS["mask"], gen, forced=batch.forced)
    attn = None if batch.attention_mask is None else batch.attention_mask.to(device)
    with autocast_ctx(device):
        logits = model(noisy.to(device), attention_mask=attn,
                       logits_mask=masked.to(device)).logits
    row_mean = None if batch.forced is None else batch.forced.any(dim=1).to(device)
    return objective.diffusion_loss(logits, batch.input_ids.to(device), masked.to(device),
                                    batch.maskable.to(device), t.to(device), row_mean)


def bd_step_loss(model, batch, gen: torch.Generator, device: str, block_size: int,
                 certainty: float = 0.0) -> torch.Tensor:
    inputs = blockdiff.block_inputs(batch, block_size, tt.SPECIAL_IDS["mask"], gen)
    with autocast_ctx(device):
        return blockdiff.block_loss(model, inputs, device, certainty)


def ar_step_loss(model, batch, device: str) -> torch.Tensor:
    """Next-token loss on the labelled tokens; the vocab head runs only where it is scored."""
    labels = batch.labels
    cols = (labels != IGNORE).any(dim=0).nonzero()
    end = int(cols.max()) + 1 if len(cols) else labels.shape[1]   # drop trailing EOS padding
    ids = batch.input_ids[:, :end].to(device)
    labels = labels[:, :end].to(device)
    attn = None if batch.attention_mask is None else batch.attention_mask[:, :end].to(device)
    pos = positions(attn, ids).to(device)
    with autocast_ctx(device):
        hidden = model.model(input_ids=ids, attention_mask=attn,
                             position_ids=pos).last_hidden_state
        target = labels[:, 1:]
        keep = target != IGNORE
        logits = model.lm_head(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), target[keep])


# ----------------------------------------------------------------------------- checkpoints
def _ckpt_dir(out: Path) -> Path:
    return out / "checkpoints"


def latest_checkpoint(out: str | Path) -> Path | None:
    files = sorted(_ckpt_dir(Path(out)).glob("step_*.pt"))
    return files[-1] if files else None


def _save_checkpoint(out: Path, state: dict[str, Any], keep: int) -> Path:
    d = _ckpt_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{state['step']:07d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in sorted(d.glob("step_*.pt"))[:-keep]:
        old.unlink()
    return path


# ----------------------------------------------------------------------------- eval data
def eval_sequences(tok, n: int) -> list[list[int]]:
    """BOS + held-out story + EOS, token ids."""
    bos, eos = tt.SPECIAL_IDS["bos"], tt.SPECIAL_IDS["eos"]
    return [[bos] + tok.encode(s, add_special_tokens=False).ids + [eos]
            for s in _corpus.heldout_stories(n)]


def eval_loss(model, kind: str, seqs: list[list[int]], device: str,
              block_size: int = 8) -> dict[str, Any]:
    if kind == "bd":
        return blockdiff.block_eval_loss(model, seqs, block_size, tt.SPECIAL_IDS["mask"],
                                         tt.SPECIAL_IDS["pad"], device=device)
    if kind == "diffusion":
        return objective.masked_eval_loss(model, seqs, tt.SPECIAL_IDS["mask"],
                                          tt.SPECIAL_IDS["pad"], device=device, skip_first=1,
                                          autocast=objective.bf16_is_fast(device))
    return objective.ar_eval_loss(model, seqs, tt.SPECIAL_IDS["pad"], device=device,
                                  autocast=objective.bf16_is_fast(device))


# ----------------------------------------------------------------------------- saving
def write_generation_config(out: Path, kind: str) -> None:
    if kind in ("diffusion", "bd"):
        cfg = dict(DIFFUSION_DEFAULTS if kind == "diffusion" else BLOCK_DEFAULTS)
        cfg.update(eos_token_id=tt.SPECIAL_IDS["eos"], pad_token_id=tt.SPECIAL_IDS["pad"],
                   mask_token_id=tt.SPECIAL_IDS["mask"])
        (out / "generation_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    else:
        from transformers import GenerationConfig
        GenerationConfig(bos_token_id=tt.SPECIAL_IDS["bos"],
                         eos_token_id=[tt.SPECIAL_IDS["eos"], tt.SPECIAL_IDS["eot"]],
                         pad_token_id=tt.SPECIAL_IDS["pad"], do_sample=False,
                         max_new_tokens=64).save_pretrained(str(out))


def save_final(model, out: Path, kind: str) -> None:
    model = model.float()
    model.save_pretrained(str(out))
    write_generation_config(out, kind)


def load_init_weights(model, src: Path) -> dict[str, Any]:
    """Copy a trained model's weights (same parameter names and shapes: our AR twin is a Llama
    with the diffusion model's layout) into ``model``. Returns what the source's own training
    log says about it (steps, tokens), for the model card."""
    from safetensors.torch import load_file

    state = load_file(str(src / "model.safetensors"))
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(f"init_from: {src} lacks {len(missing)} weight(s) the model needs, "
                         f"e.g. {missing[0]!r}; it must be a model of the same preset")
    for name, t in own.items():
        if tuple(state[name].shape) != tuple(t.shape):
            raise ValueError(f"init_from: {name} has shape {tuple(state[name].shape)} in {src}, "
                             f"the model needs {tuple(t.shape)}; use a model of the same preset")
    model.load_state_dict({k: state[k] for k in own}, strict=True)
    return describe_init(src)


# What a model's card needs to know about the model it started from: enough to name its own
# training command, and (nested) where *it* started from, so a chain of runs is on record.
INIT_KEYS = ("kind", "steps", "tokens_seen", "wall_time_s", "seed", "threads", "out", "preset",
             "init_from", "train_config", "init_info")


def describe_init(src: Path) -> dict[str, Any]:
    info: dict[str, Any] = {"path": str(src)}
    log_path = src / "train_log.json"
    if log_path.is_file():
        log = json.loads(log_path.read_text())
        info.update({k: log.get(k) for k in INIT_KEYS})
    return info


# ----------------------------------------------------------------------------- train
def train(out: str | Path, *, minutes: float | None = None, steps: int | None = None,
          device: str = "cpu", resume: bool = False, seed: int = 0, kind: str = "diffusion",
          preset: str | None = "tiny", progress: bool = True, stop_at: int | None = None,
          init_from: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Train a model into ``out``; returns a summary dict (also in ``out/train_log.json``).

    steps:   optimizer steps (deterministic budget; the cosine schedule spans them).
    minutes: wall-clock cap for this call; alone, the schedule length is estimated from the
             speed of the first steps.
    resume:  continue from the latest checkpoint in ``out/checkpoints`` (same settings).
    stop_at: stop (with a checkpoint) after this step, as an interruption would; the run can
             then be resumed (tests).
    init_from: (diffusion only) start from the weights and tokenizer of a trained model of the
             same preset, e.g. the AR twin: AR-to-diffusion adaptation as Dream-7B does from
             Qwen2.5 (shifted logits keep each position's prediction where the AR model put it).
    overrides: settings of ``TRAIN_PRESETS`` to change (e.g. tokens_per_batch=2048, lr=1e-3).
    """
    preset = preset or "tiny"
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    if steps is None and minutes is None:
        raise ValueError("give a budget: steps (deterministic) and/or minutes (wall clock)")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if minutes is not None and not minutes > 0:
        raise ValueError(f"minutes must be positive, got {minutes!r}")
    unknown = sorted(set(overrides) - set(TRAIN_PRESETS[preset]))
    if unknown:
        raise ValueError(f"unknown training setting(s): {', '.join(unknown)}; "
                         f"known: {', '.join(TRAIN_PRESETS[preset])}")
    tp = {**TRAIN_PRESETS[preset], **overrides}
    if not (isinstance(tp["lr"], (int, float)) and 0 < tp["lr"] <= 1):
        raise ValueError(f"lr must be in (0, 1], got {tp['lr']!r}")
    if not (isinstance(tp["certainty"], (int, float)) and 0 <= tp["certainty"] <= 10):
        raise ValueError(f"certainty must be in [0, 10], got {tp['certainty']!r}")
    if tp["certainty"] and kind != "bd":
        raise ValueError("certainty is a block-diffusion (kind='bd') training term")
    if tp["selfgen"] is not None:
        tp["selfgen"] = str(tp["selfgen"])
        _corpus.load_pool(tp["selfgen"])          # fails early, naming the file and line
    if tp["mix"] is not None:        # validated and logged as a dict of the source weights
        tp["mix"] = {k: v for k, v in _corpus.Mix.from_weights(tp["mix"]).sources()}
    if not (isinstance(tp["semi_ar_prob"], (int, float))
            and 0 <= tp["semi_ar_prob"] <= 1 - tp["prefix_prob"]):
        raise ValueError(f"semi_ar_prob must be in [0, {1 - tp['prefix_prob']:g}] "
                         f"(1 - prefix_prob), got {tp['semi_ar_prob']!r}")
    if init_from is not None:
        init_from = Path(init_from)
        if not (init_from / "model.safetensors").is_file() or not tt.has_tokenizer(init_from):
            raise FileNotFoundError(f"init_from: {init_from} needs model.safetensors and the "
                                    f"tokenizer files ({', '.join(tt.TOKENIZER_FILES)})")
    init_name = None if init_from is None else str(init_from)   # as logged and checked
    threads = set_threads()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    ckpt_path = latest_checkpoint(out) if resume else None
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False) if ckpt_path else None
    if resume and ckpt is None:
        print(f"note: no checkpoint under {_ckpt_dir(out)}; starting from scratch",
              file=sys.stderr)
    if ckpt is not None:
        meta = ckpt["meta"]
        for key, want in (("kind", kind), ("preset", preset), ("seed", seed),
                          ("init_from", init_name)):
            if meta.get(key) != want:
                raise ValueError(f"cannot resume {ckpt_path}: it was trained with "
                                 f"{key}={meta.get(key)!r}, not {want!r}")
        tp = meta["train_config"]
        if steps is not None and steps != meta["schedule_steps"] and meta["steps_given"]:
            raise ValueError(f"cannot resume {ckpt_path} with steps={steps}: the run's cosine "
                             f"schedule spans {meta['schedule_steps']} steps")

    # --- tokenizer (reused when resuming)
    if ckpt is not None and tt.has_tokenizer(out):
        tok = tt.load_raw(out)
    elif init_from is not None:
        tt.copy_tokenizer(init_from, out)
        tok = tt.load_raw(out)
    else:
        tok = tt.train_tokenizer(_corpus.tokenizer_corpus(tp["tokenizer_texts"], seed=seed),
                                 vocab_size=tp["vocab_size"])
        tt.save_tokenizer(tok, out)
    vocab = round_vocab(tok.get_vocab_size())

    # --- model, optimizer, schedule, data
    torch.manual_seed(seed)
    model = build_model(kind, preset, vocab, tp.get("block_size", 8)).to(device)
    init_info = None
    if init_from is not None and ckpt is None:
        init_info = load_init_weights(model, init_from)
    model.train()
    opt = make_optimizer(model, tp)
    schedule_steps = steps if steps is not None else (ckpt["meta"]["schedule_steps"]
                                                      if ckpt else None)
    warmup = tp["warmup_steps"] if steps is None else min(tp["warmup_steps"],
                                                          max(1, steps // 20))
    box = {"total": schedule_steps or 10 ** 9, "warmup": warmup}
    if ckpt is not None:
        box["warmup"] = warmup = ckpt["meta"]["warmup_steps"]
    sched = make_schedule(opt, box["warmup"], box["total"], tp["min_lr_ratio"])
    stream = _corpus.Stream(seed=seed, mix=_corpus.Mix.from_weights(tp.get("mix")),
                            pool=_corpus.load_pool(tp["selfgen"]) if tp.get("selfgen") else None,
                            pool_prob=tp.get("selfgen_prob", 0.0))
    batcher = Batcher(tok, stream, tokens_per_batch=tp["tokens_per_batch"],
                      prefix_prob=tp["prefix_prob"], semi_ar_prob=tp.get("semi_ar_prob", 0.0))
    gen = torch.Generator().manual_seed(seed + 1)

    step, tokens_seen, losses, curve, evals, prior_wall = 0, 0, [], [], [], 0.0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        stream.set_state(ckpt["stream_state"])
        gen.set_state(ckpt["gen_state"])
        torch.set_rng_state(ckpt["torch_rng"])
        step, tokens_seen = ckpt["step"], ckpt["tokens_seen"]
        init_info = ckpt["meta"].get("init_info")
        losses, curve, evals = ckpt["losses"], ckpt["curve"], ckpt["evals"]
        prior_wall = ckpt["wall_time_s"]
    n_params = sum(p.numel() for p in model.parameters())
    eval_seqs = eval_sequences(tok, tp["eval_stories"])

    def meta() -> dict[str, Any]:
        return {"kind": kind, "preset": preset, "seed": seed, "train_config": tp,
                "init_from": init_name, "init_info": init_info,
                "schedule_steps": box["total"], "steps_given": steps is not None,
                "warmup_steps": warmup}

    def checkpoint() -> None:
        _save_checkpoint(out, {
            "meta": meta(), "step": step, "tokens_seen": tokens_seen,
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "stream_state": stream.state(),
            "gen_state": gen.get_state(), "torch_rng": torch.get_rng_state(),
            "losses": losses, "curve": curve, "evals": evals,
            "wall_time_s": prior_wall + time.time() - t_start}, tp["keep_checkpoints"])

    def log(final_eval: dict | None = None) -> dict[str, Any]:
        wall = prior_wall + time.time() - t_start
        tail = losses[-50:]
        data = {
            "kind": kind, "preset": preset, "seed": seed, "out": str(out),
            "init_from": init_name, "init_info": init_info,
            "model_config": model.config.to_dict(), "params": n_params,
            "train_config": tp, "schedule_steps": box["total"], "warmup_steps": warmup,
            "steps": step, "tokens_seen": tokens_seen, "wall_time_s": round(wall, 1),
            "tokens_per_s": round(tokens_seen / wall, 1) if wall > 0 else None,
            "threads": threads, "machine": machine_info(), "device": device,
            "data": _corpus.describe(stream.mix),
            "final_loss": sum(tail) / len(tail) if tail else None,
            "curve": curve, "evals": evals, "eval": final_eval, "losses": losses,
        }
        (out / "train_log.json").write_text(json.dumps(data, indent=1) + "\n")
        return data

    # --- loop
    limit_s = minutes * 60 if minutes is not None else None
    target = schedule_steps
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=target, initial=step, unit="step", dynamic_ncols=True,
                   mininterval=1.0 if sys.stderr.isatty() else 30.0, desc=f"train {kind}")
    run_start, run_tokens, interval = time.time(), 0, []
    stopped_by_time = False
    while target is None or step < target:
        batch = batcher.next()
        if kind == "diffusion":
            loss = diffusion_step_loss(model, batch, gen, device)
        elif kind == "bd":
            loss = bd_step_loss(model, batch, gen, device, tp["block_size"],
                                tp.get("certainty", 0.0))
        else:
            loss = ar_step_loss(model, batch, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tp["grad_clip"])
        opt.step()
        sched.step()
        step += 1
        ntok = batch.real_tokens
        tokens_seen += ntok
        run_tokens += ntok
        lv = float(loss.detach())
        losses.append(round(lv, 6))
        interval.append(lv)
        elapsed = time.time() - run_start
        if target is None and step >= 10:
            # minutes only: the schedule spans what the budget allows at the measured speed
            per_step = elapsed / step
            box["total"] = target = max(step + 1, int((limit_s - (time.time() - t_start))
                                                      / per_step) + step)
            box["warmup"] = warmup = min(warmup, max(10, target // 20))
            sched = make_schedule(opt, warmup, target, tp["min_lr_ratio"], last_step=step - 1)
            if bar is not None:
                bar.total = target
        if step % tp["log_every"] == 0 or step == target:
            curve.append({"step": step, "loss": round(sum(interval) / len(interval), 5),
                          "lr": sched.get_last_lr()[0], "tokens": tokens_seen,
                          "elapsed_s": round(prior_wall + time.time() - t_start, 1)})
            interval = []
        if bar is not None:
            bar.set_postfix(loss=f"{lv:.3f}", tok_s=f"{run_tokens / max(elapsed, 1e-9):.0f}",
                            src=batch.source[:4], L=batch.input_ids.shape[1], refresh=False)
            bar.update(1)
        if tp["eval_every"] and step % tp["eval_every"] == 0 and step != target:
            e = eval_loss(model, kind, eval_seqs, device, tp.get("block_size", 8))
            evals.append({"step": step, **e})
        if step % tp["ckpt_every"] == 0:
            checkpoint()
            log()
        del loss, batch
        if limit_s is not None and time.time() - t_start > limit_s and step != target:
            stopped_by_time = True
            break
        if stop_at is not None and step >= stop_at:
            break
    if bar is not None:
        bar.close()

    final_eval = eval_loss(model, kind, eval_seqs, device, tp.get("block_size", 8))
    evals.append({"step": step, **final_eval})
    checkpoint()
    save_final(model, out, kind)
    data = log(final_eval)
    summary = {"out": str(out), "kind": kind, "preset": preset, "seed": seed, "steps": step,
               "schedule_steps": box["total"], "stopped_by_time": stopped_by_time,
               "params": n_params, "tokens_seen": tokens_seen,
               "wall_time_s": data["wall_time_s"], "tokens_per_s": data["tokens_per_s"],
               "final_loss": data["final_loss"],
               "eval_loss": final_eval.get("masked_loss", final_eval.get("ar_loss")),
               "losses": list(losses)}
    return summary
