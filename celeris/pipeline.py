"""Run a recipe (``celeris.train.recipe``) end to end: every stage's model, the distill-data
files they train on, the averages of their runs, and at the end the model card's figures.
It sits above ``celeris.train`` (the stages) and ``celeris.evals`` (the card): evals imports
train, never the other way round.

Each stage is made once: ``OUT/stage-NN/stage.json`` marks it finished and a later call skips
it; a stage cut short resumes from its last checkpoint, a distill file from its last batch.
A stage of another recipe (``same_as``, ``selfgen``) is made the same way under
``OUT/needs/<model>``, only as far as it is needed.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from celeris.train import checkpoints
from celeris.train.recipe import Recipe, Ref, Stage, load_recipe

SMOKE_PRESET = "micro"
SMOKE_EVAL = 2              # problems per task and story openings of a smoke run's card


def _note(message: str) -> None:
    print(f"recipe: {message}", file=sys.stderr, flush=True)


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """The stage's thread count, unless CELERIS_THREADS is set by the caller."""
    if "CELERIS_THREADS" in os.environ:
        yield
        return
    os.environ["CELERIS_THREADS"] = str(n)
    try:
        yield
    finally:
        del os.environ["CELERIS_THREADS"]


class Workspace:
    """Where each recipe's stages live, and the making of each one (dependencies first)."""

    def __init__(self, top: Recipe, out: Path, *, from_stage: int = 0,
                 steps_scale: float = 1.0, smoke: bool = False, progress: bool = False):
        self.top, self.out, self.from_stage = top, out, from_stage
        self.scale, self.smoke, self.progress = steps_scale, smoke, progress
        self.preset = SMOKE_PRESET if smoke else "tiny"
        self.recipes: dict[Path, Recipe] = {top.path: top}
        self.busy: set[Ref] = set()
        self.pools: dict[Path, Path | None] = {}

    # ---------------------------------------------------------------- naming
    def recipe(self, path: Path) -> Recipe:
        if path not in self.recipes:
            self.recipes[path] = load_recipe(path)
        return self.recipes[path]

    def stage(self, ref: Ref) -> Stage:
        stages = self.recipe(ref.recipe).stages
        if ref.stage >= len(stages):
            raise ValueError(f"{ref.recipe} has stages 0-{len(stages) - 1}, not {ref.stage}")
        return stages[ref.stage]

    def resolve(self, ref: Ref) -> Ref:
        """Follow ``same_as`` to the stage that is trained."""
        seen = set()
        while (same := self.stage(ref).same_as) is not None:
            if ref in seen:
                raise ValueError(f"{ref.recipe} stage {ref.stage}: same_as goes round in a loop")
            seen.add(ref)
            ref = same
        return ref

    def stage_dir(self, ref: Ref) -> Path:
        ref = self.resolve(ref)
        base = (self.out if ref.recipe == self.top.path
                else self.out / "needs" / self.recipe(ref.recipe).model)
        return base / f"stage-{ref.stage:02d}"

    def count(self, n: int) -> int:
        """A step or prompt count at this run's scale (0 stays 0, else at least 1)."""
        return 0 if n == 0 else max(1, round(n * self.scale))

    # ---------------------------------------------------------------- making
    def _finished(self, where: Path) -> bool:
        marker = where / "stage.json"
        if not marker.is_file():
            return False
        made = json.loads(marker.read_text())
        if (made.get("steps_scale"), made.get("preset")) != (self.scale, self.preset):
            raise ValueError(f"{where} was made with steps_scale={made.get('steps_scale')} and "
                             f"preset {made.get('preset')!r}, not {self.scale} and "
                             f"{self.preset!r}: use another --out")
        return True

    def model(self, ref: Ref) -> Path:
        """The directory of stage ``ref``'s model, made first if it is not finished."""
        where = self.stage_dir(ref)
        if self._finished(where):
            return where
        if ref.recipe == self.top.path and ref.stage < self.from_stage:
            raise FileNotFoundError(f"--from-stage {self.from_stage}: stage {ref.stage} "
                                    f"({self.stage(ref).name}) is not finished under {where}")
        ref = self.resolve(ref)
        if ref in self.busy:
            raise ValueError(f"{ref.recipe} stage {ref.stage} depends on itself")
        self.busy.add(ref)
        stage = self.stage(ref)
        init = self.model(stage.init) if stage.init is not None else None
        pool = self.pool(stage.selfgen) if stage.selfgen is not None else None
        self._make(stage, where, init, pool)
        self.busy.discard(ref)
        return where

    def _make(self, stage: Stage, where: Path, init: Path | None, pool: Path | None) -> None:
        from celeris.train.average import average

        _note(f"stage {stage.index} {stage.name}: {stage.kind}, {self.count(stage.steps)} "
              f"steps -> {where}")
        if not stage.runs:
            self._train(stage, where, init, pool, {})
        else:
            runs = [where / run["name"] for run in stage.runs]
            for run, run_dir in zip(stage.runs, runs):
                self._train(stage, run_dir, init, pool, run)
            average(runs, where)
        made = {"stage": stage.index, "name": stage.name, "kind": stage.kind,
                "init_from": None if init is None else str(init),
                "selfgen": None if pool is None else str(pool),
                "steps": self.count(stage.steps), "steps_scale": self.scale,
                "preset": self.preset}
        (where / "stage.json").write_text(json.dumps(made, indent=1) + "\n")

    def _train(self, stage: Stage, where: Path, init: Path | None, pool: Path | None,
               run: dict[str, Any]) -> None:
        from celeris.train.trainer import train

        steps = self.count(stage.steps)
        log = where / "train_log.json"
        if log.is_file() and (where / "model.safetensors").is_file() \
                and json.loads(log.read_text()).get("steps") == steps:
            return                                  # a run of an averaged stage, finished
        settings = {**stage.settings, **{k: v for k, v in run.items() if k == "masking"}}
        if pool is not None:
            settings["selfgen"] = str(pool)
        else:
            settings.pop("selfgen_prob", None)
        if self.smoke:
            settings.pop("tokens_per_batch", None)  # the micro preset's own batch
        with _threads(stage.threads):
            train(where, steps=steps, seed=run.get("seed", stage.seed), kind=stage.kind,
                  preset=self.preset, init_from=init, progress=self.progress,
                  resume=checkpoints.latest_checkpoint(where) is not None,
                  label=f"stage {stage.index} {run.get('name', stage.name)}", **settings)

    def pool(self, ref: Ref) -> Path | None:
        """Stage ``ref``'s distill-data file (``selfgen.jsonl``), written first if missing;
        None when a smoke run's model kept no answer (its stage then trains without one)."""
        stage, where = self.stage(self.resolve(ref)), self.stage_dir(ref)
        if where not in self.pools:
            self.pools[where] = self._pool(stage, where)
        return self.pools[where]

    def _pool(self, stage: Stage, where: Path) -> Path | None:
        if stage.distill is None:
            raise ValueError(f"stage {stage.index} ({stage.name}) has no distill table, so no "
                             f"distill-data file to train on")
        kept = where / "selfgen.jsonl"
        if not kept.is_file():
            self._distill(stage, where, kept)
        if kept.read_text().strip():
            return kept
        if not self.smoke:
            raise ValueError(f"stage {stage.index} ({stage.name}): distill-data kept no answer "
                             f"({where / 'distill.jsonl'})")
        _note(f"stage {stage.index} {stage.name}: the smoke model kept no answer; its "
              f"stage trains without self-distillation")
        return None

    def _distill(self, stage: Stage, where: Path, kept: Path) -> None:
        from celeris.train.selfgen import distill_data

        teacher = self.model(stage.init)
        spec, raw = stage.distill, where / "distill.jsonl"
        for requests, tasks in spec["passes"]:
            _note(f"stage {stage.index} {stage.name}: distill-data {self.count(requests)} "
                  f"requests, {self.count(tasks)} tasks from {teacher}")
            distill_data(teacher, raw, requests=self.count(requests), tasks=self.count(tasks),
                         batch=spec["batch"], seed=spec["seed"], resume=True,
                         progress=self.progress, relabel_requests=spec["relabel"],
                         correct_requests=spec["correct"], min_arcs=spec["min_arcs"],
                         temperature=spec["temperature"], free=spec["free"])
        records = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
        lines = [json.dumps(r) for r in records
                 if "done" not in r and r.get("source") not in spec["drop"]]
        tmp = kept.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, kept)


def run_recipe(path: str | Path, out: str | Path | None = None, *, from_stage: int = 0,
               steps_scale: float = 1.0, smoke: bool = False, progress: bool | None = None,
               card: bool = True) -> dict[str, Any]:
    """Make every stage of the recipe at ``path`` from ``from_stage`` on (earlier ones must be
    finished under ``out``), then regenerate the last model's card (not for block-diffusion
    models, whose card ``eval --card`` refuses). ``out`` defaults to ``runs/<model>``;
    ``progress`` (a bar per stage) defaults to whether stdout is a terminal."""
    recipe = load_recipe(path)
    last = len(recipe.stages) - 1
    if not isinstance(from_stage, int) or not 0 <= from_stage <= last:
        raise ValueError(f"from_stage must be a stage of {recipe.path.name} (0-{last}), "
                         f"got {from_stage!r}")
    if not isinstance(steps_scale, (int, float)) or not 0 < steps_scale <= 1:
        raise ValueError(f"steps_scale must be in (0, 1], got {steps_scale!r}")
    out = Path(out) if out is not None else Path("runs") / recipe.model
    space = Workspace(recipe, out, from_stage=from_stage, steps_scale=float(steps_scale),
                      smoke=smoke, progress=sys.stdout.isatty() if progress is None else progress)
    for index in range(from_stage, last + 1):
        space.model(Ref(recipe.path, index))
    final = space.stage_dir(Ref(recipe.path, last))
    stage = space.stage(space.resolve(Ref(recipe.path, last)))
    written = None
    if card and stage.kind == "bd":
        _note(f"{recipe.model} is a block-diffusion model: eval --card refuses it (its card is "
              f"kept by hand), so no card is written; score it with celeris eval --model {final}")
    elif card:
        from celeris.evals.card import regenerate_card
        n = SMOKE_EVAL if smoke else None
        written = str(regenerate_card(final, stage.kind, limit=n, openings=n,
                                      recipe=recipe.path))
    return {"recipe": str(recipe.path), "model": str(final), "stages": last + 1,
            "from_stage": from_stage, "card": written}
