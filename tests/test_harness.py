"""lm-evaluation-harness against a real ``celeris serve``: a generation task through
``local-chat-completions`` equals ``celeris eval`` on the same problems, and a multiple-choice
task through ``local-completions`` (loglikelihood: echo + logprobs) ranks the right answer
first far more often than chance. The task files in the repository are the writer's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import celeris
from celeris.evals.evaluate import evaluate
from celeris.evals.harness import DATA, HERE, write_tasks
from celeris.server import create_app
from tests.live_server import live_server

import lm_eval  # noqa: E402  (a test dependency: requirements-dev.txt)
ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "celeris-tiny-bd"


def _render():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(MODEL)
    return lambda messages: tok.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=True)


def test_the_committed_task_files_are_the_writers_output(tmp_path):
    write_tasks(tmp_path, _render(), data=f"celeris/evals/harness/{DATA}")
    for path in sorted(tmp_path.iterdir()):
        assert (HERE / path.name).read_text(encoding="utf-8") == \
            path.read_text(encoding="utf-8"), path.name
    docs = [json.loads(line) for line in (HERE / DATA).read_text().splitlines()]
    assert len(docs) == 600 and {d["task"] for d in docs} == {
        "copy", "reverse", "sort", "add", "max", "count"}
    assert all(d["context"].endswith("<|assistant|>\n") for d in docs)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    engine = celeris.Engine.from_pretrained(MODEL, device="cpu")
    try:
        with live_server(create_app(engine)) as url:
            yield engine, url
    finally:
        engine.stop()


def _run(tmp_path, monkeypatch, model, model_args, task, limit, **kw):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = write_tasks(tmp_path / "tasks", _render(), limit=limit)
    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task],
                                  task_manager=lm_eval.tasks.TaskManager(
                                      include_path=str(tasks)), **kw)
    return out["results"][task]


def test_generation_task_equals_celeris_eval(served, tmp_path, monkeypatch):
    engine, url = served
    limit = 3                                             # problems per task
    got = _run(tmp_path, monkeypatch, "local-chat-completions",
               f"base_url={url}/v1/chat/completions,model={MODEL.name},max_retries=1",
               "celeris_gen", limit, apply_chat_template=True)
    assert got["sample_len"] == 6 * limit
    want = evaluate(engine, limit=limit)
    assert got["exact_match,none"] == pytest.approx(want["mean_accuracy"])


def test_multiple_choice_task_ranks_the_answer_first(served, tmp_path, monkeypatch):
    engine, url = served
    got = _run(tmp_path, monkeypatch, "local-completions",
               f"base_url={url}/v1/completions,model={MODEL.name},tokenizer={MODEL},"
               f"tokenizer_backend=huggingface,max_retries=1", "celeris_mc", 6)
    assert got["sample_len"] == 12
    assert got["acc,none"] >= 0.5           # chance: 0.1 (ten digits)
