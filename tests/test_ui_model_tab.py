"""The Model tab and the per-session engine (ui/model_tab.py, ui/context.py's EngineSlot),
tested on handlers without a browser: a session's choice changes only that session and engines
are shared, only offered models load, a failed load is a status line, and presets and Race
titles follow the session's model."""

from __future__ import annotations

import os

import gradio as gr

from celeris import GenerationParams
from tests.ui_fakes import NO_PROGRESS, FakeEngine, request
from ui.context import EngineSlot
from ui.model_tab import make_choose


def test_choosing_a_model_changes_only_that_session_and_shares_engines(tmp_path):
    loads = []

    def factory(path, device, dtype):
        loads.append((path, device, dtype))
        return FakeEngine(path)

    primary = FakeEngine(tmp_path / "served")
    slot = EngineSlot(primary, models=[tmp_path / "b", tmp_path / "c"], device="cpu",
                      engine_factory=factory)
    assert list(slot.models) == ["served", "b", "c"]
    choose = make_choose(slot)
    info, status = choose("b", request("alice"), progress=NO_PROGRESS)
    assert "`b`" in info and "This tab now runs **b**" in status
    assert slot.session(request("alice")).engine.model_dir.name == "b"
    assert slot.session(request("bob")).engine is primary and slot.engine is primary
    choose("b", request("bob"), progress=NO_PROGRESS)
    assert slot.session(request("bob")).engine is slot.session(request("alice")).engine
    assert loads == [(str((tmp_path / "b").resolve()), "cpu", "auto")]   # loaded once
    assert slot.chosen("alice") == "b" and slot.chosen("carol") == "served"
    choose("served", request("alice"), progress=NO_PROGRESS)
    assert slot.session(request("alice")).engine is primary
    slot.forget("bob")
    assert slot.session(request("bob")).engine is primary
    slot.close()
    assert not primary.stopped                       # the /v1 engine is never stopped


def test_only_offered_models_load_unless_the_operator_allows_paths(tmp_path):
    loads = []
    factory = lambda path, device, dtype: loads.append(path) or FakeEngine(path)  # noqa: E731
    closed = EngineSlot(None, models=[tmp_path / "b"], engine_factory=factory)
    choose = make_choose(closed)
    info, status = choose("/etc", request("mallory"), progress=NO_PROGRESS)
    assert info == gr.skip() and "offered models (b)" in status and loads == []
    assert closed.session(request("mallory")).engine is None
    opened = EngineSlot(None, models=[tmp_path / "b"], allow_paths=True,
                        engine_factory=factory)
    make_choose(opened)(str(tmp_path / "mine"), request("op"), progress=NO_PROGRESS)
    assert opened.session(request("op")).engine.model_dir.name == "mine"


def test_a_failed_model_load_is_a_status_line_not_an_error(tmp_path):
    from ui.context import EngineSlot
    from ui.model_tab import make_choose

    def refuse(path, device, dtype):
        raise FileNotFoundError(f"model directory not found: {path}")

    slot = EngineSlot(None, models=[tmp_path / "broken"], engine_factory=refuse)
    choose = make_choose(slot)
    info, status = choose("broken", None, progress=lambda *a, **k: None)
    assert info == gr.skip() and "Could not load the model" in status and "broken" in status
    info, status = choose("  ", None, progress=lambda *a, **k: None)
    assert "Pick one of the offered models" in status


def test_the_playground_follows_a_session_model_for_presets_and_titles(tmp_path):
    """Presets and Race titles come from the session's model, not the app's default."""
    from ui.playground import make_preset
    from ui.race import headers

    class Block(FakeEngine):
        block_causal, block_size = True, 4

        def default_params(self):
            return GenerationParams(gen_length=256, block_length=4, decoding="ltr",
                                    threshold=0.85, cache="prefix")

    class Full(FakeEngine):
        block_causal = False

        def default_params(self):
            return GenerationParams(gen_length=64, block_length=32, steps=64)

    slot = EngineSlot(Full(tmp_path / "full"), models=[tmp_path / "bd"],
                      engine_factory=lambda path, device, dtype: Block(path))
    make_choose(slot)("bd", request("a"), progress=NO_PROGRESS)
    mine = make_preset(slot)("fast", 64, request("a"))
    theirs = make_preset(slot)("fast", 64, request("b"))
    assert (mine[3], mine[5]) == (4, "ltr") and (theirs[3], theirs[5]) == (32, "threshold")
    assert "Block diffusion · bd" in headers(slot.session(request("a")))[0]
    assert "Fast configuration · full" in headers(slot.session(request("b")))[0]
    assert os.path.basename(str(slot.session(request("b")).engine.model_dir)) == "full"
