"""``python -m celeris space DIR``: the folder runs as a Space would run it, and --push offline
fails with a message that says what to do."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from celeris import cli, space
from celeris.engine import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def space_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("space") / "celeris-space"
    assert cli.main(["space", str(folder)]) == 0
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_folder_holds_the_app_the_packages_the_model_and_valid_front_matter(space_dir):
    for name in ("app.py", "celeris/engine/llm_engine.py", "ui/__init__.py", "assets"):
        assert (space_dir / name).exists(), name
    for model in ("celeris-tiny-bd", "celeris-tiny", "celeris-tiny-ar"):   # default, infill, twin
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            assert (space_dir / "models" / model / name).is_file(), (model, name)
    assert not list(space_dir.rglob("__pycache__")) and not (space_dir / "tests").exists()
    readme = (space_dir / "README.md").read_text()
    assert all(f"`{m}`" in readme for m in ("celeris-tiny-bd", "celeris-tiny", "celeris-tiny-ar"))
    matter = yaml.safe_load(readme.split("---\n")[1])
    pinned = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.startswith("gradio==")]
    assert matter["sdk"] == "gradio" and matter["app_file"] == "app.py"
    assert pinned == [f"gradio=={matter['sdk_version']}"]
    requirements = (space_dir / "requirements.txt").read_text().splitlines()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in requirements
    assert "torch==2.13.0" in requirements


def test_the_space_app_starts_and_serves_the_playground_and_v1_models(space_dir):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CELERIS_API_KEY")}
    env.update(GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port))
    where = subprocess.run([sys.executable, "-c", "import celeris, ui; print(celeris.__file__,"
                            " ui.__file__)"], cwd=space_dir, env=env, capture_output=True,
                           text=True, check=True).stdout
    assert where.count(str(space_dir)) == 2, where            # the folder's own copies
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=space_dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                # /ready, not /health: the model routes answer 503 until the warm-up ran
                if _get(f"http://127.0.0.1:{port}/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        status, page = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and b"gradio" in page.lower()
        status, body = _get(f"http://127.0.0.1:{port}/v1/models")
        # the id is the folder name of the model app.py loads by default
        assert status == 200 and json.loads(body)["data"][0]["id"] == DEFAULT_MODEL.name
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_push_offline_fails_with_a_clear_message_and_keeps_the_folder(space_dir, monkeypatch,
                                                                      capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["space", str(space_dir), "--push", "someone/celeris"]) == 2
    err = capsys.readouterr().err
    assert "cannot push to the Space someone/celeris: offline mode is on" in err
    assert f"The folder is ready at {space_dir}" in err
    assert (space_dir / "app.py").is_file()


def test_push_to_an_unreachable_hub_names_the_endpoint(tmp_path, monkeypatch):
    from huggingface_hub import constants
    folder = space.assemble(tmp_path / "s")
    endpoint = f"http://127.0.0.1:{_free_port()}"                 # nothing listens there
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    with pytest.raises(ValueError, match=f"could not push to the Space a/b at {endpoint}"):
        space.push(folder, "a/b")


def test_a_folder_the_command_did_not_make_is_never_overwritten(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert cli.main(["space", str(mine)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me"
