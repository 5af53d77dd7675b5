"""launch.sh and app.py as a user starts them, in real processes: --help answers at once in a
fresh copy (nothing installed, no .venv made), a port outside 1-65535 is one line naming
--port, and a busy port gets a suggestion that is free now."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``argv`` in its own process group, killed whole (pip included) if it overruns."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("GRADIO_SERVER_PORT", None)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv)} still running after {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture
def fresh_copy(tmp_path):
    """launch.sh, app.py and the requirements in a folder with no .venv."""
    for name in ("launch.sh", "app.py", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_launch_help_answers_at_once_without_installing(fresh_copy, flag):
    done = _run(["bash", "launch.sh", "--model", "x", flag], fresh_copy, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ./launch.sh")
    assert "--port N" in done.stdout and "--host ADDR" in done.stdout
    assert not (fresh_copy / ".venv").exists()


def test_launch_help_names_only_options_app_py_has(fresh_copy, capsys):
    import app

    text = _run(["bash", "launch.sh", "--help"], fresh_copy, timeout=20).stdout
    named = set(re.findall(r"^\s+(--[a-z-]+)", text, re.MULTILINE))
    assert {"--port", "--host", "--model", "--api-key"} <= named
    with pytest.raises(SystemExit):
        app.parse_args(["--help"])
    options = set(re.findall(r"--[a-z-]+", capsys.readouterr().out))
    assert named <= options, named - options


@pytest.mark.parametrize("args", [["--port", "99999"], ["--port=0"], ["--port", "abc"]])
def test_launch_refuses_a_port_outside_the_range_before_installing(fresh_copy, args):
    done = _run(["bash", "launch.sh", *args], fresh_copy, timeout=20)
    value = args[-1].split("=")[-1]
    assert done.returncode == 2
    assert done.stderr.strip() == f"[celeris] error: --port must be in [1, 65535], got {value}"
    assert "Traceback" not in done.stderr and not (fresh_copy / ".venv").exists()


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_app_refuses_a_port_outside_1_to_65535_in_one_line(port):
    """Port 0 is refused too: the operating system would pick a port that the address app.py
    and launch.sh print could not name."""
    done = _run([sys.executable, "app.py", "--port", port], ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: --port must be in [1, 65535], got {port}"


def test_app_on_a_busy_port_suggests_one_that_is_free_now():
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen()
        port = a.getsockname()[1]
        b.bind(("127.0.0.1", port + 1))                # the next one is taken as well
        b.listen()
        done = _run([sys.executable, "app.py", "--port", str(port)], ROOT, timeout=120)
        assert done.returncode == 1, done.stderr
        (line,) = done.stderr.strip().splitlines()
        suggested = int(re.search(r"--port (\d+)$", line).group(1))
        assert line.startswith(f"error: port {port} is already in use on 127.0.0.1")
        assert suggested not in (port, port + 1)
        with socket.socket() as c:
            c.bind(("127.0.0.1", suggested))           # free indeed


def test_app_says_a_missing_local_model_does_not_exist_before_any_download():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    done = _run([sys.executable, "app.py", "--model", "models/nope", "--port", port], ROOT,
                timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: --model models/nope: no such local directory")
    assert "huggingface-cli" not in line


def test_readme_says_how_to_move_the_playground_to_another_port_or_interface():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "./launch.sh --port" in quick_start and "--host" in quick_start
    assert "./launch.sh --help" in quick_start
