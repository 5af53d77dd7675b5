"""A random tiny masked-diffusion model directory for tests (no training, no network).

``make_tiny_model_dir(path)`` writes config.json, model.safetensors, a byte-level BPE tokenizer
with the Celeris special tokens and a chat template, and generation_config.json, so that
``Engine.from_pretrained(path, device="cpu")`` loads it like a real checkpoint. The output is
noise, but deterministic for a given seed; byte-level tokens also exercise the case where a
decoded prefix ends inside a UTF-8 character.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>", "<|user|>", "<|assistant|>",
                  "<|system|>", "<|eot|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|eot|>"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
CORPUS = ("the quick brown fox jumps over the lazy dog. def fib(n): return n if n < 2 else "
          "fib(n - 1) + fib(n - 2). Once upon a time a small model wrote a story. "
          "café naïve über — λ → ✓ 日本語").split(". ")
# Small defaults keep CPU tests fast; callers override per request.
GENERATION_DEFAULTS = {"gen_length": 16, "block_length": 8, "temperature": 0.0,
                       "decoding": "fixed", "cache": "none"}


def make_tiny_model_dir(path: str | Path, shift_logits: bool = False, seed: int = 0, *,
                        vocab_merges: int = 64, max_position_embeddings: int = 256,
                        generation_defaults: dict[str, Any] | None = None,
                        **config: Any) -> Path:
    """Write a random tiny model + tokenizer into ``path`` and return it.

    The model has 2 layers, hidden size 32 and a context of ``max_position_embeddings``
    tokens; ``seed`` fixes its weights. ``generation_defaults`` replaces the small defaults
    written to generation_config.json; ``config`` adds or overrides config fields (e.g.
    ``attention="block_causal", block_size=4`` for a block-diffusion model).
    """
    import torch
    from transformers import PreTrainedTokenizerFast

    import celeris

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(vocab_merges), bos_token="<|bos|>",
        eos_token="<|eos|>", pad_token="<|pad|>", mask_token="<|mask|>",
        additional_special_tokens=list(SPECIAL_TOKENS[4:]))
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(path))
    vocab = hf_tok.get_vocab()
    cfg = celeris.CelerisConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=max_position_embeddings,
        shift_logits=shift_logits, initializer_range=0.5, mask_token_id=vocab["<|mask|>"],
        eot_token_id=vocab["<|eot|>"], eos_token_id=vocab["<|eos|>"],
        pad_token_id=vocab["<|pad|>"], bos_token_id=vocab["<|bos|>"], **config)
    torch.manual_seed(seed)
    celeris.CelerisForMaskedDiffusion(cfg).save_pretrained(str(path))
    defaults = GENERATION_DEFAULTS if generation_defaults is None else generation_defaults
    (path / "generation_config.json").write_text(json.dumps(defaults), encoding="utf-8")
    return path


def _train_tokenizer(merges: int, special_tokens: Sequence[str] = SPECIAL_TOKENS) -> Any:
    """Byte-level BPE: 256 byte tokens + the special tokens (ids 0.. in order) + ``merges``
    merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(special_tokens) + merges, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def tiny_block_model():
    """A random one-layer block-causal model (vocab 32, blocks of 4, [MASK] = 3) in eval mode,
    for loss tests in the block-diffusion training layout."""
    import torch

    from celeris import CelerisConfig, CelerisForMaskedDiffusion
    torch.manual_seed(0)
    cfg = CelerisConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, shift_logits=True,
                        attention="block_causal", block_size=4, mask_token_id=3,
                        initializer_range=1.0)
    return CelerisForMaskedDiffusion(cfg).eval()


def tiny_block_batch(source: str, unscored: int):
    """Two random rows of 12 tokens for ``tiny_block_model`` (ids 5-31), the first
    ``unscored`` positions of each a prompt (label -100), one batch of ``source``."""
    import torch

    from celeris.train.data import IGNORE, Batch
    ids = torch.randint(5, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :unscored] = IGNORE
    return Batch(ids, None, torch.ones_like(ids, dtype=torch.bool), labels, source, 12)



def write_family_tokenizer(path: str | Path, special_tokens: list[str], merges: int = 48,
                           **named: str) -> dict[str, int]:
    """Save a byte-level BPE tokenizer whose special tokens take ids 0.. in the order given
    and whose roles are only those ``named`` (e.g. ``eos_token="<|endoftext|>"``): a
    published family's tokenizer in miniature, with no mask token named unless asked.
    Returns the vocabulary."""
    from transformers import PreTrainedTokenizerFast

    tok = _train_tokenizer(merges, special_tokens)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, **named)
    hf_tok.save_pretrained(str(path))
    return hf_tok.get_vocab()
