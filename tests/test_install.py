"""``pip install -e .`` (what launch.sh/launch.bat run) gives a ``celeris`` command that works
from any directory, not only from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_editable_install_gives_a_celeris_command_that_works_anywhere(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)   # pip and setuptools come from deps.pth
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    # the test venv's packages (torch, ...) without installing them again
    (Path(site.stdout.strip()) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run([str(py), "-m", "pip", "install", "--no-deps",
                              "--no-build-isolation", "--no-index", "-q", "-e", str(ROOT)],
                             capture_output=True, text=True, env=env, timeout=300)
    assert install.returncode == 0, install.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for argv in ([str(env_dir / "bin" / "celeris"), "batch", "--help"],
                 [str(py), "-m", "celeris", "batch", "--help"]):
        run = subprocess.run(argv, capture_output=True, text=True, cwd=elsewhere, env=env,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        assert "--max-retries" in run.stdout and "usage: celeris batch" in run.stdout
    assert sys.executable != str(py)
