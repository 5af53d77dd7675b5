"""Recipes: the stages that made a shipped model, in one TOML file beside its weights, run end
to end by ``celeris train --recipe models/<name>/recipe.toml [--out DIR]``.

A recipe is a list of ``[[stage]]`` tables. Stage N trains one model into ``DIR/stage-NN``,
starting from stage N-1's weights (``from`` names another stage; stage 0 starts from scratch):

    name, kind, steps              the run's name in the cards, ar|diffusion|bd, optimizer steps
    seed, threads                  as the run had them (CELERIS_THREADS, when set, wins)
    lr, mix, tokens_per_batch, block_size, certainty, masking, semi_ar_prob, asks, free
                                   training settings (``trainer.TRAIN_PRESETS``; unset = preset)
    distill = {requests, tasks, batch, seed, relabel, correct, min_arcs, drop, temperature,
               free}
                                   first the starting model answers training prompts
                                   (``selfgen.distill_data``; a list of counts runs passes that
                                   resume one file; ``drop`` removes sources); the stage then
                                   trains on the kept answers with probability ``selfgen_prob``
    selfgen = {recipe, stage}      train on another recipe's stage's distill file instead
    runs = [{name, ...}, ...]      train each run (settings overridden) on the same batches and
                                   keep their uniform mean (``average``)
    same_as = {recipe, stage}      this stage is another recipe's stage (trained once, shared)

Paths of other recipes are relative to this file; their stages land in ``DIR/needs/<model>``
(the recipe being run keeps ``DIR``). A finished stage has ``stage.json`` and is skipped; an
interrupted one resumes from its last checkpoint (``train(resume=True)``); ``distill_data``
resumes its file. ``steps_scale`` shrinks every step and prompt count (smoke runs), ``smoke``
also trains the micro preset.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celeris.train.trainer import KINDS, check_settings

SETTINGS = ("lr", "mix", "tokens_per_batch", "block_size", "certainty", "masking",
            "semi_ar_prob", "selfgen_prob", "asks", "free")
STAGE_KEYS = {"name", "kind", "steps", "seed", "threads", "from", "distill", "selfgen", "runs",
              "same_as", *SETTINGS}
DISTILL_KEYS = {"requests", "tasks", "batch", "seed", "relabel", "correct", "min_arcs", "drop",
                "temperature", "free"}
RUN_SETTINGS = ("masking", "seed")


@dataclass(frozen=True)
class Ref:
    """Stage ``stage`` of the recipe at ``recipe`` (an absolute path)."""
    recipe: Path
    stage: int


@dataclass(frozen=True)
class Stage:
    index: int
    name: str
    kind: str = "ar"
    steps: int = 0
    seed: int = 0
    threads: int = 2
    init: Ref | None = None                  # the weights it starts from
    same_as: Ref | None = None
    selfgen: Ref | None = None               # whose distill file it trains on
    distill: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    runs: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Recipe:
    path: Path
    model: str
    stages: tuple[Stage, ...]


# ----------------------------------------------------------------------------- parsing
def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _int(where: str, key: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _fail(where, f"{key} must be an integer >= {low}, got {value!r}")
    return value


def _ref(where: str, key: str, value: Any, base: Path, index: int) -> Ref:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < index:
            raise _fail(where, f"{key} must name an earlier stage (0-{index - 1}), got {value}")
        return Ref(base, value)
    if not isinstance(value, dict) or set(value) != {"recipe", "stage"}:
        raise _fail(where, f"{key} must be a stage number or {{ recipe = PATH, stage = N }}, "
                           f"got {value!r}")
    path = (base.parent / str(value["recipe"])).resolve()
    if not path.is_file():
        raise _fail(where, f"{key}: no recipe at {path}")
    return Ref(path, _int(where, f"{key}.stage", value["stage"], 0))


def _distill(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, f"distill must be a table, got {value!r}")
    unknown = sorted(set(value) - DISTILL_KEYS)
    if unknown:
        raise _fail(where, f"distill: unknown key(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(DISTILL_KEYS))}")
    out = {"batch": 16, "seed": 0, "relabel": True, "correct": True, "min_arcs": 0, "drop": [],
           "temperature": 0.0, "free": 0.0, **value}
    passes = [out.get(k) if isinstance(out.get(k), list) else [out.get(k)]
              for k in ("requests", "tasks")]
    if len(passes[0]) != len(passes[1]):
        raise _fail(where, "distill: requests and tasks must list as many passes")
    for key, counts in zip(("requests", "tasks"), passes):
        for n in counts:
            _int(where, f"distill.{key}", n, 0)
    out["passes"] = list(zip(*passes))
    if not set(out["drop"]) <= {"task", "longreq"}:
        raise _fail(where, f"distill.drop holds sources task|longreq, got {out['drop']!r}")
    return out


def _runs(where: str, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or len(value) < 2:
        raise _fail(where, f"runs must list at least 2 runs to average, got {value!r}")
    for run in value:
        bad = sorted(set(run) - {"name", *RUN_SETTINGS}) if isinstance(run, dict) else ["?"]
        if bad or not isinstance(run.get("name"), str):
            raise _fail(where, f"each run needs a name and may set {', '.join(RUN_SETTINGS)}; "
                               f"got {run!r}")
    return tuple(value)


def _settings(where: str, kind: str, table: dict[str, Any]) -> dict[str, Any]:
    settings = {k: table[k] for k in SETTINGS if k in table}
    prob = settings.get("selfgen_prob", 1.0)
    if not isinstance(prob, (int, float)) or not 0 < prob <= 1:
        raise _fail(where, f"selfgen_prob must be in (0, 1], got {prob!r}")
    try:
        check_settings(kind, "tiny", {k: v for k, v in settings.items() if k != "selfgen_prob"})
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    return settings


def _stage(table: Any, index: int, path: Path) -> Stage:
    where = f"{path} stage {index}"
    if not isinstance(table, dict):
        raise _fail(where, "each [[stage]] must be a table")
    unknown = sorted(set(table) - STAGE_KEYS)
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}; known: "
                           f"{', '.join(sorted(STAGE_KEYS))}")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(where, f"name must be a non-empty string, got {name!r}")
    if "same_as" in table:
        extra = sorted(set(table) - {"name", "same_as"})
        if extra:
            raise _fail(where, f"a same_as stage sets nothing else, got {', '.join(extra)}")
        return Stage(index, name, same_as=_ref(where, "same_as", table["same_as"], path, index))
    kind = table.get("kind")
    if kind not in KINDS:
        raise _fail(where, f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    distill = _distill(where, table["distill"]) if "distill" in table else None
    selfgen = (_ref(where, "selfgen", table["selfgen"], path, index) if "selfgen" in table
               else Ref(path, index) if distill else None)
    if (selfgen is None) != ("selfgen_prob" not in table):
        raise _fail(where, "selfgen_prob goes with distill or selfgen, and they with it")
    init = table.get("from", index - 1 if index else None)
    return Stage(index, name, kind, _int(where, "steps", table.get("steps"), 1),
                 _int(where, "seed", table.get("seed", 0), 0),
                 _int(where, "threads", table.get("threads", 2), 1),
                 None if init is None else _ref(where, "from", init, path, index),
                 None, selfgen, distill, _settings(where, kind, table),
                 _runs(where, table["runs"]) if "runs" in table else ())


def load_recipe(path: str | Path) -> Recipe:
    """Parse and check a recipe file (see the module docstring); errors name the stage and key."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"recipe: no such file {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None
    stages = data.get("stage")
    if not isinstance(data.get("model"), str) or not isinstance(stages, list) or not stages:
        raise ValueError(f"{path}: a recipe needs model = NAME and at least one [[stage]]")
    return Recipe(path, data["model"], tuple(_stage(t, i, path) for i, t in enumerate(stages)))
