"""CLI tests: argparse wiring, option mapping and dispatch (with small fakes, in
milliseconds), then what a user sees from real ``python -m celeris`` subprocesses: bad ports, a
busy port, an unreachable --url, help that agrees with the code, eval's table, quiet redirects.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from celeris import cli

ROOT = Path(__file__).resolve().parents[1]


def _parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


# ----------------------------------------------------------------------- argparse level
def test_unknown_subcommand_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_missing_subcommand_exits_2():
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2


def test_bad_option_type_exits_2():
    with pytest.raises(SystemExit) as exc:
        cli.main(["generate", "--prompt", "x", "--gen-length", "many"])
    assert exc.value.code == 2


def test_help_works_without_engine(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["generate", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--gen-length", "--remasking", "--cache", "--stop", "--chat", "--json"):
        assert flag in out


def test_generation_overrides_only_given_options():
    args = _parse("generate", "--prompt", "hi", "--gen-length", "64", "--temperature", "0.5")
    assert cli.generation_overrides(args) == {"gen_length": 64, "temperature": 0.5}


def test_generation_overrides_empty_and_repeatable_stop():
    assert cli.generation_overrides(_parse("generate", "--prompt", "hi")) == {}
    args = _parse("generate", "--prompt", "hi", "--stop", "\n\n", "--stop", "END",
                  "--cache", "prefix", "--seed", "0", "--top-k", "0")
    assert cli.generation_overrides(args) == {"stop": ["\n\n", "END"], "cache": "prefix",
                                              "seed": 0, "top_k": 0}


def test_eval_shares_generation_options():
    args = _parse("eval", "--block-length", "16", "--decoding", "threshold",
                  "--threshold", "0.8")
    assert cli.generation_overrides(args) == {"block_length": 16, "decoding": "threshold",
                                              "threshold": 0.8}


def test_generation_options_are_generation_params_fields():
    from celeris.params import GenerationParams

    every = ["--gen-length", "8", "--steps", "8", "--block-length", "8", "--temperature", "0",
             "--top-p", "1", "--top-k", "0", "--remasking", "margin", "--decoding", "fixed",
             "--threshold", "0.9", "--factor", "1", "--cache", "none", "--cfg-scale", "0",
             "--seed", "1", "--stop", "x"]
    overrides = cli.generation_overrides(_parse("generate", "--prompt", "p", *every))
    assert len(overrides) == len(every) // 2
    assert set(overrides) <= set(GenerationParams.field_names())
    GenerationParams().replace(**overrides)  # the mapped values validate


# ----------------------------------------------------------------------- lazy subcommands
def test_dispatch_passes_namespace(monkeypatch):
    seen = {}
    fake = types.ModuleType("celeris.server")
    fake.main = lambda args: seen.update(vars(args)) or 0
    monkeypatch.setitem(sys.modules, "celeris.server", fake)
    assert cli.main(["serve", "--port", "8123", "--api-key", "k", "--max-queue", "4"]) == 0
    assert seen["port"] == 8123 and seen["host"] == "127.0.0.1"
    assert seen["api_key"] == "k" and seen["max_queue"] == 4 and seen["max_running"] is None
    assert seen["drain_timeout"] is None and seen["request_timeout"] is None
    assert cli.main(["serve", "--drain-timeout", "2.5", "--request-timeout", "9"]) == 0
    assert (seen["drain_timeout"], seen["request_timeout"]) == (2.5, 9.0)


def test_bench_and_batch_options(monkeypatch):
    seen = []
    for name in ("celeris.bench", "celeris.batch"):
        fake = types.ModuleType(name)
        fake.main = lambda args: seen.append(args) or 0
        monkeypatch.setitem(sys.modules, name, fake)
    assert cli.main(["bench", "--suite", "quick", "--json", "r.json", "--html", "r.html"]) == 0
    assert cli.main(["batch", "in.jsonl", "--output", "o", "--errors", "e", "--concurrency", "3",
                     "--skip-invalid"]) == 0
    bench, batch = seen
    assert (bench.suite, bench.json, bench.html) == ("quick", "r.json", "r.html")
    assert (batch.input, batch.output, batch.errors, batch.concurrency) == ("in.jsonl", "o",
                                                                          "e", 3)
    assert batch.skip_invalid and not batch.restart


# ----------------------------------------------------------------------- train / eval
def _fake_module(monkeypatch, module, **functions):
    fake = types.ModuleType(module)
    for name, fn in functions.items():
        setattr(fake, name, fn)
    monkeypatch.setitem(sys.modules, module, fake)


def test_train_dispatch(monkeypatch, capsys):
    calls = []

    def train(**kwargs):
        calls.append(kwargs)
        return {"steps": 10, "val_loss": 4.123456, "history": [1, 2]}

    _fake_module(monkeypatch, "celeris.train", train=train)
    assert cli.main(["train", "--out", "models/x", "--steps", "15", "--kind", "ar"]) == 0
    assert calls == [{"out": "models/x", "steps": 15, "device": "cpu",
                      "resume": False, "seed": 0, "kind": "ar", "preset": None,
                      "init_from": None}]
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "steps=10" in out and "val_loss=4.123" in out
    assert cli.main(["train", "--out", "models/y", "--steps", "40", "--init-from", "models/x",
                     "--lr", "1e-3"]) == 0
    assert calls[-1] == {"out": "models/y", "steps": 40, "device": "cpu",
                         "resume": False, "seed": 0, "kind": "diffusion", "preset": None,
                         "init_from": "models/x", "lr": 1e-3}
    assert cli.main(["train", "--out", "models/z", "--steps", "40", "--mix", "story=0.4",
                     "--semi-ar-prob", "0.5"]) == 0
    assert calls[-1]["mix"] == "story=0.4" and calls[-1]["semi_ar_prob"] == 0.5
    assert "lr" not in calls[-1]


def test_eval_dispatch_table_and_json(monkeypatch, capsys):
    calls = []
    report = {"tasks": {"arith": 0.75, "copy": {"accuracy": 1.0}}, "masked_loss": 3.5}

    def evaluate(**kwargs):
        calls.append(kwargs)
        return report

    _fake_module(monkeypatch, "celeris.evals.evaluate", evaluate=evaluate)
    assert cli.main(["eval", "--model", "m", "--limit", "5", "--gen-length", "32"]) == 0
    assert calls[0] == {"model": "m", "kind": "diffusion", "overrides": {"gen_length": 32},
                        "limit": 5, "device": "auto", "second_sample": False}
    table = capsys.readouterr().out
    assert "arith" in table and "0.75" in table and "copy" in table and "3.5" in table
    assert cli.main(["eval", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report
    assert cli.main(["eval", "--second-sample", "--limit", "200"]) == 0
    assert calls[-1]["second_sample"] is True and calls[-1]["limit"] == 200


def test_eval_user_error_returns_2(monkeypatch, capsys):
    def evaluate(**kwargs):
        raise FileNotFoundError("no model at nowhere/")

    _fake_module(monkeypatch, "celeris.evals.evaluate", evaluate=evaluate)
    assert cli.main(["eval", "--model", "nowhere/"]) == 2
    assert capsys.readouterr().err.strip() == "error: no model at nowhere/"


# ----------------------------------------------------------------------- generate (fake engine)
class _FakeResult:
    text = "there was a cat"

    def to_dict(self):
        return {"text": self.text, "token_ids": [1, 2], "finish_reason": "eos", "nfe": 4}


class _FakeEngine:
    calls: list = []

    @classmethod
    def from_pretrained(cls, model, device="auto", dtype="auto"):
        if model == "missing":
            raise FileNotFoundError("model directory not found: missing")
        cls.calls.append(("load", model, device, dtype))
        return cls()

    def default_params(self):
        from celeris.params import GenerationParams

        return GenerationParams(gen_length=64, block_length=16)

    def generate(self, prompt, params):
        self.calls.append(("generate", prompt, params))
        return _FakeResult()


@pytest.fixture
def fake_engine(monkeypatch):
    import celeris

    _FakeEngine.calls = []
    monkeypatch.setattr(celeris, "Engine", _FakeEngine, raising=False)
    return _FakeEngine


def test_generate_plain(fake_engine, capsys):
    assert cli.main(["generate", "--prompt", "Once", "--temperature", "0.5"]) == 0
    assert capsys.readouterr().out == "there was a cat\n"
    load, gen = fake_engine.calls
    assert load == ("load", None, "auto", "auto")
    assert gen[1] == "Once"
    assert (gen[2].gen_length, gen[2].block_length, gen[2].temperature) == (64, 16, 0.5)


def test_generate_chat_json(fake_engine, capsys):
    assert cli.main(["generate", "--model", "m", "--prompt", "Hi", "--chat", "--json",
                     "--device", "cpu", "--dtype", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["finish_reason"] == "eos"
    assert fake_engine.calls[0] == ("load", "m", "cpu", "float32")
    assert fake_engine.calls[1][1] == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("argv,needle", [
    (["--gen-length", "-3"], "gen_length"),
    (["--gen-length", "40", "--steps", "7"], "steps"),   # 3 blocks of 16: 7 is not a multiple
    (["--remasking", "bogus"], "remasking"),
    (["--model", "missing"], "model directory not found"),
])
def test_generate_user_errors(fake_engine, capsys, argv, needle):
    assert cli.main(["generate", "--prompt", "x", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err


def test_generate_celeris_error(monkeypatch, capsys):
    import celeris

    error_type = getattr(celeris, "CelerisError", ValueError)

    class Broken:
        @classmethod
        def from_pretrained(cls, *a, **k):
            raise error_type("checkpoint is corrupt")

    monkeypatch.setattr(celeris, "Engine", Broken, raising=False)
    assert cli.main(["generate", "--prompt", "x"]) == 2
    assert capsys.readouterr().err.strip() == "error: checkpoint is corrupt"


def test_train_rejects_a_bad_mix_or_semi_ar_prob_with_the_field_named(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli.main(["train", "--out", str(out), "--steps", "2", "--mix", "story=-2"]) != 0
    err = capsys.readouterr().err
    assert "mix: story must be a finite weight >= 0" in err and "Traceback" not in err
    assert cli.main(["train", "--out", str(out), "--steps", "2", "--semi-ar-prob", "2"]) != 0
    err = capsys.readouterr().err
    assert "semi_ar_prob must be in [0, 0.75]" in err and "Traceback" not in err
    assert not (out / "tokenizer.json").exists()


# ----------------------------------------------------------------------- real subprocesses
def _celeris(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "celeris", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.tiny_model import make_tiny_model_dir
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("cli-model")))


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_serve_refuses_a_port_outside_1_to_65535_with_exit_2(tmp_path, port):
    done = _celeris("serve", "--model", str(tmp_path / "unused"), "--port", port, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: --port must be in [1, 65535], got {port}"


def test_serve_on_a_busy_port_exits_1_with_one_line_naming_a_free_port(tiny_model):
    with socket.socket() as busy, socket.socket() as next_busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:                         # the port after it taken too: the hint must skip it
            next_busy.bind(("127.0.0.1", port + 1))
            next_busy.listen()
        except OSError:
            pass
        done = _celeris("serve", "--model", tiny_model, "--port", str(port), "--device", "cpu",
                        timeout=60)
        (line,) = done.stderr.strip().splitlines()
        suggested = int(line.rsplit("--port ", 1)[1])
        with socket.socket() as probe:              # free when the hint was given
            probe.bind(("127.0.0.1", suggested))
    assert done.returncode == 1, done.stderr
    assert line.startswith(f"error: port {port} is already in use on 127.0.0.1; start on "
                           "another one with --port ")
    assert suggested not in (port, port + 1)


def test_batch_url_with_nothing_listening_says_so_in_one_line_before_validating(tmp_path):
    src = tmp_path / "in.jsonl"     # its model field would make validation ask the server
    src.write_text(json.dumps({"id": "a", "prompt": "x", "model": "m"}) + "\n")
    url = f"http://127.0.0.1:{_free_port()}"
    done = _celeris("batch", str(src), "--url", url, "--max-retries", "0", timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach the server at {url}")
    assert "check that it is running" in lines[0]


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc", "http://[::1", "http://h:1:2",
                                 "http://h:0", "localhost:8000"])
def test_batch_url_that_is_no_url_is_one_line_naming_url(tmp_path, url):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
    done = _celeris("batch", str(src), "--url", url, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: --url must be http(s)://HOST[:PORT]") and repr(url) in line


@pytest.mark.parametrize("command", [("generate", "--prompt", "x"), ("serve",),
                                     ("bench", "--suite", "decode")])
def test_a_missing_local_model_is_said_so_not_looked_up_on_the_hub(command):
    done = _celeris(*command, "--model", "models/nope", timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: --model models/nope: no such local directory")
    assert "huggingface-cli" not in line
    assert "download OWNER/nope" in line or "snapshot_download('OWNER/nope'" in line


def test_bench_help_names_every_suite_and_the_block_length_rule():
    from celeris.bench import SUITES

    text = " ".join(_celeris("bench", "--help", timeout=60).stdout.split())
    for name in SUITES:
        assert name in text.rsplit("--suite SUITE", 1)[1].split("--json", 1)[0], name
    assert "block length (32); a block-causal model runs at its own block size unless this " \
           "divides it" in text


def test_remasking_help_names_each_value_the_error_accepts():
    from celeris.params import GenerationParams

    with pytest.raises(ValueError) as exc:
        GenerationParams(remasking="nope")
    accepted = str(exc.value).split("one of ", 1)[1].split(";", 1)[0].split(", ")
    text = " ".join(_celeris("generate", "--help", timeout=60).stdout.split())
    remasking = text.rsplit("--remasking REMASKING", 1)[1].split("--decoding", 1)[0]
    assert all(name in remasking for name in accepted), (accepted, remasking)


def test_eval_prints_a_table_of_task_n_accuracy_time_and_the_mean(tiny_model):
    done = _celeris("eval", "--model", tiny_model, "--limit", "2", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].split() == ["task", "n", "accuracy", "time"]
    rows = [line.split() for line in lines[1:] if line.split()[0] not in ("mean",)
            and not line.startswith(("-", "masked_loss"))]
    assert len(rows) >= 5 and all(r[1] == "2" and r[-1] == "s" for r in rows), rows
    mean = next(line.split() for line in lines if line.startswith("mean"))
    assert mean[1] == str(2 * len(rows))
    assert float(mean[2]) == pytest.approx(sum(float(r[2]) for r in rows) / len(rows),
                                           abs=1e-3)


def test_bench_progress_is_plain_lines_when_its_output_is_redirected(tiny_model):
    """A log file gets whole lines (no carriage-return redraws), and none with --no-progress."""
    argv = ("bench", "--suite", "invariance", "--model", tiny_model, "--n", "1",
            "--gen-length", "8", "--block-length", "8", "--device", "cpu", "--threads", "1")
    done = _celeris(*argv)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr + done.stdout and "req/s" not in done.stderr
    assert "bench invariance: started (suite 1 of 1)" in done.stderr.splitlines()
    quiet = _celeris(*argv, "--no-progress")
    assert quiet.returncode == 0 and "bench invariance:" not in quiet.stderr

