"""``celeris average``: the uniform mean of several runs' weights (a model soup)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from celeris.cli import main
from celeris.train.average import average

SHIPPED = Path("models/celeris-tiny-bd")


def _model(d: Path, w: torch.Tensor, steps: torch.Tensor, config=None) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config or {"hidden_size": 2, "block_size": 4}))
    (d / "tokenizer.json").write_text(json.dumps({"vocab": ["a", "b"]}))
    (d / "train_log.json").write_text(json.dumps({"out": str(d)}))
    save_file({"w": w, "steps": steps}, str(d / "model.safetensors"))
    return d


def test_the_mean_of_the_float_weights_and_the_first_models_files(tmp_path):
    a = _model(tmp_path / "a", torch.tensor([1.0, 2.0]), torch.tensor([3]))
    b = _model(tmp_path / "b", torch.tensor([2.0, 4.0]), torch.tensor([3]))
    c = _model(tmp_path / "c", torch.tensor([3.0, -3.0]), torch.tensor([3]))
    info = average([a, b, c], tmp_path / "out")
    state = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(state["w"], torch.tensor([2.0, 1.0]))
    assert torch.equal(state["steps"], torch.tensor([3]))
    assert json.loads((tmp_path / "out" / "train_log.json").read_text()) == {"out": str(a)}
    saved = json.loads((tmp_path / "out" / "average.json").read_text())
    assert saved == info and saved["sources"] == [str(a), str(b), str(c)]


def test_bad_inputs_are_refused_by_name(tmp_path):
    a = _model(tmp_path / "a", torch.ones(2), torch.tensor([1]))
    b = _model(tmp_path / "b", torch.ones(2), torch.tensor([2]))
    other = _model(tmp_path / "o", torch.ones(2), torch.tensor([1]),
                   {"hidden_size": 2, "block_size": 8})
    shape = _model(tmp_path / "s", torch.ones(3), torch.tensor([1]))
    with pytest.raises(ValueError, match="at least 2 models, got 1"):
        average([a], tmp_path / "out")
    with pytest.raises(ValueError, match="named twice"):
        average([a, tmp_path / "a"], tmp_path / "out")
    with pytest.raises(ValueError, match="--out .* is one of the models"):
        average([a, b], a)
    with pytest.raises(ValueError, match="first difference: 'block_size'"):
        average([a, other], tmp_path / "out")
    with pytest.raises(ValueError, match="w differs in shape"):
        average([a, shape], tmp_path / "out")
    with pytest.raises(ValueError, match="integer tensor steps differs"):
        average([a, b], tmp_path / "out")
    (b / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors in"):
        average([a, b], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_cli_reports_a_mistake_without_a_traceback(tmp_path, capsys):
    assert main(["average", str(SHIPPED), "--out", str(tmp_path / "out")]) == 2
    assert "error: average needs at least 2 models, got 1" in capsys.readouterr().err


def test_the_mean_of_a_model_with_itself_decodes_as_the_model(tmp_path):
    from celeris import Engine
    for name in ("a", "b"):
        shutil.copytree(SHIPPED, tmp_path / name)
    assert main(["average", str(tmp_path / "a"), str(tmp_path / "b"),
                 "--out", str(tmp_path / "out")]) == 0
    mine, shipped = (load_file(str(p / "model.safetensors"))
                     for p in (tmp_path / "out", SHIPPED))
    assert all(torch.equal(mine[k], shipped[k]) for k in shipped)
    prompt = [{"role": "user", "content": "sort: 4 1 3"}]
    mean_engine, engine = (Engine.from_pretrained(str(p)) for p in (tmp_path / "out", SHIPPED))
    got = mean_engine.generate(prompt, mean_engine.default_params().replace(gen_length=8)).text
    assert got == engine.generate(prompt, engine.default_params().replace(gen_length=8)).text
    assert got.strip() == "1 3 4"
