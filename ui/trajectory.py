"""The record of one run: which position was committed at which step, with what confidence.

Built from the engine's StepEvents as they arrive; it drives the live canvas, the replay
scrubber, the charts and the JSON download. Pure Python (no Gradio, no torch), stored in a
``gr.State`` as a plain dict (``to_dict``/``from_dict``).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from celeris.outputs import GenerationResult, StepEvent

TokenText = Callable[[Sequence[int]], list[str]]   # ids -> one display string per id
Decode = Callable[[Sequence[int]], str]              # ids -> their text, decoded together
FRAGMENT = "\u2060"   # a token holding only part of a character: its text shows on the next

# Kinds of canvas positions (the CSS classes of the canvas cells). DRAFT: a token the sampler
# holds but has not accepted (DiffusionGemma's uniform-noise canvas; StepEvent.draft).
MASK, NEW, OLD, PINNED, SKIPPED, DRAFT = "mask", "new", "old", "pin", "skip", "draft"


@dataclass
class StepRecord:
    step: int
    block: int
    nfe: int
    elapsed: float
    committed: list[int]
    confidences: list[float]
    tokens: list[int]        # the ids committed, aligned with ``committed``
    text: str
    length: int = 0          # canvas positions after this step (a block-causal canvas grows)
    edited: list[int] = field(default_factory=list)   # of ``committed``: replaced a token
    texts: list[str] = field(default_factory=list)    # display strings, as ``committed``
    draft: list[int] = field(default_factory=list)    # positions holding a draft token
    draft_tokens: list[int] = field(default_factory=list)
    draft_texts: list[str] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)   # of ``committed``: the grammar wrote


@dataclass(frozen=True)
class Commit:
    """What a position holds after some step: committed at ``step`` with ``conf``, shown as
    ``text``; ``was``: the texts it held before, where token editing replaced them."""
    step: int
    conf: float
    text: str
    was: tuple[str, ...] = ()


@dataclass
class Trajectory:
    gen_length: int
    block_length: int
    mask_id: int = -1
    request_id: str = ""
    prompt: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    pinned: dict[int, int] = field(default_factory=dict)         # position -> token id
    steps: list[StepRecord] = field(default_factory=list)
    strings: dict[int, str] = field(default_factory=dict)        # position -> display string
    result: dict[str, Any] | None = None
    # a block-causal run: where each model block starts (its canvas grows a block at a time;
    # the first block ends where the prompt's last block does). Empty: blocks of block_length
    block_starts: list[int] = field(default_factory=list)
    # display strings of pinned text in front of the canvas: an infill's prompt (the text
    # before its first span), drawn as pinned cells so that the view shows the whole text
    lead: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ recording
    def add(self, ev: StepEvent, token_text: TokenText, decode: Decode | None = None) -> None:
        """Record one StepEvent; the first one also fixes the canvas geometry and pins.
        ``decode`` (ids decoded together) spells pinned runs whole, so that text outside
        ASCII, split over several byte-level tokens, is not shown as broken pieces."""
        if not self.steps and self.mask_id < 0:
            self._first_event(ev, token_text, decode)
        elif len(ev.canvas) > self.gen_length:   # block-causal: the canvas grows block by
            self.block_starts = self.block_starts or [0]   # block (gen_length is only a cap)
            self.block_starts.append(self.gen_length)
            self.gen_length = len(ev.canvas)
        tokens = [ev.canvas[p] for p in ev.committed]
        texts = token_text(tokens) if tokens else []
        for pos, s in zip(ev.committed, texts):
            self.strings[pos] = s
        draft = list(ev.draft)
        draft_tokens = [ev.canvas[p] for p in draft]
        self.steps.append(StepRecord(
            ev.step, ev.block, ev.nfe, ev.elapsed, list(ev.committed), list(ev.confidences),
            tokens, ev.text, len(ev.canvas), list(ev.edited), list(texts), draft,
            draft_tokens, token_text(draft_tokens) if draft else [], list(ev.forced)))

    def _first_event(self, ev: StepEvent, token_text: TokenText,
                     decode: Decode | None) -> None:
        self.mask_id, self.request_id = ev.mask_id, ev.request_id
        self.gen_length, self.block_length = len(ev.canvas), ev.block_length
        fresh = set(ev.committed) | set(ev.draft)
        self.pinned = {p: t for p, t in enumerate(ev.canvas) if t != ev.mask_id and p not in fresh}
        if decode is None:
            for (pos, _), s in zip(self.pinned.items(), token_text(list(self.pinned.values()))):
                self.strings[pos] = s
            return
        for run in runs(sorted(self.pinned)):
            ids = [self.pinned[p] for p in run]
            self.strings.update(zip(run, spell_whole(ids, decode, token_text)))

    def finish(self, result: GenerationResult) -> None:
        self.result = result.to_dict()

    # ------------------------------------------------------------------ queries
    @property
    def num_steps(self) -> int:
        return self.steps[-1].step if self.steps else 0

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def structured(self) -> bool:
        """The run decoded under a grammar (GenerationParams.structured was set)."""
        return bool(self.params.get("structured"))

    def block_of(self, pos: int) -> int:
        """The block ``pos`` lies in: the model's blocks of a block-causal run, else blocks of
        block_length."""
        if self.block_starts:
            return bisect_right(self.block_starts, pos) - 1
        return pos // max(self.block_length, 1)

    def starts_block(self, pos: int) -> bool:
        if self.block_starts:
            return pos in self.block_starts
        return pos % max(self.block_length, 1) == 0

    def length_at(self, step: int | None = None) -> int:
        """Canvas positions after ``step`` (None = the latest): a block-causal canvas had
        only its blocks so far (step 0: the first block)."""
        if step is None or not self.steps:
            return self.gen_length
        rec = self.record_at(step) or self.steps[0]
        return rec.length or self.gen_length

    def commit_steps(self) -> dict[int, tuple[int, float]]:
        """position -> (step it was last committed at, its confidence)."""
        return {pos: (c.step, c.conf) for pos, c in self.commits_upto().items()}

    def commits_upto(self, last: int | None = None) -> dict[int, Commit]:
        """position -> what it held after step ``last`` (None = the latest): an edited
        position holds its latest token, and the texts it replaced."""
        out: dict[int, Commit] = {}
        for rec in self.steps:
            if last is not None and rec.step > last:
                break
            edited = set(rec.edited)
            for i, (pos, conf) in enumerate(zip(rec.committed, rec.confidences)):
                text = rec.texts[i] if i < len(rec.texts) else self.strings.get(pos, "")
                before = out.get(pos)
                was = (*before.was, before.text) if before and pos in edited else ()
                out[pos] = Commit(rec.step, conf, text, was)
        return out

    def cells_at(self, step: int | None = None
                 ) -> list[tuple[str, str, float | None, tuple[str, ...]]]:
        """(kind, text, confidence, replaced texts) per position as it stood after ``step``
        (None = the latest; once finished, nothing counts as NEW there).

        Positions still masked, or holding a draft, when the run finished are SKIPPED: the
        run ended (EOS with early stop, or Stop) before they were needed or accepted.
        """
        last = self.num_steps if step is None else step
        fresh = last if not (step is None and self.finished) else -1
        commits = self.commits_upto(last)
        ended = self.finished and last >= self.num_steps
        rec = self.record_at(last)
        drafts = {} if ended or rec is None else dict(zip(rec.draft, rec.draft_texts))
        cells = []
        for pos in range(self.length_at(step)):
            if pos in self.pinned:
                cells.append((PINNED, self.strings.get(pos, ""), None, ()))
            elif pos in commits:
                c = commits[pos]
                cells.append((NEW if c.step == fresh else OLD, c.text, c.conf, c.was))
            elif pos in drafts:
                cells.append((DRAFT, drafts[pos], None, ()))
            else:
                cells.append((SKIPPED if ended else MASK, "", None, ()))
        return cells

    def forced_at(self, step: int | None = None) -> set[int]:
        """Positions whose token, as of ``step`` (None = the latest), the grammar wrote
        without the model choosing it (structured output's jump-forward)."""
        last = self.num_steps if step is None else step
        forced: set[int] = set()
        for rec in self.steps:
            if rec.step > last:
                break
            forced.difference_update(rec.committed)
            forced.update(rec.forced)
        return forced

    def forced_count(self) -> int:
        """Tokens of the whole run the grammar wrote."""
        return sum(len(rec.forced) for rec in self.steps)

    def state_at(self, step: int | None = None) -> list[tuple[str, str, float | None]]:
        """(kind, text, confidence) per position (``cells_at`` without the replaced texts)."""
        return [cell[:3] for cell in self.cells_at(step)]

    def edits_at(self, step: int) -> int:
        """How many tokens ``step`` replaced (token editing)."""
        rec = self.record_at(step)
        return len(rec.edited) if rec is not None and rec.step == step else 0

    def text_at(self, step: int | None = None) -> str:
        """The committed-prefix text after ``step`` (the final text when finished)."""
        if step is None or step >= self.num_steps:
            if self.result is not None:
                return self.result["text"]
            return self.steps[-1].text if self.steps else ""
        before = [r.text for r in self.steps if r.step <= step]
        return before[-1] if before else ""

    def record_at(self, step: int) -> StepRecord | None:
        found = [r for r in self.steps if r.step <= step]
        return found[-1] if found else None

    def filled_tokens(self) -> int:
        """Committed (never pinned) positions that hold text: what an infill generated."""
        return sum(1 for kind, text, _ in self.state_at() if kind in (NEW, OLD) and text)

    def canvas_ids(self) -> list[int | None]:
        """The token id of every position as it stands now (None where still masked)."""
        ids: list[int | None] = [self.pinned.get(p) for p in range(self.gen_length)]
        for rec in self.steps:
            for pos, tok in zip(rec.committed, rec.tokens):
                ids[pos] = tok
        return ids

    def answer_tokens(self, step: int | None = None) -> int:
        """Committed (non-pinned) positions before the first end-of-text cell (shown as "")."""
        count = 0
        for kind, text, _ in self.state_at(step):
            if kind in (NEW, OLD):
                if text == "":
                    break
                count += 1
        return count

    # ------------------------------------------------------------------ (de)serialising
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pinned"] = {str(k): v for k, v in self.pinned.items()}
        out["strings"] = {str(k): v for k, v in self.strings.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        data = dict(data)
        data["pinned"] = {int(k): v for k, v in data.get("pinned", {}).items()}
        data["strings"] = {int(k): v for k, v in data.get("strings", {}).items()}
        data["steps"] = [StepRecord(**s) for s in data.get("steps", [])]
        return cls(**data)


def lead_strings(ids: Sequence[int], token_text: TokenText, decode: Decode) -> list[str]:
    """Display strings of prompt ids shown in front of a canvas (``Trajectory.lead``):
    spelled whole (see spell_whole), special tokens (BOS, padding: "") left out."""
    return [s for s in spell_whole(list(ids), decode, token_text) if s != ""] if ids else []


def runs(positions: Sequence[int]) -> list[list[int]]:
    """Sorted positions split into runs of consecutive ones."""
    out: list[list[int]] = []
    for p in positions:
        if out and out[-1][-1] == p - 1:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def spell_whole(ids: Sequence[int], decode: Decode, token_text: TokenText) -> list[str]:
    """One display string per token of a run. Tokens that decode alone are kept as they
    are; where a token holds only part of a character (byte-level BPE: "\ufffd" alone),
    the pieces are decoded together: the tokens before the last show FRAGMENT and the one
    completing the character shows all of it."""
    singles = token_text(list(ids))
    if not any("\ufffd" in t for t in singles):
        return singles
    out: list[str] = []
    start = 0   # the first token of the character being completed
    for i in range(len(ids)):
        text = decode(list(ids[start: i + 1]))
        if text.endswith("\ufffd") and i + 1 < len(ids):
            out.append(FRAGMENT)
            continue
        out.append(text)
        start = i + 1
    return out
