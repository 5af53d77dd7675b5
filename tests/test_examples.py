"""The playground's example prompts are ones the shipped model answers correctly.

Every task example (``sort: ...``, ``add: ...``) in assets/examples.json is run through the
shipped celeris-tiny with the settings of the tab that offers it, and its answer is checked
against the exact solution; the model was trained on lists of 3-8 single digits and sums of
1-2 digit numbers, so an example outside that (``add: 417 + 93``) would show a wrong answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from celeris import Engine
from celeris.synthetic.tasks import TASKS, solve
from ui.chat import _preset
from ui.examples import examples

TINY = Path(__file__).resolve().parent.parent / "models" / "celeris-tiny"


def task_of(prompt: str) -> str | None:
    head = prompt.partition(":")[0].strip()
    return head if head in TASKS else None


def task_examples() -> list[tuple[str, str]]:
    """(tab, prompt) of every task example the UI offers."""
    out = [("playground", e["prompt"]) for e in examples("playground")]
    out += [("chat", p) for p in examples("chat")]
    return [(tab, p) for tab, p in out if task_of(p)]


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(str(TINY), device="cpu")


def test_every_tab_offers_task_examples_inside_the_training_range():
    found = task_examples()
    assert {tab for tab, _ in found} == {"playground", "chat"}
    for _, prompt in found:
        body = prompt.partition(":")[2].replace("+", " ").split()
        limit = 99 if task_of(prompt) == "add" else 9
        assert all(0 <= int(x) <= limit for x in body), prompt


@pytest.mark.parametrize("tab,prompt", task_examples())
def test_the_shipped_model_answers_each_task_example(engine, tab, prompt):
    params = engine.default_params()
    if tab == "chat":       # the Chat tab's defaults: the fast preset, 64 tokens
        params = params.replace(gen_length=64, **_preset("fast", 64))
    result = engine.generate([{"role": "user", "content": prompt}], params)
    assert result.text.strip() == solve(task_of(prompt), prompt)
