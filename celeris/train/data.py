"""Tokenised, length-bucketed training batches from the seeded stream.

A batch holds one source and one length, so no compute is spent on padding beyond the chat
prompts' left padding:

* stories: ``<|bos|>`` + story + ``<|eos|>`` padding up to the bucket length; every position
  but the BOS is maskable. With probability ``prefix_prob`` a random prefix is kept unmasked
  (completion of a given beginning).
* semi-autoregressive rows (probability ``semi_ar_prob``; stories and story-request answers):
  a clean prefix, one block of 1-32 positions masked at the row's rate t, every later
  position masked but not scored (``forced``): the state semi-autoregressive decoding puts
  the model in, which plain random masking almost never shows it.
* chats (tasks, story requests): left-padded chat-templated prompt (never maskable) + answer
  + ``<|eot|>`` + ``<|eos|>`` padding up to a canvas length drawn per batch, so the model
  learns to end the answer and fill the rest with EOS for any canvas up to 256.

``labels`` carries the AR twin's targets on the same tokens (the story and its first EOS;
the answer and its EoT), -100 elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from celeris.train.stream import Item, Stream
from celeris.train.tokenizer_train import CHAT_TEMPLATE, SPECIAL_IDS

IGNORE = -100

# source -> (length, weight) buckets; long stories are 150-400 tokens, reqhead is a long
# story cropped to its start
BUCKETS = {"story": ((64, 0.45), (128, 0.40), (256, 0.15)),
           "task": ((16, 0.25), (32, 0.45), (64, 0.15), (128, 0.08), (256, 0.07)),
           "request": ((64, 0.30), (128, 0.45), (256, 0.25)),
           "long": ((384, 1.0),), "longreq": ((384, 1.0),),
           "reqhead": ((32, 0.5), (64, 0.3), (128, 0.2))}
PROMPT_ESTIMATE = {"task": 22, "request": 16, "longreq": 22, "reqhead": 22}  # mean prompt tokens
CROPPED = ("reqhead",)                  # chat sources whose answer is cropped to the canvas
SEMI_AR_BLOCKS = (1, 2, 4, 8, 16, 32)             # block lengths of semi-autoregressive rows


@dataclass
class Batch:
    input_ids: torch.Tensor              # (B, L) clean tokens
    attention_mask: torch.Tensor | None  # (B, L) 1 = real; None when nothing is padded
    maskable: torch.Tensor               # (B, L) bool: positions the diffusion loss may mask
    labels: torch.Tensor                 # (B, L) AR targets (token id) or -100
    source: str
    length: int                          # bucket length (story) or canvas length (chat)
    forced: torch.Tensor | None = None   # (B, L) bool: always masked, never scored; None = none

    @property
    def real_tokens(self) -> int:
        if self.attention_mask is None:
            return self.input_ids.numel()
        return int(self.attention_mask.sum())


def _chat_renderer(tokenizer: Any) -> Any:
    """A transformers tokenizer around ``tokenizer`` with the shipped chat template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    hf.chat_template = CHAT_TEMPLATE
    return hf


class Batcher:
    """Draws batches from a ``Stream``; all randomness comes from the stream's RNG."""

    def __init__(self, tokenizer, stream: Stream, tokens_per_batch: int = 4096,
                 prefix_prob: float = 0.25, semi_ar_prob: float = 0.0) -> None:
        for name, p in (("prefix_prob", prefix_prob), ("semi_ar_prob", semi_ar_prob),
                        ("prefix_prob + semi_ar_prob", prefix_prob + semi_ar_prob)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p!r}")
        self.tok, self.stream, self.tokens_per_batch = tokenizer, stream, tokens_per_batch
        self.prefix_prob, self.semi_ar_prob = prefix_prob, semi_ar_prob
        self.pad, self.bos, self.eos, self.eot = (SPECIAL_IDS["pad"], SPECIAL_IDS["bos"],
                                                  SPECIAL_IDS["eos"], SPECIAL_IDS["eot"])
        self._chat = _chat_renderer(tokenizer)

    @property
    def rng(self) -> random.Random:
        return self.stream.rng

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text of a chat, through the template the saved tokenizer carries."""
        return self._chat.apply_chat_template(messages, add_generation_prompt=True,
                                              tokenize=False)

    def _bucket(self, source: str) -> int:
        lengths, weights = zip(*BUCKETS[source])
        return self.rng.choices(lengths, weights)[0]

    def next(self) -> Batch:
        source = self.stream.pick_source()
        if source in ("story", "long"):
            return self.story_batch(self._bucket(source), source)
        return self.chat_batch(source, self._bucket(source))

    def _semi_ar(self, maskable: torch.Tensor, forced: torch.Tensor, start: int,
                 end: int) -> None:
        """Make one row semi-autoregressive in place: positions before a cut drawn in
        [start, end) stay clean, a block after the cut is maskable, the rest is forced."""
        cut = self.rng.randint(start, end - 1)
        block = self.rng.choice(SEMI_AR_BLOCKS)
        maskable[:cut] = False
        maskable[cut + block:] = False
        forced[cut + block:] = True

    # ------------------------------------------------------------------ stories
    def story_batch(self, length: int, source: str = "story") -> Batch:
        rows = max(1, self.tokens_per_batch // length)
        ids = torch.full((rows, length), self.eos, dtype=torch.long)
        maskable = torch.ones((rows, length), dtype=torch.bool)
        labels = torch.full((rows, length), IGNORE, dtype=torch.long)
        forced = torch.zeros((rows, length), dtype=torch.bool)
        for r in range(rows):
            toks = None
            for _ in range(64):
                cand = [self.bos] + self.encode(self.stream.item(source).text)
                if len(cand) < length:           # room for at least one EOS
                    toks = cand
                    break
            if toks is None:                     # give up: a truncated story (no EOS)
                toks = cand[:length]
            n = len(toks)
            ids[r, :n] = torch.tensor(toks)
            keep = 1                             # BOS is never masked
            draw = self.rng.random()
            if draw < self.prefix_prob and n > 2:
                keep = self.rng.randint(2, n - 1)
            elif draw < self.prefix_prob + self.semi_ar_prob and n > 2:
                self._semi_ar(maskable[r], forced[r], 2, n)
            maskable[r, :keep] = False
            end = min(n + 1, length)             # the story and its first EOS
            labels[r, 1:end] = ids[r, 1:end]
        return Batch(ids, None, maskable, labels, source, length,
                     forced if bool(forced.any()) else None)

    # ------------------------------------------------------------------ chats
    def chat_example(self, source: str, canvas: int) -> tuple[list[int], list[int]]:
        """(prompt ids, answer ids + EoT) of one item whose answer fits ``canvas``; for a
        ``CROPPED`` source, the answer's first ``canvas`` ids (no EoT: a beginning, not an end)."""
        while True:
            item: Item = self.stream.item(source)
            answer = self.encode(item.answer) + [self.eot]
            if source in CROPPED and len(answer) > canvas:
                return self.encode(self.render_chat(item.chat())), answer[:canvas]
            if len(answer) <= canvas:
                return self.encode(self.render_chat(item.chat())), answer

    def chat_batch(self, source: str, canvas: int) -> Batch:
        rows = max(1, self.tokens_per_batch // (canvas + PROMPT_ESTIMATE[source]))
        pairs = [self.chat_example(source, canvas) for _ in range(rows)]
        plen = max(len(p) for p, _ in pairs)
        L = plen + canvas
        ids = torch.full((rows, L), self.eos, dtype=torch.long)
        attn = torch.ones((rows, L), dtype=torch.long)
        maskable = torch.zeros((rows, L), dtype=torch.bool)
        labels = torch.full((rows, L), IGNORE, dtype=torch.long)
        forced = torch.zeros((rows, L), dtype=torch.bool)
        for r, (p, a) in enumerate(pairs):
            off = plen - len(p)
            ids[r, :off] = self.pad
            attn[r, :off] = 0
            ids[r, off:plen] = torch.tensor(p)
            ids[r, plen:plen + len(a)] = torch.tensor(a)
            maskable[r, plen:] = True
            labels[r, plen:plen + len(a)] = ids[r, plen:plen + len(a)]
            # no draw at all when semi_ar_prob is 0 (the stream stays as it was)
            if source in ("request", "longreq", "reqhead") and self.semi_ar_prob > 0 \
                    and self.rng.random() < self.semi_ar_prob:
                self._semi_ar(maskable[r], forced[r], plen, plen + len(a))
        return Batch(ids, None if bool(attn.all()) else attn, maskable, labels, source, canvas,
                     forced if bool(forced.any()) else None)


def positions(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """Position ids counted from each row's first real token (left padding)."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1]).expand_as(input_ids)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
