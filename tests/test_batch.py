"""Batch jobs: validation with line numbers, durable appends, resume after SIGKILL, retries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from celeris import GenerationParams, cli
from celeris.batch.jobs import read_jobs, resolve_params, stable_seed
from celeris.batch.store import meta_path
from tests.test_bench_fixture import one_thread, tiny_model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
N_JOBS = 8


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("batch-model") / "m")


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _jobs(n: int = N_JOBS) -> list[dict]:
    """Alternating formats, greedy and sampled (seeds from the ids), 32 one-token steps."""
    out = []
    for i in range(n):
        knobs = {"gen_length": 32, "block_length": 8, "steps": 32, "early_stop": False,
                 "temperature": 0.0 if i % 2 else 0.9}
        if i % 2:
            out.append({"custom_id": f"job-{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [
                            {"role": "user", "content": f"copy: {i} {i + 1}"}], **knobs}})
        else:
            out.append({"id": f"job-{i}", "prompt": f"Story number {i}:", **knobs})
    return out


def _records(path: Path) -> list[dict]:
    """Output lines without what legitimately differs between runs (clock times)."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n") or not raw, "a partial last line was left behind"
    out = []
    for line in raw.decode().splitlines():
        rec = json.loads(line)
        body = (rec.get("response") or {}).get("body") or {}
        body.pop("created", None)
        body.get("celeris", {}).pop("elapsed_s", None)
        out.append(rec)
    return out


def _batch(*argv: str) -> int:
    return cli.main(["batch", *argv, "--device", "cpu"])


# ---------------------------------------------------------------------- validation
def test_validation_names_every_bad_line_and_generates_nothing(tmp_path, model, capsys):
    src = _write(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}, "{not json",
        {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        {"id": "t", "prompt": "x", "temperature": -1}, {"prompt": "no id"},
        {"id": "u", "prompt": "x", "temprature": 0.5}, "",
        {"id": "long", "prompt": "x", "gen_length": 4096, "block_length": 32}])
    out = tmp_path / "out.jsonl"
    assert _batch(str(src), "--output", str(out), "--model", str(model)) == 2
    err = capsys.readouterr().err
    for expected in ("line 2: duplicate id 'a' (first on line 1)", "line 3: malformed JSON",
                     "line 4: url must be one of", "line 5: temperature must be in",
                     "line 6: id must be a non-empty string",
                     "line 7: unknown parameter 'temprature': not supported by this server",
                     "line 9: prompt (", "exceeds the model's context"):
        assert expected in err, err
    assert "line 1:" not in err and not out.exists()


def test_one_bad_line_with_skip_invalid_completes_the_rest(tmp_path, model, capsys):
    lines = _jobs(3) + ['{"id": "broken", "prompt": ']
    src = _write(tmp_path / "in.jsonl", lines)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    assert _batch(str(src), "--output", str(out), "--errors", str(err), "--model", str(model),
                  "--skip-invalid") == 1                         # 1: something failed
    summary = capsys.readouterr().out
    assert "total 4, completed 3, failed 1" in summary
    done, failed = _records(out), _records(err)
    assert len(done) + len(failed) == 4
    assert failed[0]["line"] == 4 and "malformed JSON" in failed[0]["error"]["message"]
    assert {r["custom_id"] for r in done} == {"job-0", "job-1", "job-2"}
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in done)
    chat = next(r for r in done if r["custom_id"] == "job-1")["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"]
    usage = chat["usage"]
    assert usage["completion_tokens"] <= 32
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # a rerun finds everything done (the invalid line included) and writes nothing new
    assert _batch(str(src), "--output", str(out), "--errors", str(err), "--model", str(model),
                  "--skip-invalid") == 1
    assert "already done before this run 4" in capsys.readouterr().out
    assert len(_records(out)) == 3 and len(_records(err)) == 1


def test_seeds_come_from_the_id_unless_the_line_gives_one():
    base = GenerationParams(block_length=8, gen_length=16)
    p1 = resolve_params({"temperature": 0.5}, base, "abc")
    p2 = resolve_params({"temperature": 0.5}, base, "abc")
    p3 = resolve_params({"temperature": 0.5}, base, "abd")
    p4 = resolve_params({"seed": 7}, base, "abc")
    assert p1.seed == p2.seed == stable_seed("abc") != p3.seed and p4.seed == 7
    p5 = resolve_params({"max_tokens": 24}, base, "x")     # the cap, as the server maps it
    assert (p5.gen_length, p5.steps) == (24, None)


def test_both_formats_parse_into_the_same_job_shape(tmp_path):
    src = _write(tmp_path / "in.jsonl", _jobs(2))
    jobs, invalid, total = read_jobs(src, GenerationParams())
    assert (len(jobs), invalid, total) == (2, [], 2)
    assert jobs[0].endpoint == "/v1/completions" and jobs[0].prompt == "Story number 0:"
    assert jobs[1].endpoint == "/v1/chat/completions" and jobs[1].is_chat
    assert jobs[1].overrides["steps"] == 32 and "model" not in jobs[1].overrides


def test_chat_lines_with_tools_record_their_calls_as_the_server_answers(tmp_path, capsys):
    """tools / tool_choice / parallel_tool_calls on a chat line (both formats) go through the
    server's ToolPlan on the shipped model: ``required`` gives calls whose arguments validate
    and finish_reason "tool_calls"; a named function without parallel calls gives that one
    call; a plain line beside them is unchanged; tool_choice without tools is refused."""
    import jsonschema

    from celeris import EXAMPLE_TOOLS

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in EXAMPLE_TOOLS}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    src = _write(tmp_path / "in.jsonl", [
        {"custom_id": "required", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": ask, "tools": EXAMPLE_TOOLS, "tool_choice": "required",
                  "max_tokens": 96}},
        {"id": "named", "messages": ask, "tools": EXAMPLE_TOOLS, "max_tokens": 96,
         "tool_choice": {"type": "function", "function": {"name": "add"}},
         "parallel_tool_calls": False},
        {"id": "plain", "messages": ask, "max_tokens": 8},
        {"id": "no-tools", "messages": ask, "tool_choice": "required"}])
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    assert _batch(str(src), "--output", str(out), "--errors", str(err), "--skip-invalid",
                  "--model", str(ROOT / "models" / "celeris-tiny-bd")) == 1   # the refusal
    (refused,) = _records(err)
    assert refused["custom_id"] == "no-tools" and refused["line"] == 4
    assert "tool_choice 'required' needs tools" in refused["error"]["message"]
    answers = {r["custom_id"]: r["response"]["body"]["choices"][0] for r in _records(out)}
    for cid in ("required", "named"):
        answer = answers[cid]
        assert answer["finish_reason"] == "tool_calls", answer
        calls = answer["message"]["tool_calls"]
        assert calls and answer["message"]["content"] is None
        for call in calls:
            assert call["type"] == "function" and call["id"].startswith("call_")
            jsonschema.validate(json.loads(call["function"]["arguments"]),
                                schemas[call["function"]["name"]])
    assert [c["function"]["name"] for c in answers["named"]["message"]["tool_calls"]] == ["add"]
    plain = answers["plain"]
    assert "tool_calls" not in plain["message"] and isinstance(plain["message"]["content"], str)
    assert plain["finish_reason"] in ("stop", "length")


# ---------------------------------------------------------------------- resume
def test_changed_input_is_refused_unless_restart(tmp_path, model, capsys):
    src = _write(tmp_path / "in.jsonl", _jobs(2))
    out = tmp_path / "out.jsonl"
    assert _batch(str(src), "--output", str(out), "--model", str(model)) == 0
    assert json.loads(meta_path(out).read_text())["input_sha256"]
    _write(src, _jobs(3))
    assert _batch(str(src), "--output", str(out), "--model", str(model)) == 2
    assert "the input changed" in capsys.readouterr().err
    assert _batch(str(src), "--output", str(out), "--model", str(model), "--restart") == 0
    assert [r["custom_id"] for r in _records(out)] == ["job-0", "job-1", "job-2"]


def _line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _run_until(args: list[str], out: Path, lines: int) -> int:
    """Start a batch subprocess and SIGKILL it once ``out`` holds ``lines`` lines."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "celeris", "batch", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while proc.poll() is None and _line_count(out) < lines and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode


def test_sigkill_at_several_points_then_resume_equals_an_uninterrupted_run(tmp_path, model):
    src = _write(tmp_path / "in.jsonl", _jobs())
    reference = tmp_path / "reference.jsonl"
    common = ["--model", str(model), "--concurrency", "2", "--device", "cpu"]
    assert cli.main(["batch", str(src), "--output", str(reference), *common]) == 0
    out = tmp_path / "out.jsonl"
    args = [str(src), "--output", str(out), *common]
    codes = [_run_until(args, out, lines) for lines in (1, 3, 5)]
    assert codes.count(-signal.SIGKILL) >= 2, codes            # really killed mid-run
    with open(out, "ab") as f:                                  # a write torn by the kill
        f.write(b'{"id": "batch_req_torn", "custom_id": "job-')
    assert _run_until(args, out, 10**6) == 0                    # resume to the end
    got, want = _records(out), _records(reference)
    assert [r["custom_id"] for r in got] == [f"job-{i}" for i in range(N_JOBS)]
    assert got == want


# ---------------------------------------------------------------------- remote
class _FlakyServer(BaseHTTPRequestHandler):
    """429 with Retry-After, then 503, then success; 'bad' ids get a 400."""

    calls: dict[str, int] = {}

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = json.dumps(body.get("messages") or body.get("prompt"))
        n = self.calls[key] = self.calls.get(key, 0) + 1
        if "bad" in key:
            return self._send(400, {"error": {"message": "nope"}})
        if n == 1:
            return self._send(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"})
        if n == 2:
            return self._send(503, {"error": {"message": "busy"}})
        self._send(200, {"object": "text_completion", "seed": body["seed"],
                         "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                   "total_tokens": 5}})

    def _send(self, code, payload, headers=None):
        data = json.dumps(payload).encode()
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky_url():
    _FlakyServer.calls = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_remote_retries_429_and_5xx_and_fails_fast_on_400(tmp_path, flaky_url, capsys):
    src = _write(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(3)]
                 + [{"id": "x", "prompt": "bad"}])
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    assert cli.main(["batch", str(src), "--output", str(out), "--errors", str(err), "--url",
                     flaky_url, "--concurrency", "3"]) == 1
    assert "completed 3, failed 1, already done before this run 0, retried 6, tokens 6" in \
        capsys.readouterr().out
    done = {r["custom_id"]: r for r in _records(out)}
    assert done["r0"]["response"]["body"]["seed"] == stable_seed("r0")
    failed = _records(err)[0]
    assert failed["response"]["status_code"] == 400 and "HTTP 400" in failed["error"]["message"]


class _BusyServer(_FlakyServer):
    """503 (retryable) while ``busy``; 400 for 'bad' prompts; serves model 'm' only."""

    busy = True
    auth: list[str] = []

    def do_GET(self):  # noqa: N802
        self._send(200, {"object": "list", "data": [{"id": "m", "object": "model",
                                                     "created": 0, "owned_by": "x"}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.auth.append(self.headers.get("Authorization"))
        if "bad" in body["prompt"]:
            return self._send(400, {"error": {"message": "nope"}})
        if self.busy:
            return self._send(503, {"error": {"message": "busy"}}, {"Retry-After": "0"})
        self._send(200, {"object": "text_completion", "seed": body["seed"],
                         "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                   "total_tokens": 5}})


@pytest.fixture
def busy_url():
    _BusyServer.busy = True
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BusyServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_retryable_failures_are_tried_again_on_resume_and_final_ones_are_not(
        tmp_path, busy_url, capsys, monkeypatch):
    monkeypatch.setenv("CELERIS_API_KEY", "env-key")      # not on the command line (ps)
    _BusyServer.auth = []
    src = _write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "p1"}, {"id": "b", "prompt": "p2"},
                                         {"id": "x", "prompt": "bad"}])
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    args = ["batch", str(src), "--output", str(out), "--errors", str(err), "--url", busy_url,
            "--max-retries", "0"]
    assert cli.main(args) == 1
    assert "completed 0, failed 3" in capsys.readouterr().out
    first = {r["custom_id"]: r["error"] for r in _records(err)}
    assert first["a"]["retryable"] and first["b"]["retryable"]
    assert first["x"]["retryable"] is False
    _BusyServer.busy = False
    assert cli.main(args) == 1                      # x still failed for good
    summary = capsys.readouterr().out
    assert "completed 2, failed 1, already done before this run 1" in summary
    assert sorted(r["custom_id"] for r in _records(out)) == ["a", "b"]
    assert cli.main(args) == 1 and "already done before this run 3" in capsys.readouterr().out
    assert set(_BusyServer.auth) == {"Bearer env-key"}


def test_out_of_memory_in_process_retries_smaller_then_records_a_retryable_503():
    from celeris.batch.jobs import Job
    from celeris.batch.runners import LocalRunner, output_record

    class OutOfMemoryEngine:
        batches: list[int] = []

        def default_params(self):
            return GenerationParams(gen_length=8, block_length=8)

        def info(self):
            return {"model": "m"}

        def generate_batch(self, prompts, params, ids):
            self.batches.append(len(prompts))
            raise MemoryError("no room for the KV cache")

    engine = OutOfMemoryEngine()
    jobs = [Job(i + 1, f"j{i}", "/v1/completions", "p", {}) for i in range(3)]
    outcomes = LocalRunner(engine).run(jobs)
    assert engine.batches == [3, 1, 1, 1]                  # the batch, then one row at a time
    assert [o.status for o in outcomes] == [503] * 3
    record = output_record(outcomes[0])
    assert record["error"]["retryable"] and "out of memory" in record["error"]["message"]


def test_body_model_is_checked_like_the_server_does(tmp_path, model, busy_url, capsys):
    lines = [{"id": "ok", "prompt": "x", "model": "m", "max_tokens": 32},
             {"custom_id": "gpt", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "x", "model": "gpt-4"}}]
    src = _write(tmp_path / "in.jsonl", lines)
    for where in (["--model", str(model), "--device", "cpu"], ["--url", busy_url]):
        assert cli.main(["batch", str(src), "--output", str(tmp_path / "o.jsonl"), *where]) == 2
        err = capsys.readouterr().err
        assert "line 2: model 'gpt-4' does not exist; this server serves 'm'" in err, err
        assert "line 1:" not in err


def test_ray_flags_without_ray_installed_say_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)               # import ray -> ImportError
    src = _write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}])
    # a directory that is no model: Ray is checked before the model is loaded
    assert cli.main(["batch", str(src), "--ray", "--model", str(tmp_path)]) == 2
    assert "pip install -r requirements-ray.txt" in capsys.readouterr().err
    assert cli.main(["serve", "--ray", "--model", str(tmp_path)]) == 2
    assert "pip install -r requirements-ray.txt" in capsys.readouterr().err
