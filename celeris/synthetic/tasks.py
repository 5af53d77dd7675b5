"""Checkable tasks with exact answers, for training and evaluating the shipped tiny models.

Every task is digit-level text sized for what a 15M-parameter model learns within one CPU
hour: list items are single digits (one token each) and addends have at most two digits.

    copy: 4 1 9 2        -> 4 1 9 2
    reverse: 4 1 9 2     -> 2 9 1 4
    sort: 4 1 9 2        -> 1 2 4 9
    add: 47 + 85         -> 132
    max: 4 1 9 2         -> 9
    count: 4 1 9 2       -> 4

A problem belongs to the eval split when a stable hash (sha256) of its prompt falls in one
bucket out of ``EVAL_BUCKETS``; both splits are drawn by rejection from the same generator, so
an eval problem never occurs in training data.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

TASKS: tuple[str, ...] = ("copy", "reverse", "sort", "add", "max", "count")
SPLITS: tuple[str, ...] = ("train", "eval")

EVAL_BUCKETS = 16          # 1/16 of all problems are reserved for evaluation
EVAL_SEED = 1234           # the fixed seed of the published eval sets
EVAL_N = 100               # eval problems per task

LIST_MIN, LIST_MAX = 3, 8  # list length for the list tasks
ITEM_MAX = 9               # list items are 0..ITEM_MAX (single digits)
ADD_DIGITS = 2             # addends have 1..ADD_DIGITS digits


@dataclass(frozen=True)
class Example:
    """One problem: ``prompt`` is the user message, ``answer`` the exact expected reply."""

    task: str
    prompt: str
    answer: str

    def messages(self) -> list[dict[str, str]]:
        """The prompt as a chat (one user message)."""
        return [{"role": "user", "content": self.prompt}]


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")


def split_of(prompt: str) -> str:
    """'eval' or 'train' for a problem, by a stable hash of its prompt text."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % EVAL_BUCKETS == 0 else "train"


def _join(xs: list[int]) -> str:
    return " ".join(str(x) for x in xs)


_SOLVERS = {"copy": _join, "reverse": lambda xs: _join(xs[::-1]),
            "sort": lambda xs: _join(sorted(xs)), "max": lambda xs: str(max(xs)),
            "count": lambda xs: str(len(xs))}


def solve(task: str, prompt: str) -> str:
    """The exact answer of a prompt (parses the prompt; used to build and to check examples)."""
    _check_task(task)
    head, _, body = prompt.partition(":")
    if head.strip() != task:
        raise ValueError(f"prompt {prompt!r} is not a {task!r} problem")
    if task == "add":
        a, _, b = body.partition("+")
        return str(int(a) + int(b))
    return _SOLVERS[task]([int(t) for t in body.split()])


def random_prompt(task: str, rng: random.Random) -> str:
    """One random problem of a task (either split)."""
    _check_task(task)
    if task == "add":
        # Mix magnitudes so that short sums and carries both occur often.
        a = rng.randint(0, 10 ** rng.randint(1, ADD_DIGITS) - 1)
        b = rng.randint(0, 10 ** rng.randint(1, ADD_DIGITS) - 1)
        return f"add: {a} + {b}"
    n = rng.randint(LIST_MIN, LIST_MAX)
    xs = [rng.randint(0, ITEM_MAX) for _ in range(n)]
    return f"{task}: {_join(xs)}"


def random_example(task: str, rng: random.Random, split: str = "train") -> Example:
    """A random example of ``task`` whose problem belongs to ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    while True:
        prompt = random_prompt(task, rng)
        if split_of(prompt) == split:
            return Example(task, prompt, solve(task, prompt))


def make_examples(task: str, n: int, seed: int = 0, split: str = "train") -> list[Example]:
    """``n`` examples of ``task`` from ``split``, deterministic for ``seed``.

    Eval examples are distinct problems; train examples may repeat (the space is large).
    """
    _check_task(task)
    rng = random.Random(f"celeris-task:{task}:{seed}:{split}")
    out: list[Example] = []
    seen: set[str] = set()
    while len(out) < n:
        ex = random_example(task, rng, split)
        if split == "eval":
            if ex.prompt in seen:
                continue
            seen.add(ex.prompt)
        out.append(ex)
    return out


def eval_examples(task: str, n: int = EVAL_N, seed: int = EVAL_SEED) -> list[Example]:
    """The fixed held-out eval set of a task (100 problems by default)."""
    return make_examples(task, n, seed, "eval")


SECOND_SEED = 4321         # the seed of the second held-out sample (``second_examples``)


def second_examples(task: str, n: int = EVAL_N) -> list[Example]:
    """A second held-out sample of a task, disjoint from ``eval_examples``: a choice made by
    looking at the fixed eval set is confirmed on problems that played no part in it."""
    fixed = {ex.prompt for ex in eval_examples(task)}
    pool = make_examples(task, n + len(fixed), SECOND_SEED, "eval")
    out = [ex for ex in pool if ex.prompt not in fixed][:n]
    if len(out) < n:
        raise ValueError(f"the eval split of {task} holds fewer than {n} problems outside "
                         f"the fixed set")
    return out


def score(task: str, prediction: str, answer: str) -> bool:
    """Exact match after stripping surrounding whitespace."""
    _check_task(task)
    return prediction.strip() == answer.strip()
