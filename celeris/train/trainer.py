"""Train the shipped tiny models on CPU: the masked-diffusion ``celeris-tiny``, its
autoregressive twin ``celeris-tiny-ar`` and the block-diffusion ``celeris-tiny-bd`` (same size,
same tokenizer). A shipped model's stages are in ``models/<name>/recipe.toml``, run by
``celeris train --recipe`` (``celeris.pipeline``), which calls ``train`` once a run:

    train("runs/ar", steps=N, kind="ar")
    train("runs/bd", steps=N, kind="bd", init_from="runs/ar")     # AR-to-block-diffusion

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
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from celeris.synthetic import corpus as _corpus
from celeris.train import stream as _stream
from celeris.train import blockdiff, checkpoints, objective
from celeris.train import tokenizer_train as tt
from celeris.train.data import IGNORE, Batcher, positions

KINDS = ("diffusion", "ar", "bd")     # bd: block diffusion (block-causal, celeris-tiny-bd)

# CelerisConfig kwargs (the AR twin reuses the size fields). shift_logits=True is Dream's
# shifted prediction: a masked position reads its left neighbour's state, which gets a tiny
# model off the unigram plateau.
_SHARED = dict(max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5,
               shift_logits=True, qkv_bias=False, tie_word_embeddings=False)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=4, **_SHARED),
    "micro": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, **_SHARED),
}

# Optimisation and data settings per preset (micro: the smoke-test model).
_TINY = dict(lr=2e-3, min_lr_ratio=0.1, warmup_steps=100, weight_decay=0.1, betas=(0.9, 0.95),
             grad_clip=1.0, tokens_per_batch=2048, prefix_prob=0.25, semi_ar_prob=0.0,
             mix=None, tokenizer_texts=20000, vocab_size=tt.VOCAB_SIZE, eval_stories=128,
             block_size=8, certainty=0.0, masking="random", selfgen=None, selfgen_prob=0.0,
             asks=None, free=0.0, log_every=10, ckpt_every=200, eval_every=500, keep_checkpoints=2)
TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "micro": {**_TINY, "lr": 3e-3, "warmup_steps": 4, "tokens_per_batch": 512,
              "tokenizer_texts": 600, "vocab_size": 512, "eval_stories": 8, "block_size": 4,
              "log_every": 1, "ckpt_every": 10, "eval_every": 0},
}


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
    sizes = {k: v for k, v in cfg.items() if k not in ("shift_logits", "qkv_bias")}
    config = LlamaConfig(vocab_size=vocab_size, attention_bias=False, mlp_bias=False,
                         **sizes, **ids)
    return LlamaForCausalLM(config)


def make_schedule(opt: torch.optim.Optimizer, warmup: int, total: int,
                  min_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the peak learning rate, then a half cosine down to ``min_ratio`` x the
    peak at ``total`` steps (transformers' schedule)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    return get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, total, min_lr_rate=min_ratio)


def make_optimizer(model, tp: dict[str, Any]) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tp["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tp["lr"], betas=tuple(tp["betas"]), eps=1e-8)


# ----------------------------------------------------------------------------- losses
def diffusion_step_loss(model, batch, gen: torch.Generator, device: str) -> torch.Tensor:
    noisy, masked, t = objective.mask_batch(batch.input_ids, batch.maskable,
                                            tt.SPECIAL_IDS["mask"], gen, forced=batch.forced)
    attn = None if batch.attention_mask is None else batch.attention_mask.to(device)
    with objective.bf16_autocast(device):
        logits = model(noisy.to(device), attention_mask=attn,
                       logits_mask=masked.to(device)).logits
    row_mean = None if batch.forced is None else batch.forced.any(dim=1).to(device)
    return objective.diffusion_loss(logits, batch.input_ids.to(device), masked.to(device),
                                    batch.maskable.to(device), t.to(device), row_mean)


def bd_step_loss(model, batch, gen: torch.Generator, device: str, block_size: int,
                 certainty: float = 0.0, masking: str = "random") -> torch.Tensor:
    """Block-diffusion loss (``blockdiff``): ``masking`` = "random" or "suffix"
    (``blockdiff.block_inputs``), ``certainty`` the weight of the certainty term."""
    inputs = blockdiff.block_inputs(batch, block_size, tt.SPECIAL_IDS["mask"], gen,
                                    masking=masking)
    with objective.bf16_autocast(device):
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
    with objective.bf16_autocast(device):
        hidden = model.model(input_ids=ids, attention_mask=attn,
                             position_ids=pos).last_hidden_state
        target = labels[:, 1:]
        keep = target != IGNORE
        logits = model.lm_head(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), target[keep])


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
                                          tt.SPECIAL_IDS["pad"], device=device, skip_first=1)
    return objective.ar_eval_loss(model, seqs, tt.SPECIAL_IDS["pad"], device=device)


# ----------------------------------------------------------------------------- settings
def _check_budget(kind: str, preset: str, steps: Any) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")


def check_settings(kind: str, preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The preset's training settings with ``overrides`` applied, validated and normalised
    (a mix as a dict of source weights) as they are logged."""
    unknown = sorted(set(overrides) - set(TRAIN_PRESETS[preset]))
    if unknown:
        raise ValueError(f"unknown training setting(s): {', '.join(unknown)}; "
                         f"known: {', '.join(TRAIN_PRESETS[preset])}")
    tp = {**TRAIN_PRESETS[preset], **overrides}
    if not (isinstance(tp["lr"], (int, float)) and 0 < tp["lr"] <= 1):
        raise ValueError(f"lr must be in (0, 1], got {tp['lr']!r}")
    if not (isinstance(tp["certainty"], (int, float)) and 0 <= tp["certainty"] <= 10):
        raise ValueError(f"certainty must be in [0, 10], got {tp['certainty']!r}")
    if tp["masking"] not in blockdiff.MASKINGS:
        raise ValueError(f"masking must be one of {', '.join(blockdiff.MASKINGS)}, "
                         f"got {tp['masking']!r}")
    bd_only = ["certainty"] if tp["certainty"] else []
    bd_only += ["masking"] if tp["masking"] != "random" else []
    if bd_only and kind != "bd":
        raise ValueError(f"{bd_only[0]} is a block-diffusion (kind='bd') setting")
    if tp["selfgen"] is not None:
        tp["selfgen"] = str(tp["selfgen"])
        _stream.load_pool(tp["selfgen"])          # fails early, naming the file and line
    tp["asks"] = _stream.check_asks(tp["asks"])
    tp["free"] = _stream.check_free(tp.get("free"))
    if tp["mix"] is not None:        # validated and logged as a dict of the source weights
        tp["mix"] = {k: v for k, v in _stream.Mix.from_weights(tp["mix"]).sources()}
    if not (isinstance(tp["semi_ar_prob"], (int, float))
            and 0 <= tp["semi_ar_prob"] <= 1 - tp["prefix_prob"]):
        raise ValueError(f"semi_ar_prob must be in [0, {1 - tp['prefix_prob']:g}] "
                         f"(1 - prefix_prob), got {tp['semi_ar_prob']!r}")
    return tp


def _check_init(init_from: str | Path | None) -> Path | None:
    if init_from is None:
        return None
    init_from = Path(init_from)
    if not (init_from / "model.safetensors").is_file() or not tt.has_tokenizer(init_from):
        raise FileNotFoundError(f"init_from: {init_from} needs model.safetensors and the "
                                f"tokenizer files ({', '.join(tt.TOKENIZER_FILES)})")
    return init_from


def load_tokenizer(out: Path, resuming: bool, init_from: Path | None, tp: dict[str, Any],
                   seed: int):
    """The run's tokenizer: the checkpointed run's, the initial model's, or a new BPE."""
    if resuming and tt.has_tokenizer(out):
        return tt.load_raw(out)
    if init_from is not None:
        tt.copy_tokenizer(init_from, out)
        return tt.load_raw(out)
    tok = tt.train_tokenizer(_stream.tokenizer_corpus(tp["tokenizer_texts"], seed=seed),
                             vocab_size=tp["vocab_size"])
    tt.save_tokenizer(tok, out)
    return tok


# ----------------------------------------------------------------------------- the run
class _Run:
    """Everything a training run carries from step to step, and what it saves."""

    def __init__(self, out: Path, kind: str, preset: str, seed: int, device: str,
                 tp: dict[str, Any], tok, init_from: Path | None, steps: int,
                 ckpt: dict[str, Any] | None) -> None:
        self.out, self.kind, self.preset, self.seed, self.device = out, kind, preset, seed, device
        self.tp, self.total = tp, steps
        self.init_name = None if init_from is None else str(init_from)
        self.threads = torch.get_num_threads()
        self.t_start = time.time()
        torch.manual_seed(seed)
        self.model = build_model(kind, preset, round_vocab(tok.get_vocab_size()),
                                 tp.get("block_size", 8)).to(device)
        self.init_info = (checkpoints.load_init_weights(self.model, init_from)
                          if init_from is not None and ckpt is None else None)
        self.model.train()
        self.opt = make_optimizer(self.model, tp)
        self.warmup = (ckpt["meta"]["warmup_steps"] if ckpt is not None
                       else min(tp["warmup_steps"], max(1, steps // 20)))
        self.sched = make_schedule(self.opt, self.warmup, steps, tp["min_lr_ratio"])
        pool = _stream.load_pool(tp["selfgen"]) if tp.get("selfgen") else None
        mix = _stream.Mix.from_weights(tp.get("mix"))
        if tp.get("asks"):
            mix = replace(mix, ask_share=tp["asks"]["share"],
                          ask_fields=tuple(tp["asks"]["fields"]))
        if tp.get("free"):
            mix = replace(mix, free_share=tp["free"])
        self.stream = _stream.Stream(seed=seed, mix=mix,
                                     pool=pool, pool_prob=tp.get("selfgen_prob", 0.0))
        self.batcher = Batcher(tok, self.stream, tokens_per_batch=tp["tokens_per_batch"],
                               prefix_prob=tp["prefix_prob"],
                               semi_ar_prob=tp.get("semi_ar_prob", 0.0))
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.step, self.tokens_seen, self.prior_wall = 0, 0, 0.0
        self.losses: list[float] = []
        self.curve: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        if ckpt is not None:
            self.restore(ckpt)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.eval_seqs = eval_sequences(tok, tp["eval_stories"])

    # ---------------------------------------------------------------- state
    def restore(self, ckpt: dict[str, Any]) -> None:
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.sched.load_state_dict(ckpt["scheduler"])
        self.stream.set_state(ckpt["stream_state"])
        self.gen.set_state(ckpt["gen_state"])
        torch.set_rng_state(ckpt["torch_rng"])
        self.step, self.tokens_seen = ckpt["step"], ckpt["tokens_seen"]
        self.init_info = ckpt["meta"].get("init_info")
        self.losses, self.curve, self.evals = ckpt["losses"], ckpt["curve"], ckpt["evals"]
        self.prior_wall = ckpt["wall_time_s"]

    def wall(self) -> float:
        return self.prior_wall + time.time() - self.t_start

    def meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "preset": self.preset, "seed": self.seed,
                "train_config": self.tp, "init_from": self.init_name,
                "init_info": self.init_info, "schedule_steps": self.total,
                "warmup_steps": self.warmup}

    def checkpoint(self) -> None:
        checkpoints.save_checkpoint(self.out, {
            "meta": self.meta(), "step": self.step, "tokens_seen": self.tokens_seen,
            "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(), "stream_state": self.stream.state(),
            "gen_state": self.gen.get_state(), "torch_rng": torch.get_rng_state(),
            "losses": self.losses, "curve": self.curve, "evals": self.evals,
            "wall_time_s": self.wall()}, self.tp["keep_checkpoints"])

    def log(self, final_eval: dict | None = None) -> dict[str, Any]:
        wall, tail = self.wall(), self.losses[-50:]
        data = {
            **self.meta(), "out": str(self.out), "model_config": self.model.config.to_dict(),
            "params": self.n_params, "steps": self.step, "tokens_seen": self.tokens_seen,
            "wall_time_s": round(wall, 1),
            "tokens_per_s": round(self.tokens_seen / wall, 1) if wall > 0 else None,
            "threads": self.threads, "machine": machine_info(), "device": self.device,
            "data": _stream.describe(self.stream.mix),
            "final_loss": sum(tail) / len(tail) if tail else None,
            "curve": self.curve, "evals": self.evals, "eval": final_eval,
            "losses": self.losses,
        }
        (self.out / "train_log.json").write_text(json.dumps(data, indent=1) + "\n")
        return data

    # ---------------------------------------------------------------- steps
    def loss(self, batch) -> torch.Tensor:
        tp = self.tp
        if self.kind == "diffusion":
            return diffusion_step_loss(self.model, batch, self.gen, self.device)
        if self.kind == "bd":
            return bd_step_loss(self.model, batch, self.gen, self.device, tp["block_size"],
                                tp.get("certainty", 0.0), tp.get("masking", "random"))
        return ar_step_loss(self.model, batch, self.device)

    def optimise(self) -> tuple[float, Any]:
        """One optimizer step on the next batch: (loss value, batch)."""
        batch = self.batcher.next()
        loss = self.loss(batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tp["grad_clip"])
        self.opt.step()
        self.sched.step()
        self.step += 1
        self.tokens_seen += batch.real_tokens
        value = float(loss.detach())
        self.losses.append(round(value, 6))
        return value, batch

    def evaluate(self) -> dict[str, Any]:
        return eval_loss(self.model, self.kind, self.eval_seqs, self.device,
                         self.tp.get("block_size", 8))


def _progress_bar(run: _Run, enabled: bool, label: str | None = None):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=run.total, initial=run.step, unit="step", dynamic_ncols=True,
                mininterval=1.0 if sys.stderr.isatty() else 30.0,
                desc=label or f"train {run.kind}")


def _loop(run: _Run, stop_at: int | None, bar) -> None:
    """Optimise until the schedule ends or ``stop_at``; log, evaluate and checkpoint on the
    preset's cadence."""
    tp = run.tp
    run_start, run_tokens, interval = time.time(), 0, []
    while run.step < run.total:
        value, batch = run.optimise()
        run_tokens += batch.real_tokens
        interval.append(value)
        if run.step % tp["log_every"] == 0 or run.step == run.total:
            run.curve.append({"step": run.step,
                              "loss": round(sum(interval) / len(interval), 5),
                              "lr": run.sched.get_last_lr()[0], "tokens": run.tokens_seen,
                              "elapsed_s": round(run.wall(), 1)})
            interval = []
        if bar is not None:
            tok_s = run_tokens / max(time.time() - run_start, 1e-9)
            bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{tok_s:.0f}", src=batch.source[:4],
                            L=batch.input_ids.shape[1], refresh=False)
            bar.update(1)
        if tp["eval_every"] and run.step % tp["eval_every"] == 0 and run.step != run.total:
            run.evals.append({"step": run.step, **run.evaluate()})
        if run.step % tp["ckpt_every"] == 0:
            run.checkpoint()
            run.log()
        del batch
        if stop_at is not None and run.step >= stop_at:
            return


# ----------------------------------------------------------------------------- train
def train(out: str | Path, *, steps: int, device: str = "cpu", resume: bool = False,
          seed: int = 0, kind: str = "diffusion", preset: str | None = "tiny",
          progress: bool = True, stop_at: int | None = None,
          init_from: str | Path | None = None, label: str | None = None,
          **overrides: Any) -> dict[str, Any]:
    """Train a model into ``out`` for ``steps`` optimizer steps (the cosine schedule spans
    them); returns a summary (the whole record is ``out/train_log.json``).

    resume:    continue from the latest checkpoint in ``out/checkpoints`` (same settings).
    stop_at:   stop (with a checkpoint) after this step, as an interruption would.
    init_from: start from the weights and tokenizer of a trained model of the same preset:
               for diffusion/bd the AR twin (AR-to-diffusion adaptation, as Dream-7B from
               Qwen2.5; shifted logits keep each position's prediction where the AR model
               put it), for ar continued training.
    overrides: settings of ``TRAIN_PRESETS`` to change (e.g. tokens_per_batch=2048, lr=1e-3).
    """
    preset = preset or "tiny"
    _check_budget(kind, preset, steps)
    tp = check_settings(kind, preset, overrides)
    init_from = _check_init(init_from)
    set_threads()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    want = {"kind": kind, "preset": preset, "seed": seed,
            "init_from": None if init_from is None else str(init_from)}
    ckpt = checkpoints.open_checkpoint(out, want, steps) if resume else None
    if ckpt is not None:
        tp = ckpt["meta"]["train_config"]
    tok = load_tokenizer(out, ckpt is not None, init_from, tp, seed)
    run = _Run(out, kind, preset, seed, device, tp, tok, init_from, steps, ckpt)
    bar = _progress_bar(run, progress, label)
    _loop(run, stop_at, bar)
    if bar is not None:
        bar.close()
    final_eval = run.evaluate()
    run.evals.append({"step": run.step, **final_eval})
    run.checkpoint()
    checkpoints.save_final(run.model, out, kind)
    data = run.log(final_eval)
    keys = ("out", "kind", "preset", "seed", "steps", "params", "tokens_seen", "wall_time_s",
            "tokens_per_s", "final_loss", "losses")
    return {**{k: data[k] for k in keys},
            "eval_loss": final_eval.get("masked_loss", final_eval.get("ar_loss"))}
