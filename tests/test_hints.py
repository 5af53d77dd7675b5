"""celeris.hints: what a user is told to do next holds on this machine now (a local path that
does not exist is not a hub id; the download command named is installed; the port is free)."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest

from celeris import hints

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text", ["models/nope", "./nope", "/abs/nope", "~/nope", "a/b/c",
                                  "..\\nope"])
def test_paths_that_look_local_are_not_hub_ids(text):
    assert hints.looks_local(text)


@pytest.mark.parametrize("text", ["GSAI-ML/LLaDA-8B-Instruct", "Dream-org/Dream-v0-Instruct-7B"])
def test_owner_slash_name_is_a_hub_id_when_no_such_folder_exists(text):
    assert not hints.looks_local(text) and hints.missing_model_dir(text) is None


def test_a_missing_local_model_says_so_and_names_an_installed_download_command(monkeypatch):
    monkeypatch.chdir(ROOT)
    why = hints.missing_model_dir("models/nope")
    assert why.startswith("--model models/nope: no such local directory")
    assert "huggingface-cli" not in why and "--local-dir models/nope" in why
    assert hints.missing_model_dir("models/celeris-tiny") is None          # it exists
    assert "is a file" in hints.missing_model_dir("models/celeris-tiny/config.json")


def test_the_download_hint_uses_the_hf_cli_when_installed_else_python(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/hf" if name == "hf" else None)
    assert hints.download_hint("org/m") == "`hf download org/m --local-dir models/m`"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))     # no hf beside it
    hint = hints.download_hint("org/m", "here")
    assert hint == ("`python3 -c \"from huggingface_hub import snapshot_download; "
                    "snapshot_download('org/m', local_dir='here')\"`")


def test_the_suggested_port_is_free_even_when_the_next_one_is_taken():
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen()
        port = a.getsockname()[1]
        try:
            b.bind(("127.0.0.1", port + 1))
            b.listen()
        except OSError:
            pass                                  # taken by someone else: taken either way
        suggested = hints.free_port("127.0.0.1", port)
        assert suggested not in (port, port + 1) and hints.port_free("127.0.0.1", suggested)


@pytest.mark.parametrize("port", [0, -1, 65536, True, "8000"])
def test_a_port_outside_1_to_65535_is_named_with_the_range(port):
    assert hints.port_problem(port) == f"--port must be in [1, 65535], got {port!r}"


def test_ports_1_and_65535_are_fine():
    assert hints.port_problem(1) is None and hints.port_problem(65535) is None
