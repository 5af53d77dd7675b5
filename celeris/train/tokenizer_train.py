"""Byte-level BPE for the shipped tiny models, trained on our own corpus.

Every digit is its own pre-token, a leading space kept with it (" 417" -> " 4" "1" "7"), before
the byte-level step: the arithmetic tasks are digit-level and a list item (a single digit) is
one token with no separate space token, which a tiny masked diffusion model learns to copy
far sooner than multi-token items (docs/FINDINGS.md).

Special tokens have fixed ids 0..7 (``SPECIAL_TOKENS``). The saved folder loads offline with
``transformers.AutoTokenizer.from_pretrained(dir)`` and carries a chat template: every message is
``<|role|>\\n`` + content + ``<|eot|>``; with ``add_generation_prompt`` a trailing
``<|assistant|>\\n``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOS, MASK, USER, ASSISTANT, SYSTEM, EOT = (
    "<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>", "<|user|>", "<|assistant|>", "<|system|>",
    "<|eot|>")
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, MASK, USER, ASSISTANT, SYSTEM, EOT)
SPECIAL_IDS: dict[str, int] = {
    "pad": 0, "bos": 1, "eos": 2, "mask": 3, "user": 4, "assistant": 5, "system": 6, "eot": 7}

VOCAB_SIZE = 2048
MODEL_MAX_LENGTH = 512
# One digit, with the space before it if there is one.
NUMBER_CHUNK = r" ?\d"

# Jinja chat template (the literal newlines are part of the rendering).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}\n"
    "{{ message['content'] }}<|eot|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_tokenizer() -> Tokenizer:
    """An untrained tokenizer with our normalisation, pre-tokenisation and decoder."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(NUMBER_CHUNK), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE,
                    min_frequency: int = 2) -> Tokenizer:
    """Train byte-level BPE on ``texts``; special tokens get ids 0..7."""
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer=trainer)
    for name, i in SPECIAL_IDS.items():
        got = tok.token_to_id(SPECIAL_TOKENS[i])
        if got != i:
            raise RuntimeError(f"special token {SPECIAL_TOKENS[i]} got id {got}, expected {i}")
    # A plain prompt starts with BOS, as the training stories do; chat renderings carry no BOS
    # (chat templates are tokenized without special tokens).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, SPECIAL_IDS["bos"])])
    return tok


def tokenizer_config(model_max_length: int = MODEL_MAX_LENGTH) -> dict:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "mask_token": MASK,
        "unk_token": None,
        "additional_special_tokens": [USER, ASSISTANT, SYSTEM, EOT],
        "model_max_length": model_max_length,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict:
    return {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "mask_token": MASK,
            "additional_special_tokens": [USER, ASSISTANT, SYSTEM, EOT]}


def save_tokenizer(tok: Tokenizer, out_dir: str | Path,
                   model_max_length: int = MODEL_MAX_LENGTH) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(model_max_length), indent=2, ensure_ascii=False) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps(special_tokens_map(), indent=2) + "\n")
    return out


def load_raw(out_dir: str | Path) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` saved in a folder (fast path for training)."""
    return Tokenizer.from_file(str(Path(out_dir) / "tokenizer.json"))


def has_tokenizer(out_dir: str | Path) -> bool:
    return all((Path(out_dir) / f).is_file() for f in TOKENIZER_FILES)


def copy_tokenizer(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer files from one folder to another."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in TOKENIZER_FILES:
        (dst / f).write_bytes((Path(src) / f).read_bytes())
