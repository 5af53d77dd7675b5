"""Import layering guard (see docs/DESIGN.md, "Layers").

Walks every .py file under celeris/ and ui/ plus app.py with ``ast`` (imports inside functions
count too), resolves relative imports, and fails on an arrow the layer table does not allow.
A celeris module missing from the table fails as well, so new files must be classified here.
Imports under ``if TYPE_CHECKING:`` are skipped: they run only for a type checker, never at
run time, so they are no arrow (the ``else`` branch of such an ``if`` still counts).

It also fails on an import cycle between celeris's top-level packages and modules (``model``,
``engine``, ``train``, ``evals``, ...): two of them that import each other, directly or through
others, cannot be read, tested or replaced one at a time.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# layer -> module prefixes; a prefix matches the module itself and its submodules.
LAYERS: dict[str, tuple[str, ...]] = {
    "L0": ("celeris.config", "celeris.params", "celeris.outputs", "celeris.request_params",
           "celeris.hints"),
    "L1": ("celeris.kernels", "celeris.tokenizer"),
    "L2": ("celeris.cache", "celeris.model"),
    "L3": ("celeris.sampler",),
    "LF": ("celeris.families",),
    "L4": ("celeris.engine", "celeris.ar_baseline"),
    "data": ("celeris.synthetic",),
    "L5": ("celeris.server", "celeris.bench", "celeris.batch", "celeris.train", "celeris.evals",
           "celeris.pipeline", "celeris.cli", "celeris.space"),
    "ui": ("ui",),
    "app": ("app",),
}
FACADE = "celeris"            # the package itself: public names only
EXEMPT = {"celeris", "celeris.__main__"}  # the facade may import anything inside celeris

# layer -> (layers it may import, extra module prefixes it may import)
ALLOWED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "L0": (("L0",), ()),
    "L1": (("L0", "L1"), ()),
    "L2": (("L0", "L1", "L2"), ()),
    "L3": (("L0", "L1", "L3"), ("celeris.cache",)),  # the model only through a protocol
    # the families declare configs, models and layouts; the engine runs what they declare
    "LF": (("L0", "L1", "L2", "L3", "LF"), ()),
    "L4": (("L0", "L1", "L2", "L3", "LF", "L4"), ()),
    "data": (("L0", "data"), ()),   # generated stories and tasks: stdlib, imports no L5 package
    "L5": (("facade", "L0", "data", "L5"), ()),
    "ui": (("facade", "ui"), ("celeris.params", "celeris.outputs")),
    "app": (("facade", "ui"), ("celeris.server", "celeris.hints")),
}
CHECKED_ROOTS = ("celeris", "ui", "app")  # imports of anything else are third-party/stdlib
FORBIDDEN_IN_CELERIS = ("gradio",)


# ------------------------------------------------------------------------- the checker
def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    """The layer name of a first-party module, "facade" for the package, None if unknown."""
    if module == FACADE:
        return "facade"
    if module in EXEMPT:
        return "exempt"
    for layer, prefixes in LAYERS.items():
        if any(_matches(module, p) for p in prefixes):
            return layer
    return None


def _is_checked(target: str) -> bool:
    return any(_matches(target, root) for root in CHECKED_ROOTS)


def check_import(module: str, target: str) -> str | None:
    """Why ``module`` may not import ``target``, or None when the arrow is allowed."""
    if _matches(module, "celeris") and any(_matches(target, f) for f in FORBIDDEN_IN_CELERIS):
        return f"{module} imports {target}: nothing under celeris/ may import gradio"
    if not _is_checked(target) or module in EXEMPT:
        return None
    source_layer = layer_of(module)
    if source_layer is None:
        return f"{module} is not in the layer table of tests/test_layering.py; classify it"
    target_layer = layer_of(target)
    if target_layer is None:
        return f"{module} imports {target}, which is not in the layer table; classify it"
    layers, extras = ALLOWED[source_layer]
    if target_layer in layers or any(_matches(target, p) for p in extras):
        return None
    allowed = ", ".join(layers + extras)
    return (f"{module} ({source_layer}) imports {target} ({target_layer}); "
            f"{source_layer} may import only: {allowed}")


def check_module(module: str, targets: list[str]) -> list[str]:
    """All violations for one module given the absolute module names it imports."""
    problems = []
    if _matches(module, "celeris") and layer_of(module) is None:
        problems.append(f"{module} is not in the layer table of tests/test_layering.py; "
                        "classify it")
    for target in targets:
        problem = check_import(module, target)
        if problem and problem not in problems:
            problems.append(problem)
    return problems


# ------------------------------------------------------------------------- import walking
def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _known_top_level(root: Path) -> set[str]:
    """Names n for which ``celeris.n`` is a module (in the table or on disk)."""
    names = {p.split(".")[1] for prefixes in LAYERS.values() for p in prefixes
             if p.startswith("celeris.")}
    names.add("__main__")
    pkg = root / "celeris"
    if pkg.is_dir():
        names.update(p.stem for p in pkg.glob("*.py"))
        names.update(p.name for p in pkg.iterdir() if (p / "__init__.py").exists())
    return names


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(base) or (level - 1 == len(base) and not name):
        return f"<relative import beyond top level from {module}>"
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (any ``X.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the nodes inside the body of an ``if TYPE_CHECKING:`` (not its ``else``)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imports_of(source: str, module: str, is_package: bool = False,
               top_level: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in ``source`` that runs at run time.

    ``from celeris import engine`` counts as importing ``celeris.engine`` (a submodule), while
    ``from celeris import Engine`` counts as importing the facade ``celeris``. Imports in the
    body of ``if TYPE_CHECKING:`` are left out: a type-only import is no runtime arrow.
    """
    top_level = _known_top_level(ROOT) if top_level is None else top_level
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    type_only = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve_relative(module, is_package, node.level, node.module)
            else:
                base = node.module or ""
            for alias in node.names:
                found.append((node.lineno, _from_target(base, alias.name, top_level)))
    return found


def _from_target(base: str, name: str, top_level: set[str]) -> str:
    if base == FACADE and name in top_level:
        return f"{FACADE}.{name}"
    if base == FACADE or base.startswith("<"):
        return base
    # from celeris.model import x: x is either a name in celeris.model or a submodule of it;
    # both live in the same layer, so the package itself is the target.
    return base


def source_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for package in ("celeris", "ui"):
        if (root / package).is_dir():
            files.extend(p for p in sorted((root / package).rglob("*.py"))
                         if "__pycache__" not in p.parts)
    if (root / "app.py").is_file():
        files.append(root / "app.py")
    return files


def repository_violations(root: Path = ROOT) -> list[str]:
    top_level = _known_top_level(root)
    problems: list[str] = []
    for path in source_files(root):
        module = module_name(path, root)
        rel = path.relative_to(root)
        try:
            found = imports_of(path.read_text(encoding="utf-8"), module,
                               path.name == "__init__.py", top_level)
        except SyntaxError as exc:
            problems.append(f"{rel}:{exc.lineno}: cannot parse: {exc.msg}")
            continue
        if _matches(module, "celeris") and layer_of(module) is None:
            problems.append(f"{rel}: {module} is not in the layer table of "
                            "tests/test_layering.py; classify it")
        for line, target in found:
            problem = check_import(module, target)
            if problem and "is not in the layer table of" not in problem:
                problems.append(f"{rel}:{line}: {problem}")
    return problems


# ------------------------------------------------------------------------- package cycles
def package_of(module: str) -> str | None:
    """The top-level unit of celeris a module belongs to (``celeris.train.stream`` ->
    ``celeris.train``, ``celeris.cache`` -> itself); None for the facade, ``__main__`` and
    anything outside celeris. The facade re-exports the public names and imports every layer,
    so it is left out of the package graph."""
    parts = module.split(".")
    if parts[0] != FACADE or len(parts) < 2 or module in EXEMPT:
        return None
    return ".".join(parts[:2])


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """package -> the other celeris packages its modules import at run time."""
    top_level = _known_top_level(root)
    graph: dict[str, set[str]] = defaultdict(set)
    for path in source_files(root):
        module = module_name(path, root)
        source = package_of(module)
        if source is None:
            continue
        graph[source]
        found = imports_of(path.read_text(encoding="utf-8"), module,
                           path.name == "__init__.py", top_level)
        for _, target in found:
            dest = package_of(target)
            if dest is not None and dest != source:
                graph[source].add(dest)
    return dict(graph)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of nodes that reach each other (a strongly connected component of more
    than one node, or a node importing itself), each sorted, the groups sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                cycles.append(sorted(group))

    for node in sorted(set(graph) | {n for targets in graph.values() for n in targets}):
        if node not in index:
            visit(node)
    return sorted(cycles)


def _cycle_report(graph: dict[str, set[str]], cycles: list[list[str]]) -> str:
    lines = []
    for group in cycles:
        arrows = [f"{a} -> {b}" for a in group for b in sorted(graph.get(a, ())) if b in group]
        lines.append(", ".join(group) + ": " + "; ".join(arrows))
    return "\n  ".join(lines)


# ------------------------------------------------------------------------- the tests
def test_no_import_cycles_between_packages():
    graph = package_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between celeris packages:\n  " + _cycle_report(graph, cycles)


def test_cycle_finder_on_a_small_graph():
    graph = {"celeris.evals": {"celeris.train", "celeris.synthetic"},
             "celeris.train": {"celeris.evals", "celeris.synthetic"},
             "celeris.synthetic": set(),
             "celeris.a": {"celeris.b"}, "celeris.b": {"celeris.c"}, "celeris.c": {"celeris.a"},
             "celeris.d": {"celeris.d"}, "celeris.e": {"celeris.a"}}
    assert find_cycles(graph) == [["celeris.a", "celeris.b", "celeris.c"], ["celeris.d"],
                                  ["celeris.evals", "celeris.train"]]
    assert "celeris.evals -> celeris.train" in _cycle_report(graph, find_cycles(graph))
    assert find_cycles({"celeris.x": {"celeris.y"}, "celeris.y": set()}) == []


def test_package_graph_sees_a_planted_cycle(tmp_path):
    """End to end on a fake tree: train and evals importing each other is found, a type-only
    import and an import of the facade are not arrows."""
    for pkg in ("evals", "train", "engine"):
        (tmp_path / "celeris" / pkg).mkdir(parents=True)
        (tmp_path / "celeris" / pkg / "__init__.py").write_text("")
    (tmp_path / "celeris" / "__init__.py").write_text("from .engine import Engine\n")
    (tmp_path / "celeris" / "evals" / "card.py").write_text(
        "from celeris.train.stream import describe\n")
    (tmp_path / "celeris" / "train" / "pipeline.py").write_text(
        "def run():\n    from ..evals.card import write\n")
    (tmp_path / "celeris" / "engine" / "core.py").write_text(
        "from typing import TYPE_CHECKING\nimport celeris\n"
        "if TYPE_CHECKING:\n    from celeris.train import stream\n")
    graph = package_graph(tmp_path)
    assert graph == {"celeris.evals": {"celeris.train"}, "celeris.train": {"celeris.evals"},
                     "celeris.engine": set()}
    assert find_cycles(graph) == [["celeris.evals", "celeris.train"]]


def test_type_checking_imports_are_not_arrows():
    source = "\n".join([
        "from typing import TYPE_CHECKING",
        "import typing",
        "if TYPE_CHECKING:",
        "    from celeris.engine import Engine",
        "else:",
        "    from celeris.params import GenerationParams",
        "if typing.TYPE_CHECKING:",
        "    import celeris.model",
        "def f():",
        "    if TYPE_CHECKING:",
        "        from celeris.server import routes",
        "    from celeris.outputs import StepEvent",
    ])
    targets = [t for _, t in imports_of(source, "celeris.sampler.loop", False, set())]
    assert targets == ["typing", "typing", "celeris.params", "celeris.outputs"]


def test_repository_respects_layers():
    problems = repository_violations()
    assert not problems, "import layering violations:\n  " + "\n  ".join(problems)


def test_walker_sees_existing_files():
    files = source_files()
    expected = [ROOT / "celeris" / "params.py", ROOT / "celeris" / "outputs.py"]
    for path in expected:
        if path.exists():
            assert path in files


@pytest.mark.parametrize("module,target", [
    ("celeris.sampler.loop", "celeris.model"),           # the sampler sees the model via protocol
    ("celeris.sampler", "celeris.model.llada"),
    ("celeris.params", "celeris.kernels"),               # L0 imports nothing higher
    ("celeris.outputs", "celeris"),                      # nor the facade (cycle)
    ("celeris.kernels.gumbel", "celeris.cache"),         # L1 -> L2
    ("celeris.model.tiny", "celeris.sampler"),           # L2 -> L3
    ("celeris.engine", "celeris.server"),                # L4 -> L5
    ("celeris.families.llada", "celeris.engine.runner"),  # a family never drives the engine
    ("celeris.model.weights", "celeris.families"),       # the model layer knows no family
    ("celeris.engine", "celeris"),                       # inner layers avoid the facade
    ("celeris.engine", "ui.canvas"),                     # celeris never imports ui
    ("celeris.cli", "celeris.engine"),                   # L5 uses public names only
    ("celeris.server.routes", "celeris.sampler.policies"),
    ("celeris.bench", "celeris.tokenizer"),
    ("celeris.train.trainer", "celeris.model"),
    ("ui.playground", "celeris.engine"),
    ("ui.playground", "celeris.config"),
    ("ui.playground", "celeris.server"),
    ("app", "celeris.engine"),
    ("app", "celeris.params"),
    ("celeris.model.llada", "gradio"),
    ("celeris", "gradio.themes"),                        # even the facade
    ("celeris.newthing", "celeris.params"),              # unknown source module
    ("celeris.engine", "celeris.newthing"),              # unknown target module
    ("ui.helpers", "app"),
    ("celeris.synthetic.corpus", "celeris.train"),       # the data imports neither of its users
    ("celeris.synthetic.tasks", "celeris.evals.card"),
    ("celeris.synthetic.storycheck", "celeris"),         # nor the facade (no engine in here)
    ("celeris.engine", "celeris.synthetic"),             # the core never reads the data
])
def test_checker_reports_violation(module, target):
    assert check_module(module, [target]), f"{module} -> {target} should be a violation"


@pytest.mark.parametrize("module,target", [
    ("celeris.params", "celeris.outputs"),
    ("celeris.params", "dataclasses"),
    ("celeris.kernels.gumbel", "celeris.params"),
    ("celeris.kernels", "triton"),
    ("celeris.tokenizer", "celeris.config"),
    ("celeris.model.llada", "celeris.model.layers"),
    ("celeris.model.llada", "celeris.kernels"),
    ("celeris.cache", "celeris.config"),
    ("celeris.sampler.loop", "celeris.cache"),
    ("celeris.sampler.loop", "celeris.kernels.softmax"),
    ("celeris.sampler.loop", "celeris.sampler.policies"),
    ("celeris.engine", "celeris.model"),
    ("celeris.engine", "celeris.cache"),
    ("celeris.cli", "celeris"),
    ("celeris.cli", "celeris.train"),
    ("celeris.server.routes", "celeris.server.protocol"),
    ("celeris.server.routes", "celeris.params"),
    ("celeris.bench", "celeris"),
    ("ui.playground", "celeris"),
    ("ui.playground", "celeris.params"),
    ("ui.playground", "ui.render"),
    ("ui.playground", "gradio"),
    ("app", "celeris"),
    ("app", "celeris.server.routes"),
    ("app", "ui"),
    ("celeris", "celeris.engine"),                       # facade is exempt
    ("celeris.__main__", "celeris.cli"),
    ("celeris.train.stream", "celeris.synthetic.corpus"),
    ("celeris.evals.card", "celeris.synthetic.tasks"),
    ("celeris.bench", "celeris.synthetic.longcheck"),
    ("celeris.synthetic.longcheck", "celeris.synthetic.storycheck"),
    ("celeris.pipeline", "celeris.evals.card"),
])
def test_checker_allows(module, target):
    assert check_module(module, [target]) == []


def test_import_resolution():
    source = "\n".join([
        "from __future__ import annotations",
        "import torch",
        "from ..model import llada",
        "from .. import cache",
        "from . import policies",
        "from .policies import confidence",
        "from celeris import engine, Engine",
        "import celeris.params as p",
        "def f():",
        "    from ...ui import canvas",
    ])
    targets = [t for _, t in imports_of(source, "celeris.sampler.loop", False,
                                        {"engine", "cache", "model", "params"})]
    assert targets == [
        "__future__", "torch", "celeris.model", "celeris.cache", "celeris.sampler",
        "celeris.sampler.policies", "celeris.engine", "celeris", "celeris.params",
        "ui",  # the import inside f() comes last (ast.walk is breadth-first)
    ]
    problems = check_module("celeris.sampler.loop", targets)
    assert any("celeris.model" in p for p in problems)
    assert any("celeris.engine" in p for p in problems)
    assert any(" ui " in p or "imports ui" in p for p in problems)


def test_relative_import_in_package_init():
    found = imports_of("from .llada import LLaDA\nfrom .. import params\n",
                       "celeris.model", is_package=True, top_level={"params"})
    assert [t for _, t in found] == ["celeris.model.llada", "celeris.params"]


def test_repository_scan_catches_planted_violation(tmp_path):
    """End to end on a fake tree: the guard must not pass silently."""
    (tmp_path / "celeris" / "sampler").mkdir(parents=True)
    (tmp_path / "celeris" / "__init__.py").write_text("from .engine import Engine\n")
    (tmp_path / "celeris" / "sampler" / "__init__.py").write_text("")
    (tmp_path / "celeris" / "sampler" / "loop.py").write_text(
        "from ..model import MaskedLM\nfrom ..cache import PrefixCache\n")
    (tmp_path / "celeris" / "mystery.py").write_text("import os\n")
    (tmp_path / "app.py").write_text("from celeris.engine import Engine\n")
    problems = repository_violations(tmp_path)
    joined = "\n".join(problems)
    assert "celeris/sampler/loop.py:1" in joined and "celeris.model" in joined
    assert "loop.py:2" not in joined                      # the cache is allowed
    assert "celeris.mystery is not in the layer table" in joined
    assert "app.py:1" in joined
    assert len(problems) == 3, joined


def _definitions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))} | \
        {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
         for t in n.targets if isinstance(t, ast.Name)}


def test_benchmark_code_lives_only_in_celeris_bench():
    outside = [str(p.relative_to(ROOT)) for p in (ROOT / "celeris").rglob("*.py")
               if "bench" not in p.relative_to(ROOT / "celeris").parts[:1]
               and any(name.startswith("bench_") for name in _definitions(p))]
    assert outside == []
    assert not (ROOT / "celeris" / "server" / "bench.py").exists()


def test_one_definition_of_the_shared_helpers():
    """EOT_NAMES and the device/dtype resolution are defined once (tokenizer, model.weights)."""
    owners = {"EOT_NAMES": [], "resolve_device": [], "_device": []}
    for path in (ROOT / "celeris").rglob("*.py"):
        for name in _definitions(path) & set(owners):
            owners[name].append(str(path.relative_to(ROOT)))
    assert owners == {"EOT_NAMES": ["celeris/tokenizer.py"],
                      "resolve_device": ["celeris/model/weights.py"], "_device": []}


def test_no_scaffolding_left_in_the_entry_points():
    for name in ("celeris/cli.py", "launch.sh", "launch.bat"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "not available yet" not in text and "is not there yet" not in text, name
