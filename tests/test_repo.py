"""The repository a newcomer clones: small weights, a README for users whose links resolve,
docs that stay short, docs/ARCHITECTURE.md quoting the shipped models' configs as they are, and
nothing that points at files outside the repository.

No model is loaded: these read files only.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MODELS = sorted(p.parent for p in (ROOT / "models").glob("*/config.json"))
MAX_WEIGHTS_BYTES = 30 * 10 ** 6          # a shipped model stays under 30 MB (the clone's size)
LINK = re.compile(r"\]\(([^)\s]+)\)")       # markdown link targets


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    text = heading.lstrip("#").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_anchor(line) for line in _lines(path) if line.startswith("#")}


def _links(path: Path) -> list[tuple[Path, str]]:
    """(target file, anchor) for every relative link of a markdown file."""
    out = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue                                   # http(s):, mailto:
        file, _, anchor = target.partition("#")
        out.append((path if not file else (path.parent / file).resolve(), anchor))
    return out


@pytest.mark.parametrize("model_dir", MODELS, ids=lambda p: p.name)
def test_shipped_weights_are_under_30_mb(model_dir):
    weights = model_dir / "model.safetensors"
    assert weights.is_file(), f"{weights} is missing"
    size = weights.stat().st_size
    assert size <= MAX_WEIGHTS_BYTES, (
        f"{weights} is {size / 1e6:.1f} MB; a shipped model stays under "
        f"{MAX_WEIGHTS_BYTES / 1e6:.0f} MB (checkpoints belong in the ignored runs/)")


def test_readme_opens_with_space_front_matter_and_stays_short():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    matter = yaml.safe_load(text.split("---\n")[1])
    assert matter["sdk"] == "gradio" and matter["app_file"] == "app.py"
    assert len(text.splitlines()) <= 180


def test_readme_has_the_clone_and_launch_commands_and_no_diary():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "git clone --depth 1" in text and "./launch.sh" in text
    for word in ("session ", "not shipped", "issue "):
        assert word not in text.lower(), f"README holds history: {word!r}"


# What users read: README, docs (FINDINGS keeps the history of experiments), model cards, and
# the strings the CLI, bench, batch jobs, app.py and the launchers print.
# a login or Gradio "session" is a product word; a numbered or "this/last" session is history
HISTORY = re.compile(r"\bissues? #?\d+|\bround \d+|\bsessions? \d+|"
                     r"\b(?:this|last|previous|next|earlier|later) sessions?\b", re.IGNORECASE)
USER_DOCS = sorted({ROOT / "README.md", *DOCS.glob("*.md"), *(m / "README.md" for m in MODELS)}
                   - {DOCS / "FINDINGS.md"})
USER_CODE = sorted({ROOT / "celeris/cli.py", ROOT / "app.py",
                    *(ROOT / "celeris/bench").glob("*.py"), *(ROOT / "celeris/batch").glob("*.py")})


def _strings(path: Path) -> str:
    """Every string literal of a Python file (messages, help, notes, docstrings)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return "\n".join(node.value for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str))


@pytest.mark.parametrize("path", [*USER_DOCS, *USER_CODE, ROOT / "launch.sh", ROOT / "launch.bat"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_what_users_read_names_no_issue_work_round_or_session(path):
    text = _strings(path) if path.suffix == ".py" else path.read_text(encoding="utf-8")
    found = sorted({m.group(0) for m in HISTORY.finditer(text)})
    assert not found, f"{path.relative_to(ROOT)} mentions the project's work: {found}"


def test_model_cards_quote_the_benchmark_figures_and_no_goals_or_stage_diary():
    """The block model's card quotes the twin ratios BENCHMARKS holds (one set, dated), only
    celeris-tiny-bd's card calls itself the default, and no card keeps a goals table or a
    training log table."""
    bench = (DOCS / "BENCHMARKS.md").read_text(encoding="utf-8")
    section = bench.split("## Block diffusion vs its autoregressive twin", 1)[1]
    section = section.split("\n## ", 1)[0]
    date = re.search(r"\| date \| (\d{4}-\d\d-\d\d)", section).group(1)
    card = (ROOT / "models/celeris-tiny-bd/README.md").read_text(encoding="utf-8")
    ratios = re.findall(r"\*\*(\d\.\d\d)\*\*", section)
    assert len(ratios) == 4 and all(f"**{r}**" in card for r in ratios), ratios
    assert date in card and "3.95" not in card
    for model in MODELS:
        text = (model / "README.md").read_text(encoding="utf-8")
        assert "## Goals" not in text and "| step | tokens seen |" not in text, model.name
        intro = text.split("\n## ", 1)[0]
        claims = re.search(r"\b(it is|and) the default model", intro, re.IGNORECASE)
        assert bool(claims) == (model.name == "celeris-tiny-bd"), model.name


@pytest.mark.parametrize("doc", ["README.md", "docs/BENCHMARKS.md", "docs/FINDINGS.md",
                                 "docs/ARCHITECTURE.md", "docs/DESIGN.md",
                                 "docs/ADDING_A_FAMILY.md", "CONTRIBUTING.md"])
def test_relative_links_and_anchors_resolve(doc):
    path = ROOT / doc
    for target, anchor in _links(path):
        assert target.exists(), f"{doc} links to a missing {target.relative_to(ROOT)}"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{doc}: no heading #{anchor} in {target.name}"


def test_every_readme_number_links_to_a_benchmarks_section_with_a_command():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    numbers = text.split("## Numbers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in numbers.splitlines() if line.startswith("| [")]
    assert 5 <= len(rows) <= 8
    sections = _sections(DOCS / "BENCHMARKS.md")
    for row in rows:
        (target,) = LINK.findall(row.split("|")[1])
        file, _, anchor = target.partition("#")
        assert file == "docs/BENCHMARKS.md" and anchor in sections, row
        assert "```bash" in sections[anchor], f"section #{anchor} has no command"


def _sections(path: Path) -> dict[str, str]:
    """anchor -> the text of that section (up to the next heading of level 2)."""
    out, anchor = {}, None
    for line in _lines(path):
        if line.startswith("## "):
            anchor = _anchor(line)
            out[anchor] = ""
        elif anchor:
            out[anchor] += line + "\n"
    return out


def test_docs_stay_within_their_budgets():
    files = [p for p in DOCS.rglob("*") if p.is_file()]
    assert len(files) <= 20, sorted(str(p.relative_to(DOCS)) for p in files)
    results = list((DOCS / "results").glob("*"))
    assert len(results) <= 12 and all(p.suffix == ".json" for p in results)
    for p in results:
        json.loads(p.read_text(encoding="utf-8"))
    assert len(_lines(DOCS / "BENCHMARKS.md")) <= 400
    assert len(_lines(DOCS / "FINDINGS.md")) <= 200
    assert "## How we measure" in (DOCS / "BENCHMARKS.md").read_text(encoding="utf-8")


def _architecture_table() -> dict[str, dict[str, str]]:
    text = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = text.split("## The shipped tiny models", 1)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("|")]
    header, body = rows[0], [r for r in rows[2:]]
    return {r[0]: dict(zip(header[1:], r[1:])) for r in body}


def test_architecture_quotes_every_shipped_model():
    assert sorted(_architecture_table()) == sorted(p.name for p in MODELS)


@pytest.mark.parametrize("model_dir", MODELS, ids=lambda p: p.name)
def test_architecture_config_values_match_config_json(model_dir):
    quoted = _architecture_table()[model_dir.name]
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    for key, cell in quoted.items():
        if cell == "-":
            assert key not in config, f"{model_dir.name}: {key} is {config.get(key)!r}"
        else:
            assert str(config.get(key)) == cell, f"{model_dir.name}: {key}"


def test_block_size_quoted_in_prose_matches_the_config():
    block = json.loads((ROOT / "models/celeris-tiny-bd/config.json").read_text())["block_size"]
    arch = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    quoted = re.findall(r"celeris-tiny-bd's (\d+)", arch)
    assert quoted and all(int(q) == block for q in quoted)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `celeris-tiny-bd`"))
    assert f"blocks of {block}" in row


# ------------------------------------------------------------------ a self-contained repository
OUTSIDE = "../" + "shared"                         # the team's notes beside the clone
DESIGN_PAGE = "docs/DESIGN.md"                     # the project's design notes
DESIGN_REF = re.compile(rb"[\w./\\-]*DESIGN\.md")  # any path that ends in the design page's name


def _tracked_files() -> list[Path]:
    """The files git tracks; without git (an unpacked archive), every file but caches."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
        return [ROOT / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "runs", "__pycache__", "node_modules"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)]


def outside_references(rel: str, data: bytes) -> list[str]:
    """What in one file (path ``rel`` from the root) points outside the repository: the team
    notes' folder, or a design page other than docs/DESIGN.md (a page inside docs/ may name it
    by its file name alone)."""
    sibling = DESIGN_PAGE.split("/", 1)[1]
    found = [OUTSIDE] if OUTSIDE.encode() in data else []
    for m in DESIGN_REF.finditer(data):
        ref = m.group(0).decode()
        if ref != DESIGN_PAGE and not (ref == sibling and rel.startswith("docs/")):
            found.append(ref)
    return found


def test_no_tracked_file_points_outside_the_repository():
    assert (ROOT / DESIGN_PAGE).is_file()
    problems = []
    for path in _tracked_files():
        if not path.is_file() or path.suffix == ".safetensors":
            continue
        rel = path.relative_to(ROOT).as_posix()
        problems += [f"{rel}: {ref}" for ref in outside_references(rel, path.read_bytes())]
    assert not problems, "references to files outside the repository:\n  " + \
        "\n  ".join(problems)


def test_outside_references_are_found():
    page = "DESIGN" + ".md"             # spelt in two halves so this file does not refer to it
    assert outside_references("README.md", f"see docs/{page}".encode()) == []
    assert outside_references("docs/ARCHITECTURE.md", f"[{page}]({page})".encode()) == []
    assert outside_references("celeris/cache.py", f"# see {page}".encode()) == [page]
    assert outside_references("docs/X.md", f"`{OUTSIDE}/{page}`".encode()) == \
        [OUTSIDE, f"{OUTSIDE}/{page}"]
    assert outside_references("tests/t.py", f"../{page} and notes/{page}".encode()) == \
        [f"../{page}", f"notes/{page}"]
