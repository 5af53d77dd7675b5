"""What to tell a user next, checked on this machine now: a model path that does not exist,
the download command that is installed, a port that is free.

Standard library only, so the CLI, app.py and the model loader can all use it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

PORT_RANGE = (1, 65535)


# ---------------------------------------------------------------------- models
def looks_local(text: str) -> bool:
    """Whether ``--model TEXT`` names a local path rather than a hub id (OWNER/NAME): it
    starts with '.', '/' or '~', has more than one separator, or its parent directory exists
    (``models/nope``)."""
    if text.startswith((".", "/", "~", "\\")) or (len(text) > 1 and text[1] == ":"):
        return True
    if text.count("/") + text.count("\\") > 1:
        return True
    parent = Path(text).expanduser().parent
    return str(parent) not in ("", ".") and parent.is_dir()


def missing_model_dir(text: str, flag: str = "--model") -> str | None:
    """Why ``text`` cannot be a model directory (a local-looking path that is not a
    directory), or None: a hub id, or a directory whose files the loader then checks."""
    path = Path(text).expanduser()
    if path.is_dir() or not looks_local(text):
        return None
    if path.exists():
        return (f"{flag} {text} is a file; it takes a model directory (config.json, "
                "weights, tokenizer)")
    name = path.name or "MODEL"
    return (f"{flag} {text}: no such local directory. A model from the Hugging Face Hub "
            f"goes by its id (OWNER/NAME), or download it first: "
            f"{download_hint('OWNER/' + name, text)}")


def download_hint(repo_id: str, local_dir: str | None = None) -> str:
    """The command that downloads ``repo_id`` into ``local_dir`` (default models/NAME) with
    what this machine has: the ``hf`` CLI of huggingface_hub, else a python one-liner, else
    the pip install that provides it."""
    target = local_dir or f"models/{repo_id.split('/')[-1]}"
    hf = _installed_command("hf")
    if hf:
        return f"`{hf} download {repo_id} --local-dir {target}`"
    python = Path(sys.executable).name or "python"
    one_liner = (f"`{python} -c \"from huggingface_hub import snapshot_download; "
                 f"snapshot_download('{repo_id}', local_dir='{target}')\"`")
    if importlib.util.find_spec("huggingface_hub") is None:
        return f"`pip install huggingface_hub`, then {one_liner}"
    return one_liner


def _installed_command(name: str) -> str | None:
    """``name`` when it is on PATH, else its path beside this Python (a venv not activated)."""
    if shutil.which(name):
        return name
    beside = Path(sys.executable).parent / (name + (".exe" if os.name == "nt" else ""))
    if beside.is_file() and os.access(beside, os.X_OK):
        try:
            short = os.path.relpath(beside)
        except ValueError:            # another drive (Windows)
            return str(beside)
        return short if not short.startswith("..") else str(beside)
    return None


# ---------------------------------------------------------------------- ports
def port_problem(port: object) -> str | None:
    """Why ``port`` cannot be listened on, by its number alone, or None. Port 0 is refused
    too: the operating system would pick one that a printed address could not name."""
    low, high = PORT_RANGE
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= high:
        return f"--port must be in [{low}, {high}], got {port!r}"
    return None


def port_free(host: str, port: int) -> bool:
    """Whether (host, port) can be bound right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def free_port(host: str, near: int) -> int:
    """A port that is free on ``host`` now: the first of the 100 after ``near`` that binds,
    else one the operating system picks."""
    low, high = PORT_RANGE
    for port in range(max(low, near + 1), min(high, near + 100) + 1):
        if port_free(host, port):
            return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return s.getsockname()[1]
