"""The Dockerfile, checked with the official parser (PyPI ``dockerfile``): no registry is
reachable here, so the image itself cannot be built; everything that can be read is checked."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

import pytest

dockerfile = pytest.importorskip("dockerfile", reason="pip install -r requirements-dev.txt")

ROOT = Path(__file__).resolve().parents[1]
BASES = ("cuda", "cpu")          # the values of ARG BASE the Dockerfile documents


@pytest.fixture(scope="module")
def commands():
    return dockerfile.parse_file(str(ROOT / "Dockerfile"))


def _stages(commands) -> dict[str, str]:
    """stage name -> the image (or stage) it starts FROM."""
    out = {}
    for c in commands:
        if c.cmd == "FROM":
            assert len(c.value) == 3 and c.value[1].upper() == "AS", c.original
            out[c.value[2]] = c.value[0]
    return out


def _arg_default(commands, name: str) -> str:
    for c in commands:
        if c.cmd == "ARG" and c.value[0].startswith(name + "="):
            return c.value[0].split("=", 1)[1]
    raise AssertionError(f"ARG {name} has no default")


def _pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition("/")[2].partition(":")
    return bool(name and tag) and tag != "latest"


def test_every_base_image_is_pinned_by_tag_and_both_variants_resolve(commands):
    stages = _stages(commands)
    assert _arg_default(commands, "BASE") == "cuda"
    final = list(stages.values())[-1]
    for base in BASES:                                   # docker build --build-arg BASE=...
        assert final.replace("${BASE}", base) in stages, (base, final)
    external = [image for image in stages.values() if image not in stages and "$" not in image]
    assert external and all(_pinned(image) for image in external), external
    assert re.fullmatch(r"nvidia/cuda:[0-9.]+-runtime-ubuntu[0-9.]+", stages["base-cuda"])
    assert stages["base-cpu"].startswith("python:3.")


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(p, pat) for p in prefixes for pat in patterns)


def test_every_copy_source_exists_and_is_not_dockerignored(commands):
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = [src for c in commands if c.cmd == "COPY"
               and not any(f.startswith("--from") for f in c.flags) for src in c.value[:-1]]
    assert {"requirements.txt", "app.py", "celeris", "ui", "assets", "models/celeris-tiny-bd",
            "models/celeris-tiny", "models/celeris-tiny-ar"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
    for model in ("celeris-tiny-bd", "celeris-tiny", "celeris-tiny-ar"):
        assert (ROOT / "models" / model / "model.safetensors").stat().st_size > 1_000_000
    assert _ignored(".venv", patterns) and _ignored(".git", patterns)


def test_the_container_starts_app_py_on_0_0_0_0_port_7860(commands):
    entry = next(c for c in commands if c.cmd == "ENTRYPOINT")
    cmd = next(c for c in commands if c.cmd == "CMD")
    assert entry.json and cmd.json and cmd.value == ()
    argv = list(entry.value)
    assert argv[:2] == ["python3", "app.py"]
    import app
    args = app.parse_args(argv[2:])
    assert (args.host, args.port, args.require_key) == ("0.0.0.0", 7860, True)
    assert any(c.cmd == "EXPOSE" and c.value == ("7860",) for c in commands)
    health = next(c for c in commands if c.cmd == "HEALTHCHECK")
    assert "127.0.0.1:7860/health" in health.original


def test_the_image_installs_the_same_pinned_requirements(commands):
    runs = " ; ".join(c.value[0] for c in commands if c.cmd == "RUN")
    assert "pip install --no-cache-dir -r requirements.txt -r requirements-quant.txt" in runs
    grep = re.search(r"grep -E '([^']+)' requirements\.txt", runs)
    assert grep, "torch must be installed at the pin requirements.txt names"
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pins = [line for line in lines if re.search(grep.group(1), line)]
    assert pins == ["torch==2.13.0"] and pins[0] in lines
    assert "--index-url \"$TORCH_INDEX_URL\"" in runs
    envs = {c.value[0]: c.value[1] for c in commands if c.cmd == "ENV" and len(c.value) == 2}
    assert envs["TORCH_INDEX_URL"].endswith("/whl/cpu")   # the CPU stage's (last) value


@pytest.fixture
def no_key_env(monkeypatch):
    monkeypatch.delenv("CELERIS_API_KEY", raising=False)
    monkeypatch.delenv("CELERIS_ALLOW_NO_KEY", raising=False)


@pytest.mark.usefixtures("no_key_env")
def test_the_container_refuses_to_listen_beyond_loopback_without_a_key(commands, capsys,
                                                                       monkeypatch):
    import app
    argv = list(next(c for c in commands if c.cmd == "ENTRYPOINT").value)[2:]
    assert app.main(argv) == 2                          # before a port or a model is touched
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0 without an API key" in err
    assert "CELERIS_API_KEY" in err and "--allow-no-key" in err
    assert app.key_refusal(app.parse_args(argv + ["--api-key", "k"])) is None
    assert app.key_refusal(app.parse_args(argv + ["--allow-no-key"])) is None
    assert app.key_refusal(app.parse_args(shlex.split("--host 127.0.0.1 --require-key"))) is None
    assert app.key_refusal(app.parse_args(["--host", "0.0.0.0"])) is None   # a Space: opt-in
    monkeypatch.setenv("CELERIS_ALLOW_NO_KEY", "1")
    assert app.key_refusal(app.parse_args(argv)) is None
