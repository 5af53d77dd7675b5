"""``python -m celeris space DIR [--push REPO_ID]``: a Hugging Face Space folder, and its push.

The folder holds what ``app.py`` needs to run on a CPU Space: the app, the ``celeris`` and
``ui`` packages, the assets, the shipped models, a requirements.txt that takes torch's CPU
wheel, and a README whose front matter (``sdk: gradio``, ``sdk_version`` = the pinned gradio)
is the repository's own. ``--push`` uploads it with ``huggingface_hub.upload_folder``, which
stores the weights the way the Hub needs (Git LFS / Xet): plain ``git push`` of the 23 MB
safetensors files to a Space is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONTENTS = ("app.py", "celeris", "ui", "assets", "models/celeris-tiny-bd", "models/celeris-tiny",
            "models/celeris-tiny-ar")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "checkpoints", ".pytest_cache")
MARKER = ".celeris-space.json"         # marks a folder this command made (safe to replace)
CPU_TORCH_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def front_matter(readme: str) -> str:
    """The YAML front matter block of a README (between the leading ``---`` lines)."""
    match = re.match(r"---\n(.*?)\n---\n", readme, re.S)
    if not match:
        raise ValueError("README.md has no front matter (a --- block at the very top)")
    return match.group(1)


def check_front_matter(matter: str, requirements: str) -> None:
    """sdk gradio, app_file app.py, and sdk_version equal to the gradio pin."""
    pin = re.search(r"^gradio==(\S+)", requirements, re.M)
    fields = dict(re.findall(r"^(\w+):\s*\"?([^\"\n]*)\"?$", matter, re.M))
    expected = {"sdk": "gradio", "app_file": "app.py", "sdk_version": pin and pin.group(1)}
    for name, value in expected.items():
        if fields.get(name) != value:
            raise ValueError(f"README front matter: {name} must be {value!r} "
                             f"(requirements.txt pins gradio), got {fields.get(name)!r}")


def space_readme(matter: str) -> str:
    return (f"---\n{matter}\n---\n\n# Celeris\n\n"
            "Masked diffusion language models denoising their answers live, served by the "
            "Celeris engine on CPU: `celeris-tiny-bd` (block diffusion, the default: it writes "
            "block after block against an exact KV cache), `celeris-tiny` (full attention: one "
            "answer canvas; the Infill tab uses it) and their autoregressive twin "
            "`celeris-tiny-ar` (the Race tab), each 5.8M parameters, trained on a small story "
            "grammar and exact-answer tasks.\n\n"
            "The same process serves an OpenAI-compatible API at `/v1` "
            "(`/v1/models`, `/v1/completions`, `/v1/chat/completions`).\n")


def space_requirements(requirements: str) -> str:
    """The repository's pins, with torch's CPU-only index first (a CPU Space has no CUDA)."""
    return f"# assembled by `python -m celeris space`\n{CPU_TORCH_INDEX}\n{requirements}"


def _prepare(folder: Path) -> None:
    if folder.exists() and any(folder.iterdir()):
        if not (folder / MARKER).is_file():
            raise ValueError(f"{folder} exists and is not empty; give a new folder (or one "
                             "this command made, which is then rebuilt)")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)


def assemble(folder: str | Path, root: Path = REPO_ROOT) -> Path:
    """Write the Space folder; returns it."""
    missing = [name for name in CONTENTS + ("README.md", "requirements.txt")
               if not (root / name).exists()]
    if missing:
        raise ValueError(f"a Space is assembled from a source checkout; missing in {root}: "
                         f"{', '.join(missing)}")
    requirements = (root / "requirements.txt").read_text(encoding="utf-8")
    matter = front_matter((root / "README.md").read_text(encoding="utf-8"))
    check_front_matter(matter, requirements)
    folder = Path(folder)
    _prepare(folder)
    for name in CONTENTS:
        src, dst = root / name, folder / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=SKIP)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    (folder / "requirements.txt").write_text(space_requirements(requirements), encoding="utf-8")
    (folder / "README.md").write_text(space_readme(matter), encoding="utf-8")
    (folder / MARKER).write_text(json.dumps({"source": str(root), "assembled": time.strftime(
        "%Y-%m-%dT%H:%M:%S%z")}) + "\n", encoding="utf-8")
    return folder


def push(folder: Path, repo_id: str, private: bool = False) -> str:
    """Create the Space if needed and upload the folder; returns the Space URL."""
    import huggingface_hub
    from huggingface_hub import constants

    later = (f"The folder is ready at {folder}; push it later with `python -m celeris space "
             f"{folder} --push {repo_id}`.")
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        raise ValueError(f"cannot push to the Space {repo_id}: offline mode is on "
                         f"(HF_HUB_OFFLINE). {later}")
    if not huggingface_hub.get_token():
        raise ValueError(f"cannot push to the Space {repo_id}: no Hugging Face token (run "
                         f"`hf auth login` or set HF_TOKEN). {later}")
    api = huggingface_hub.HfApi()
    try:
        api.create_repo(repo_id, repo_type="space", space_sdk="gradio", exist_ok=True,
                        private=private)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="space",
                          ignore_patterns=[MARKER], commit_message="Celeris Space")
    except Exception as exc:   # noqa: BLE001 - network, auth and Hub errors alike
        raise ValueError(f"could not push to the Space {repo_id} at "
                         f"{constants.ENDPOINT}: {type(exc).__name__}: {exc}. {later}") from None
    return f"https://huggingface.co/spaces/{repo_id}"


def main(args: argparse.Namespace) -> int:
    folder = assemble(args.dir)
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"assembled the Space in {folder} ({size / 1e6:.1f} MB)")
    if args.push:
        print(f"pushed: {push(folder, args.push, private=args.private)}")
    else:
        print(f"run it here: cd {folder} && python app.py   |   publish it: python -m celeris "
              f"space {folder} --push USER/NAME")
    return 0
