"""Batch jobs' errors (celeris/batch), in process and against a real server: a line whose
forward fails is recorded alone and the job goes on, a line means the same in process and with
``--url``, and a refused parameter or a prompt past the context is reported in the server's
words."""

from __future__ import annotations

import json

import pytest

import celeris
from celeris import cli
from celeris.server import create_app
from tests.live_server import live_server
from tests.server_fixtures import CONTEXT, engine, metric, model_dir, wait_for  # noqa: F401





def test_in_process_batch_records_a_line_that_fails_alone_and_goes_on(
        tmp_path, model_dir, monkeypatch, capsys):
    load = celeris.Engine.from_pretrained.__func__

    def with_fault(cls, *args, **kwargs):   # a forward over a long input fails
        engine = load(cls, *args, **kwargs)
        engine.model.register_forward_pre_hook(_refuse_long_inputs)
        return engine

    monkeypatch.setattr(celeris.Engine, "from_pretrained", classmethod(with_fault))
    lines = [{"id": "a", "prompt": "short"}, {"id": "b", "prompt": "long " * 40},
             {"id": "c", "prompt": "short too"}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    code = cli.main(["batch", str(src), "--output", str(out), "--errors", str(err),
                     "--model", str(model_dir), "--device", "cpu", "--concurrency", "1"])
    assert code == 1
    assert "completed 2, failed 1" in capsys.readouterr().out
    assert sorted(json.loads(x)["custom_id"] for x in out.read_text().splitlines()) == ["a", "c"]
    failed = [json.loads(x) for x in err.read_text().splitlines()]
    assert [r["custom_id"] for r in failed] == ["b"]
    assert "RuntimeError: input too long" in failed[0]["error"]["message"]


def _refuse_long_inputs(module, args):
    if args and args[0].shape[-1] > 40:
        raise RuntimeError("input too long")


def _batch_lines() -> list[dict]:
    return [{"custom_id": "greedy", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": "x", "first_token": "greedy", "gen_length": 8}},
            {"id": "simple", "prompt": "y", "gen_length": 8, "block_length": 8}]


def test_a_batch_line_means_the_same_in_process_and_with_url(tmp_path, engine, model_dir,
                                                             capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in _batch_lines()))
    with live_server(create_app(engine, warmup=False)) as url:
        for name, where in (("local", ["--model", str(model_dir), "--device", "cpu"]),
                            ("remote", ["--url", url])):
            out = tmp_path / f"{name}.jsonl"
            assert cli.main(["batch", str(src), "--output", str(out), *where]) == 0, \
                capsys.readouterr()
            records = [json.loads(x) for x in out.read_text().splitlines()]
            assert {r["custom_id"] for r in records} == {"greedy", "simple"}
            assert all(r["response"]["status_code"] == 200 for r in records)


def test_batch_refuses_what_the_server_refuses_with_the_servers_words(tmp_path, model_dir,
                                                                      capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "t", "prompt": "x", "temprature": 0.5}) + "\n")
    assert cli.main(["batch", str(src), "--model", str(model_dir), "--device", "cpu"]) == 2
    assert "line 1: unknown parameter 'temprature': not supported by this server" in \
        capsys.readouterr().err


def test_context_errors_keep_the_servers_code_remotely_and_say_max_tokens_locally(
        tmp_path, engine, model_dir, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "big", "prompt": "the quick brown fox " * 20,
                               "max_tokens": 200}) + "\n")
    assert cli.main(["batch", str(src), "--model", str(model_dir), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "+ max_tokens (200) =" in err and "max_tokens can be at most" in err
    assert "gen_length" not in err
    errors = tmp_path / "err.jsonl"
    with live_server(create_app(engine, warmup=False)) as url:
        assert cli.main(["batch", str(src), "--url", url, "--output", str(tmp_path / "o.jsonl"),
                         "--errors", str(errors)]) == 1
    record = json.loads(errors.read_text().splitlines()[0])
    assert record["error"]["code"] == "context_length_exceeded"
    assert record["error"]["retryable"] is False
