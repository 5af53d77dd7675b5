"""``celeris eval --second-sample``: a second held-out sample of the checkable tasks, disjoint
from the fixed eval set, to confirm a choice made by looking at the fixed one."""

from __future__ import annotations

import pytest

from celeris.synthetic import tasks


@pytest.mark.parametrize("task", tasks.TASKS)
def test_the_second_sample_is_held_out_disjoint_and_fixed(task):
    second = tasks.second_examples(task, 150)
    fixed = {ex.prompt for ex in tasks.eval_examples(task)}
    assert len(second) == 150 and len({ex.prompt for ex in second}) == 150
    assert not fixed & {ex.prompt for ex in second}
    assert all(tasks.split_of(ex.prompt) == "eval" for ex in second)
    assert [ex.prompt for ex in tasks.second_examples(task, 150)] == [ex.prompt for ex in second]
    ex = second[0]
    assert tasks.score(task, ex.answer, ex.answer)


def test_eval_scores_the_second_sample_and_says_so():
    from celeris.evals.evaluate import evaluate
    report = evaluate(kind="ar", limit=2, second_sample=True)
    prompts = {s["prompt"] for s in report["samples"]}
    assert report["problems"] == "second sample"
    assert prompts == {ex.prompt for t in tasks.TASKS for ex in tasks.second_examples(t, 2)}
    assert evaluate(kind="ar", limit=2)["problems"] == "fixed eval set"


def test_the_card_refuses_the_second_sample(capsys):
    from celeris.cli import main
    assert main(["eval", "--model", "models/celeris-tiny-bd", "--card",
                 "--second-sample"]) == 2
    assert "--card quotes the fixed eval set" in capsys.readouterr().err


def test_the_card_refuses_a_block_diffusion_model_before_evaluating(capsys, monkeypatch):
    """`eval --card` writes a full-canvas model's card (stories at block 32, infilling); on a
    block model it used to fail after the whole eval with "block_length must divide the
    model's block size 4"; it now refuses first, naming the model and what to do."""
    from celeris import cli
    calls = []
    monkeypatch.setattr("celeris.evals.evaluate.evaluate", lambda *a, **k: calls.append(a) or {})
    assert cli.main(["eval", "--model", "models/celeris-tiny-bd", "--card"]) == 2
    err = capsys.readouterr().err
    assert "models/celeris-tiny-bd is a block-diffusion model" in err and "drop --card" in err
    assert calls == []
    assert not cli._block_causal("models/celeris-tiny-ar")
    assert not cli._block_causal("no/such/dir")
