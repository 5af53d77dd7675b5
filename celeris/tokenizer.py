"""Tokenizer wrapper: encode, decode, chat template, and the special ids a sampler needs.

Special ids come from the model's own files (config.json, tokenizer_config.json, the
vocabulary), never from literals: LLaDA, Dream and celeris-tiny all spell them differently.
Where a published checkpoint names an id in none of them (Fast-dLLM v2's mask, LLaDA-MoE's,
given only in their model cards), the family's known ids (``Family.special_ids``, passed to
``Tokenizer.load``) are the last resort.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .config import ModelLoadError

# End-of-turn tokens by the names the supported families give them in their vocabularies.
EOT_NAMES = ("<|eot|>", "<|eot_id|>", "<|im_end|>")
MASK_NAMES = ("<|mask|>", "<|mdm_mask|>", "|<MASK>|", "<|MASK|>")   # ... Fast-dLLM v2, SDAR

Messages = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class SpecialIds:
    mask: int
    eos: int
    pad: int
    eot: int | None

    @property
    def stop(self) -> tuple[int, ...]:
        """Ids that end an answer: EOS and, where the model has one, end-of-turn."""
        return (self.eos,) if self.eot is None or self.eot == self.eos else (self.eos, self.eot)


class Tokenizer:
    """A model's tokenizer and special ids. User text is text: special-token spellings in a
    prompt or in a message's content (``<|mask|>``, ``<|assistant|>``) are encoded as the
    characters they are, never as the control tokens they name, so a user can neither forge a
    turn nor place a mask in a prompt; only the chat template's own markup becomes control
    tokens. ``parse_special=True`` is the operator's opt-in to parsing them in user text."""

    def __init__(self, hf_tokenizer: Any, special: SpecialIds, parse_special: bool = False
                 ) -> None:
        self.hf = hf_tokenizer
        self.special = special
        self.parse_special = parse_special   # read special-token text in user input as tokens

    # --------------------------------------------------------------- loading
    @classmethod
    def load(cls, model_dir: str | Path, config: Any = None,
             known_ids: dict[str, int] | None = None) -> "Tokenizer":
        """The tokenizer of a model directory; ``known_ids`` are its family's model-card ids
        ({"mask": id, "eos": id}), used only where the files name none."""
        model_dir = Path(model_dir)
        hf = _load_hf_tokenizer(model_dir)
        return cls(hf, _special_ids(hf, config, model_dir, dict(known_ids or {})))

    # --------------------------------------------------------------- text <-> ids
    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` (a prompt) the model's BOS is
        prepended, without (a piece inside a canvas) it is not. Special-token text in
        ``text`` stays text unless ``parse_special``."""
        return encode_text(self.hf, text, add_special_tokens, self.parse_special)

    @property
    def renders_tools(self) -> bool:
        """The chat template lists ``tools`` itself (Qwen-style templates do)."""
        template = getattr(self.hf, "chat_template", None)
        return isinstance(template, str) and "tools" in template

    def encode_chat(self, messages: Messages, tools: list[dict] | None = None) -> list[int]:
        if not self.has_chat_template:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        return encode_messages(self.hf, messages, self.parse_special, tools)

    def encode_prompt(self, prompt: str | Messages) -> list[int]:
        """A string is encoded as is; a list of {"role", "content"} dicts goes through the
        model's chat template with the assistant turn opened."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return self.encode(prompt)
        messages = validate_messages(prompt)
        return self.encode_chat(messages)

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    @staticmethod
    def check_prompt_ids(ids: Sequence[int], special: Any) -> None:
        """Refuse prompt ids the engine cannot take as given text: the mask id (a masked
        position is one the model is asked to fill, not part of the prompt; in a prompt it
        leaves the step nothing to compute). Raises ValueError naming the id."""
        if special.mask in ids:
            raise ValueError(f"prompt token ids must not contain {special.mask}, the model's "
                             "mask token: a prompt is given text, and masked positions are "
                             "what the model generates")

    def answer_ids(self, canvas: Sequence[int]) -> list[int]:
        """The generated ids before the first stop token (EOS/EoT) or mask."""
        stop = set(self.special.stop) | {self.special.mask}
        out = []
        for t in canvas:
            if t in stop:
                break
            out.append(t)
        return out


def encode_text(hf: Any, text: str, add_special_tokens: bool = True,
                parse_special: bool = False) -> list[int]:
    """``text``'s ids; special-token text in it is split into ordinary tokens (the
    tokenizer's ``split_special_tokens``) unless ``parse_special``."""
    return list(hf(text, add_special_tokens=add_special_tokens,
                   split_special_tokens=not parse_special)["input_ids"])


def encode_messages(hf: Any, messages: Messages, parse_special: bool = False,
                    tools: list[dict] | None = None) -> list[int]:
    """The chat template's ids for ``messages`` with the assistant turn opened. Content that
    spells a special token is encoded as text: the template is rendered around a stand-in
    for each content, its markup is tokenised as usual and each content as plain text."""
    messages = list(messages)
    spelled = [m for m in messages if _spells_special(hf, m.get("content"))]
    if parse_special or not spelled:
        return _template_ids(hf, messages, True, tools)
    nonce = secrets.token_hex(8)
    stand_ins = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
    markup = _template_ids(hf, [{**m, "content": s} for m, s in zip(messages, stand_ins)],
                           False, tools)
    pieces = re.split(f"\ue000{nonce}:(\\d+)\ue001", markup)   # markup, index, markup, ...
    ids: list[int] = []
    for k, piece in enumerate(pieces):
        if k % 2:
            ids += encode_text(hf, messages[int(piece)]["content"], add_special_tokens=False)
        elif piece:
            ids += encode_text(hf, piece, add_special_tokens=False, parse_special=True)
    return ids


def _template_ids(hf: Any, messages: list, tokenize: bool, tools: list[dict] | None = None
                  ) -> Any:
    out = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize,
                                 tools=tools)
    if tokenize and (isinstance(out, dict) or hasattr(out, "keys")):
        out = out["input_ids"]
    return list(out) if tokenize else out


def _spells_special(hf: Any, text: Any) -> bool:
    return isinstance(text, str) and any(t in text for t in hf.all_special_tokens)


check_prompt_ids = Tokenizer.check_prompt_ids   # for callers with a stand-in tokenizer


def validate_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'content'")
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"messages[{i}].role must be system, user or assistant; got {role!r}")
        out.append({"role": role, "content": m["content"]})
    if out[-1]["role"] == "assistant":
        raise ValueError("the last message must not be from the assistant")
    return out


def _load_hf_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as first:   # e.g. a tokenizer class that needs remote code
        tok_file = model_dir / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"no usable tokenizer in {model_dir}: {first}") from None
        extra = {}
        cfg_file = model_dir / "tokenizer_config.json"
        if cfg_file.is_file():
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
            extra = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "mask_token",
                                         "chat_template") if isinstance(cfg.get(k), str)}
        return PreTrainedTokenizerFast(tokenizer_file=str(tok_file), **extra)


def _token_id(hf: Any, names: Sequence[str]) -> int | None:
    vocab = hf.get_vocab()
    for name in names:
        if name in vocab:
            return int(vocab[name])
    return None


def _known_id(config: Any, known_ids: dict[str, int], kind: str, model_dir: Path
              ) -> int | None:
    """The family's known id of ``kind``, checked against the model's vocabulary size."""
    known = known_ids.get(kind)
    vocab = getattr(config, "vocab_size", None)
    if known is not None and vocab is not None and not 0 <= known < vocab:
        raise ModelLoadError(f"{model_dir}: the family's known {kind} id {known} is outside "
                             f"the model's vocabulary of {vocab}; set {kind}_token_id in "
                             "config.json")
    return known


def _special_ids(hf: Any, config: Any, model_dir: Path, known_ids: dict[str, int]
                 ) -> SpecialIds:
    mask = getattr(config, "mask_token_id", None)
    if mask is None:
        mask = hf.mask_token_id if hf.mask_token_id is not None else _token_id(hf, MASK_NAMES)
    if mask is None:
        mask = _known_id(config, known_ids, "mask", model_dir)
    if mask is None:
        raise ModelLoadError(f"{model_dir}: no mask token: set mask_token_id in config.json "
                             "or mask_token in tokenizer_config.json")
    eos = hf.eos_token_id if hf.eos_token_id is not None else getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0]
    if eos is None:
        eos = _known_id(config, known_ids, "eos", model_dir)
    if eos is None:
        raise ModelLoadError(f"{model_dir}: no EOS token in the tokenizer or config")
    eot = getattr(config, "eot_token_id", None)
    if eot is None:
        eot = _token_id(hf, EOT_NAMES)
    pad = hf.pad_token_id if hf.pad_token_id is not None else eos
    return SpecialIds(mask=int(mask), eos=int(eos), pad=int(pad),
                      eot=None if eot is None else int(eot))
