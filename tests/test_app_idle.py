"""An idle playground costs no CPU: app.py, started for real with the shipped default model
and no browser connected, does nothing while nobody asks it anything (ui/idle.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.live_server import free_port

ROOT = Path(__file__).resolve().parents[1]
WINDOW_S = 10.0
# What a quiet process spends in 10 s here: the engine thread's and uvicorn's timed waits
# (a few wake-ups a second, ~0.01 s in all). Gradio's own queue polled every millisecond,
# which cost 0.4-0.5 s per 10 s on the same machine; 0.15 s leaves room for a loaded CI
# machine's slower wake-ups and still fails that polling by a factor of three.
IDLE_CPU_BOUND_S = 0.15


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "app.py did not become ready"
        time.sleep(0.25)


def test_the_idle_playground_uses_no_cpu_without_a_visitor():
    assert Path("/proc/self/stat").is_file(), "needs Linux /proc"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port),
                             "--device", "cpu"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        time.sleep(2.0)                      # let start-up work (imports, warm-up) settle
        before = cpu_seconds(proc.pid)
        time.sleep(WINDOW_S)
        used = cpu_seconds(proc.pid) - before
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert used < IDLE_CPU_BOUND_S, (f"app.py used {used:.2f} s of CPU in {WINDOW_S:.0f} s "
                                     "with no client connected")
