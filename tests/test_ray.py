"""Ray Data batch jobs and Ray Serve replicas on a local Ray started here (2 CPUs, no dashboard).

One Ray for the whole module (starting it costs seconds): the batch tests run first, then the
Serve test deploys two replicas on the same two CPUs. Ray is an optional dependency
(requirements-ray.txt); ./launch.sh test installs it, so these tests run in CI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from celeris import cli
from tests.test_batch import _line_count, _records, _write
from tests.test_bench_fixture import one_thread, tiny_model_dir  # noqa: F401

ray = pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-ray.txt")

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
N_JOBS = 24


@pytest.fixture(scope="module")
def ray_address():
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield context.address_info["gcs_address"]
    from ray import serve
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("ray-model") / "m")


def _jobs() -> list[dict]:
    """Both line formats, greedy and sampled (seeds from the ids), 64 one-token steps."""
    out = []
    for i in range(N_JOBS):
        knobs = {"gen_length": 64, "block_length": 8, "steps": 64, "early_stop": False,
                 "temperature": 0.0 if i % 3 else 0.8}
        if i % 2:
            out.append({"custom_id": f"job-{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "user", "content": f"copy {i}"}],
                                 **knobs}})
        else:
            out.append({"id": f"job-{i}", "prompt": f"Story number {i}:", **knobs})
    return out


@pytest.fixture(scope="module")
def batch_input(tmp_path_factory, model):
    """(input file, the in-process output records of an uninterrupted run)."""
    folder = tmp_path_factory.mktemp("ray-batch")
    src = _write(folder / "in.jsonl", _jobs())
    reference = folder / "reference.jsonl"
    assert cli.main(["batch", str(src), "--output", str(reference), "--model", str(model),
                     "--device", "cpu"]) == 0
    return src, _by_id(_records(reference))


def _by_id(records: list[dict]) -> dict[str, dict]:
    ids = [r["custom_id"] for r in records]
    assert len(ids) == len(set(ids)), f"an id was written twice: {sorted(ids)}"
    return {r["custom_id"]: r for r in records}


# ---------------------------------------------------------------------- Ray Data batch
@pytest.mark.usefixtures("one_thread")
def test_ray_batch_over_two_actors_equals_the_in_process_batch(ray_address, model, batch_input,
                                                               tmp_path, capsys):
    src, reference = batch_input
    out = tmp_path / "out.jsonl"
    assert cli.main(["batch", str(src), "--output", str(out), "--model", str(model), "--device",
                     "cpu", "--ray", "--replicas", "2", "--concurrency", "4"]) == 0
    assert f"total {N_JOBS}, completed {N_JOBS}, failed 0" in capsys.readouterr().out
    got = _by_id(_records(out))
    assert sorted(got) == sorted(reference) and got == reference
    assert "ray" in json.loads(out.with_name(out.name + ".meta.json").read_text())


def _kill_when(args: list[str], out: Path, lines: int) -> tuple[int, int]:
    """Run a batch driver; SIGKILL it once ``out`` holds ``lines`` lines. (exit, lines then)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "celeris", "batch", *args], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 150
    while proc.poll() is None and _line_count(out) < lines and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode, _line_count(out)


@pytest.mark.usefixtures("one_thread")
def test_ray_batch_killed_mid_run_resumes_with_every_id_once(ray_address, model, batch_input,
                                                             tmp_path, capsys):
    src, reference = batch_input
    out = tmp_path / "out.jsonl"
    common = [str(src), "--output", str(out), "--model", str(model), "--device", "cpu",
              "--ray", "--concurrency", "1"]
    code, written = _kill_when([*common, "--address", ray_address], out, 2)
    assert code == -signal.SIGKILL, f"the driver was not killed mid-run (exit {code})"
    assert 2 <= written < N_JOBS, written
    with capsys.disabled():
        print(f"killed after {written} of {N_JOBS} records")
    with open(out, "ab") as f:                                   # a line torn by the kill
        f.write(b'{"id": "batch_req_torn", "custom_id": "job-')
    assert cli.main(["batch", *common]) == 0                     # resume on the same Ray
    assert f"already done before this run {written}" in capsys.readouterr().out
    assert _by_id(_records(out)) == reference


def test_ray_batch_flags_are_checked_before_anything_runs(tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}])
    assert cli.main(["batch", str(src), "--replicas", "2"]) == 2
    assert "--replicas only apply with --ray" in capsys.readouterr().err
    assert cli.main(["batch", str(src), "--ray", "--url", "http://x"]) == 2
    assert "--url (remote) cannot be combined" in capsys.readouterr().err


# ---------------------------------------------------------------------- Ray Serve
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replica_names() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::celeris#")}


def _replica_states() -> dict[str, int]:
    from ray import serve
    from celeris.server.ray_serve import APP_NAME, DEPLOYMENT_NAME
    app = serve.status().applications[APP_NAME]
    return dict(app.deployments[DEPLOYMENT_NAME].replica_states)


def _running() -> int:
    return _replica_states().get("RUNNING", 0)


@pytest.fixture(scope="module")
def serve_url(ray_address, model):
    from ray import serve
    from celeris.server import ray_serve
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = ray_serve.application(str(model), api_key="sekrit", replicas=2, device="cpu",
                                cpus_per_replica=1.0)
    serve.run(app, name=ray_serve.APP_NAME, route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.delete(ray_serve.APP_NAME)


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_ray_serve_answers_the_openai_client_on_two_replicas(serve_url):
    import openai
    client = openai.OpenAI(base_url=serve_url + "/v1", api_key="sekrit", max_retries=0)
    assert _get(serve_url + "/health") == (200, b'{"status":"ok"}')
    assert _get(serve_url + "/v1/models")[0] == 401                  # the same auth
    assert json.loads(_get(serve_url + "/v1/models", "sekrit")[1])["data"][0]["id"] == "m"
    done = client.completions.create(model="m", prompt="Once upon", max_tokens=8, seed=1)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.completion_tokens
    chat = client.chat.completions.create(model="m", max_tokens=8, seed=1,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(
        model="m", max_tokens=8, seed=1, stream=True,
        messages=[{"role": "user", "content": "hi"}]))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 2 and streamed == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="temperature"):   # the same errors
        client.completions.create(model="m", prompt="x", temperature=-1)
    assert b"celeris_" in _get(serve_url + "/metrics", "sekrit")[1]
    assert _running() == 2 and len(_replica_names()) == 2
    answered_by = {client.models.with_raw_response.list().headers["x-celeris-replica"]
                   for _ in range(20)}
    assert len(answered_by) == 2, f"requests were not spread over the replicas: {answered_by}"


def test_a_killed_replica_is_replaced_and_the_api_keeps_answering(serve_url):
    """Kill one replica's actor, keep calling; measure until Ray runs a new one."""
    import openai
    client = openai.OpenAI(base_url=serve_url + "/v1", api_key="sekrit", max_retries=0,
                           timeout=30)
    before = _replica_names()
    victim = sorted(before)[0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    start = time.monotonic()
    answered, failed, noticed, replaced = 0, [], None, None
    while time.monotonic() - start < 120:
        now = time.monotonic() - start
        try:
            client.completions.create(model="m", prompt="Once", max_tokens=4, seed=0)
            answered += 1
        except openai.OpenAIError as exc:
            failed.append((round(now, 2), type(exc).__name__))
        names, states = _replica_names(), _replica_states()
        if noticed is None and (victim not in names or states != {"RUNNING": 2}):
            noticed = time.monotonic() - start            # Serve starts a replacement
        if replaced is None and victim not in names and len(names) == 2 and \
                states == {"RUNNING": 2}:
            replaced = time.monotonic() - start
        if replaced is not None and time.monotonic() - start > replaced + 2:
            break
        time.sleep(0.05)
    report = {"noticed_s": None if noticed is None else round(noticed, 2),
              "replaced_s": None if replaced is None else round(replaced, 2),
              "requests_answered": answered, "requests_failed": len(failed),
              "failures_at_s": failed}
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "ray-serve-replacement.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"ray serve replica replacement: {report}")
    assert replaced is not None, f"no new replica within 120 s: {report}"
    assert answered >= 5, report
    assert all(at <= replaced for at, _ in failed), f"failures after the new replica: {report}"


def test_serve_flags_are_checked_before_ray_starts(capsys):
    from celeris.server.ray_serve import scaling
    assert scaling(None, None) == {"num_replicas": 2}
    assert scaling(None, "1:4")["autoscaling_config"] == {
        "min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
        "target_ongoing_requests": 4}
    for argv, message in (
            (["--gpus-per-replica", "1"], "--gpus-per-replica only apply with --ray"),
            (["--ray", "--autoscale", "3:1"], "needs 0 <= MIN <= MAX and MAX >= 1, got '3:1'"),
            (["--ray", "--autoscale", "two"], "--autoscale must be MIN:MAX"),
            (["--ray", "--replicas", "0"], "--replicas must be >= 1, got 0"),
            (["--ray", "--replicas", "2", "--autoscale", "1:3"], "either --replicas or"),
            (["--ray", "--device-map", "auto"], "--device-map do not apply with --ray")):
        assert cli.main(["serve", *argv]) == 2
        assert message in capsys.readouterr().err
