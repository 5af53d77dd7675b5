"""Constrained decoding for a masked diffusion model: the answer read left to right is always a
prefix the grammar accepts.

A diffusion step proposes tokens for every masked position of the unit at once and commits
several, in any order. Under a grammar (a JSON schema, a regex, a choice list or an EBNF
grammar, compiled by xgrammar), a row of the batch commits differently:

1. the **frontier**, the leftmost masked position of the answer, gets the grammar's token mask
   before the tokens are chosen, so it always holds an allowed token and is always committed:
   every step commits at least one token;
2. the positions after it keep the model's unconstrained proposals; those the step would have
   committed anyway are kept while, read in order from the frontier, the grammar accepts them
   (the longest valid run); the rest stay masked and are proposed again next step;
3. where the grammar then forces the next tokens (a key of a fixed-order object, a closing
   brace, the rest of a choice), they are committed at once, without a forward
   (jump-forward), inside the current unit; the step's event lists them as written by the
   grammar.

The row finishes at the grammar's end: its stop token (EOS) is the only continuation the
grammar allows once the value is complete, and a committed stop token ends the request with
"stop"; the length cap ends it with "length", the value then incomplete. Unconstrained rows
of the same forward are untouched: the mask is applied to one position of each constrained
row, never built for the whole batch. xgrammar was chosen over llguidance for its
``find_jump_forward_tokens`` and its schema, regex and EBNF front ends in one CPU-ready wheel.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

class Grammars:
    """One engine's grammar compiler (compiled grammars cached by their source)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> None:
        import xgrammar as xgr
        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(stop_ids))
        self.vocab_size = info.vocab_size
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=True)

    def compile(self, kind: str, spec: str) -> Any:
        """A compiled grammar, or ValueError naming what is wrong with ``spec``."""
        c = self.compiler
        try:
            if kind == "json":
                schema = json.loads(spec)
                return c.compile_json_schema(schema if isinstance(schema, str) else
                                             json.dumps(schema), any_whitespace=False)
            if kind == "json_object":      # an object, as OpenAI's json_object promises
                return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return c.compile_regex(spec)
            if kind == "choice":
                choices = json.loads(spec)
                return c.compile_regex("|".join(_literal(str(x)) for x in choices))
            if kind == "structural_tag":   # JSON inside it compact, as for "json"
                return c.compile_structural_tag(json.dumps(self._compact(json.loads(spec))))
            return c.compile_grammar(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            what = {"json": "JSON schema", "json_object": "JSON object grammar",
                    "regex": "regex", "choice": "choice list", "grammar": "grammar",
                    "structural_tag": "structural tag"}[kind]
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            first = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", first)   # the C++ source location
            raise ValueError(f"structured output: the {what} is not supported: "
                             f"{first[:300]}") from None

    def _compact(self, node: Any) -> Any:
        """A structural tag with each json_schema part as the grammar of its compact JSON
        (xgrammar's structural tags otherwise allow any whitespace between tokens, which a
        small model fills with newlines)."""
        if isinstance(node, list):
            return [self._compact(x) for x in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "json_schema" and "json_schema" in node:
            grammar = self._xgr.Grammar.from_json_schema(json.dumps(node["json_schema"]),
                                                         any_whitespace=False)
            return {"type": "grammar", "grammar": str(grammar)}
        return {k: self._compact(v) for k, v in node.items()}

    def row(self, kind: str, spec: str) -> "GrammarRow":
        return GrammarRow(self._xgr.GrammarMatcher(self.compile(kind, spec)), self)


def _literal(text: str) -> str:
    """``text`` as a regex that matches it literally."""
    return "".join("\\" + ch if ch in r"\.^$|?*+()[]{}/" else ch for ch in text)


@dataclass(eq=False)
class GrammarRow:
    """One request's grammar state: what it has accepted so far."""

    matcher: Any
    grammars: Grammars
    _bitmask: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return bool(self.matcher.is_terminated())

    def mask_logits(self, logits: torch.Tensor) -> None:
        """Keep only the tokens the grammar allows next in ``logits`` (V,), in place."""
        xgr = self.grammars._xgr
        if self._bitmask is None:
            self._bitmask = xgr.allocate_token_bitmask(1, self.grammars.vocab_size)
        self.matcher.fill_next_token_bitmask(self._bitmask)
        row = logits[None, : self.grammars.vocab_size]
        mask = self._bitmask.to(logits.device, non_blocking=True)
        if row.dtype == torch.float32:
            xgr.apply_token_bitmask_inplace(row, mask)
        else:                              # the CPU kernel takes float32 only
            masked = row.float()
            xgr.apply_token_bitmask_inplace(masked, mask)
            row.copy_(masked)
        logits[self.grammars.vocab_size:] = float("-inf")

    def settle(self, ids: list[float], take: list[float], conf: list[float], frontier: int,
               masked: Sequence[bool]) -> tuple[list[float], list[float], list[float],
                                                 list[int]]:
        """The unit's commits under the grammar: from column ``frontier`` on, the taken
        proposals the grammar accepts in order (the frontier always), then the tokens it
        forces into the masked columns after them; nothing else. Returns (ids, take, conf,
        columns the grammar wrote)."""
        out = [0.0] * len(take)
        j = frontier
        while j < len(ids) and masked[j] and (j == frontier or take[j]):
            if not self.matcher.accept_token(int(ids[j])):
                break
            out[j] = 1.0
            j += 1
            if self.done:
                return ids, out, conf, []
        forced: list[int] = []
        if j > frontier:
            for token in self.matcher.find_jump_forward_tokens():
                if j >= len(ids) or not masked[j] or not self.matcher.accept_token(token):
                    break
                ids[j], out[j], conf[j] = float(token), 1.0, 1.0
                forced.append(j)
                j += 1
        return ids, out, conf, forced
