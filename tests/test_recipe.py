"""Recipes: the shipped models' recipe files parse, and ``celeris train --recipe`` runs one end to
end at a smoke scale, skipping finished stages and resuming from --from-stage."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from celeris import cli
from celeris.pipeline import run_recipe
from celeris.train.recipe import Ref, load_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {name: ROOT / "models" / name / "recipe.toml"
           for name in ("celeris-tiny", "celeris-tiny-ar", "celeris-tiny-bd")}


@pytest.fixture
def one_thread(monkeypatch):
    monkeypatch.setenv("CELERIS_THREADS", "1")


def _log_chain(model: str) -> list[dict]:
    """The shipped model's training log and every run it started from, last run first."""
    info, chain = json.loads((ROOT / "models" / model / "train_log.json").read_text()), []
    while info:
        chain.append(info)
        info = info.get("init_info")
    return chain


def _trained(recipe) -> list:
    """The recipe's stages that it trains itself (not ``same_as``), in order."""
    return [s for s in recipe.stages if s.same_as is None]


@pytest.mark.parametrize("model", list(RECIPES))
def test_each_shipped_recipe_names_the_runs_of_its_models_training_log(model):
    recipe = load_recipe(RECIPES[model])
    assert recipe.model == model
    chain = _log_chain(model)
    for stage in _trained(recipe):
        run = stage.runs[0]["name"] if stage.runs else stage.name
        logged = [c for c in chain      # a hand-run stage's own name, a recipe run's stage-NN
                  if Path(str(c.get("out"))).name in (run, f"stage-{stage.index:02d}")]
        if not logged:
            continue                        # the ar stages of celeris-tiny-bd's chain: the twin's
        log = logged[0]
        tc = log["train_config"]
        assert (stage.kind, stage.steps, stage.seed) == (log["kind"], log["steps"], log["seed"])
        assert stage.settings.get("lr", 2e-3) == pytest.approx(tc["lr"])
        assert stage.settings.get("tokens_per_batch", 2048) == tc["tokens_per_batch"]
        if tc.get("mix"):
            assert {k: float(v) for k, v in stage.settings["mix"].items()} == tc["mix"]
        assert stage.settings.get("certainty", 0.0) == (tc.get("certainty") or 0.0)
        assert (stage.settings.get("selfgen_prob") or 0.0) == (tc.get("selfgen_prob") or 0.0)
        assert stage.settings.get("asks") == tc.get("asks")
        assert (stage.settings.get("free") or 0.0) == (tc.get("free") or 0.0)


def test_the_block_models_recipe_records_its_distill_rounds_and_averages():
    bd = load_recipe(RECIPES["celeris-tiny-bd"])
    assert [s.index for s in bd.stages if s.same_as] == [*range(7), 16]
    assert all(s.same_as.recipe == RECIPES["celeris-tiny-ar"] for s in bd.stages[:7])
    assert bd.stages[16].same_as == Ref(RECIPES["celeris-tiny-ar"], 17)   # the taught twin
    assert [s.index for s in bd.stages if s.distill] == [10, 11, 12, 13, 14, 15, 19, 20, 21,
                                                         22, 23, 24]
    assert [s.distill["temperature"] for s in bd.stages[19:]] == [0.8, 0.0, 0.0, 0.0, 0.8, 0.0]
    assert all(s.settings["asks"]["fields"] == ["adj", "place", "obj"] for s in bd.stages[17:20])
    assert all(s.settings["asks"] == {"share": 0.6, "fields": ["adj"]} for s in bd.stages[20:22])
    # free phrasing: the last three rounds ask freely, in training and in their distill prompts
    assert [s.settings.get("free") for s in bd.stages[21:]] == [None, 0.7, 0.8, 0.8]
    assert [s.distill["free"] for s in bd.stages[21:]] == [0.0, 0.7, 0.8, 0.9]
    assert bd.stages[24].settings["asks"] == {"share": 0.5, "fields": ["adj", "place"]}
    assert bd.stages[11].distill["passes"] == [(900, 900), (2700, 1200)]
    assert bd.stages[13].distill["drop"] == ["task"]
    assert (bd.stages[10].distill["relabel"], bd.stages[12].distill["correct"]) == (False, False)
    assert bd.stages[15].distill["min_arcs"] == 4
    assert [[r.get("masking", "random") for r in s.runs] for s in bd.stages[13:16]] == \
        [["random", "suffix"]] * 3
    assert {s.settings["block_size"] for s in bd.stages[7:] if not s.same_as} == {4}
    twin = load_recipe(RECIPES["celeris-tiny-ar"])
    assert [(s.index, s.selfgen) for s in twin.stages if s.selfgen] == [
        (i, Ref(RECIPES["celeris-tiny-bd"], i)) for i in range(10, 16)]


@pytest.mark.parametrize("text,message", [
    ('model = "m"\n', "at least one"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\n', "steps must be an integer >= 1"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "gpt"\nsteps = 1\n', "kind must be one of"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\nsteps = 1\nlrr = 1\n',
     r"stage 0: unknown key\(s\) lrr"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\nsteps = 1\nlr = 5\n', "lr must be in"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\nsteps = 1\nfrom = 0\n',
     "from must name an earlier stage"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\nsteps = 1\nmasking = "suffix"\n',
     "masking is a block-diffusion"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\nsteps = 1\n'
     'asks = { share = 2, fields = ["adj"] }\n', r"stage 0: asks.share must be in \(0, 1\]"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "bd"\nsteps = 1\n'
     'distill = { requests = 1, tasks = 1 }\n', "selfgen_prob goes with distill"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "bd"\nsteps = 1\nselfgen_prob = 0.5\n'
     'distill = { requests = [1, 2], tasks = 1 }\n', "as many passes"),
    ('model = "m"\n[[stage]]\nname = "a"\nkind = "bd"\nsteps = 1\nruns = [{ name = "x" }]\n',
     "at least 2 runs"),
    ('model = "m"\n[[stage]]\nname = "a"\nsame_as = { recipe = "nowhere.toml", stage = 0 }\n',
     "no recipe at"),
])
def test_a_bad_recipe_is_refused_naming_the_stage_and_key(tmp_path, text, message):
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_recipe(path)


def test_the_twins_recipe_runs_every_stage_at_smoke_scale_in_under_a_minute(tmp_path,
                                                                             one_thread, capsys):
    """The acceptance run: every stage of the twin's recipe, the block model's stages its
    self-distillation files come from, and the card at the end."""
    out = tmp_path / "ar"
    started = time.monotonic()
    assert cli.main(["train", "--recipe", str(RECIPES["celeris-tiny-ar"]), "--steps-scale",
                     "0.01", "--smoke", "--out", str(out)]) == 0
    took = time.monotonic() - started
    assert took < 60, f"the smoke recipe took {took:.0f} s"
    assert "19 stages ->" in capsys.readouterr().out
    for n in range(19):
        made = json.loads((out / f"stage-{n:02d}" / "stage.json").read_text())
        assert made["stage"] == n and made["preset"] == "micro"
    log = json.loads((out / "stage-15" / "train_log.json").read_text())
    assert log["kind"] == "ar" and log["steps"] == 10 and log["seed"] == 3
    assert log["init_from"] == str(out / "stage-14")
    taught = json.loads((out / "stage-17" / "train_log.json").read_text())   # the bd's start
    assert (taught["steps"], taught["seed"], taught["init_from"]) == (8, 1, str(out / "stage-16"))
    assert taught["train_config"]["asks"] == {"share": 1.0, "fields": ["place", "obj"]}
    free = json.loads((out / "stage-18" / "train_log.json").read_text())     # the shipped twin
    assert (free["steps"], free["seed"], free["init_from"]) == (5, 2, str(out / "stage-17"))
    assert free["train_config"]["free"] == 0.8
    needs = out / "needs" / "celeris-tiny-bd"
    assert (needs / "stage-15" / "selfgen.jsonl").is_file()      # the twin's last distill file
    assert json.loads((needs / "stage-07" / "stage.json").read_text())["init_from"] == \
        str(out / "stage-06")                                     # the twin's stage, shared
    assert (needs / "stage-14" / "average.json").is_file()
    card = (out / "stage-18" / "README.md").read_text()
    assert "celeris train --recipe models/celeris-tiny-ar/recipe.toml" in card
    assert json.loads((out / "stage-18" / "eval.json").read_text())["n_per_task"] == 2


def test_finished_stages_are_skipped_and_from_stage_needs_the_earlier_ones(tmp_path,
                                                                          one_thread):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('model = "m"\n'
                      '[[stage]]\nname = "a"\nkind = "ar"\nsteps = 400\n'
                      '[[stage]]\nname = "b"\nkind = "bd"\nblock_size = 4\nsteps = 300\n'
                      'runs = [{ name = "r" }, { name = "s", masking = "suffix" }]\n'
                      '[[stage]]\nname = "c"\nkind = "ar"\nsteps = 200\nfrom = 0\n')
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match="--from-stage 1: stage 0 .a. is not finished"):
        run_recipe(recipe, out, from_stage=1, steps_scale=0.01, smoke=True, card=False)
    first = run_recipe(recipe, out, steps_scale=0.01, smoke=True, card=False)
    assert first["model"] == str(out / "stage-02")
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("model.safetensors")}
    assert len(stamps) == 5                   # a, b's two runs and their mean, c
    run_recipe(recipe, out, steps_scale=0.01, smoke=True, card=False)
    (out / "stage-02" / "stage.json").unlink()          # c as if it had been cut short
    run_recipe(recipe, out, from_stage=2, steps_scale=0.01, smoke=True, card=False)
    after = {p: p.stat().st_mtime_ns for p in out.rglob("model.safetensors")}
    assert {p: t for p, t in after.items() if "stage-02" not in str(p)} == \
        {p: t for p, t in stamps.items() if "stage-02" not in str(p)}
    assert json.loads((out / "stage-02" / "stage.json").read_text())["init_from"] == \
        str(out / "stage-00")
    with pytest.raises(ValueError, match="made with steps_scale=0.01"):
        run_recipe(recipe, out, steps_scale=0.02, smoke=True, card=False)


def test_an_interrupted_stage_resumes_from_its_last_checkpoint(tmp_path, one_thread,
                                                               monkeypatch):
    from celeris.train import trainer
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('model = "m"\n[[stage]]\nname = "a"\nkind = "ar"\nsteps = 20\n')
    run_recipe(recipe, tmp_path / "whole", smoke=True, card=False)
    real = trainer.train

    def cut(*args, **kw):                     # the first call stops at step 10, as if killed
        monkeypatch.setattr(trainer, "train", real)
        real(*args, stop_at=10, **kw)
        raise KeyboardInterrupt
    monkeypatch.setattr(trainer, "train", cut)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(recipe, tmp_path / "cut", smoke=True, card=False)
    assert not (tmp_path / "cut" / "stage-00" / "stage.json").exists()
    run_recipe(recipe, tmp_path / "cut", smoke=True, card=False)
    logs = [json.loads((tmp_path / d / "stage-00" / "train_log.json").read_text())
            for d in ("whole", "cut")]
    assert logs[1]["steps"] == 20 and logs[1]["losses"] == logs[0]["losses"]


def test_the_full_canvas_recipe_runs_its_first_stages_at_smoke_scale(tmp_path, one_thread):
    """celeris-tiny: its stage 0 is the twin's (made under needs/), stage 1 adapts it."""
    out = tmp_path / "tiny"
    with pytest.raises(ValueError, match="from_stage must be a stage of recipe.toml .0-2."):
        run_recipe(RECIPES["celeris-tiny"], out, from_stage=3, smoke=True)
    recipe = load_recipe(RECIPES["celeris-tiny"])
    from celeris.pipeline import Workspace
    space = Workspace(recipe, out, steps_scale=0.005, smoke=True)
    first = space.model(Ref(recipe.path, 1))
    assert first == out / "stage-01"
    assert space.stage_dir(Ref(recipe.path, 0)) == out / "needs" / "celeris-tiny-ar" / "stage-00"
    log = json.loads((first / "train_log.json").read_text())
    assert (log["kind"], log["steps"]) == ("diffusion", 40)
