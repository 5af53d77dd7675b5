"""Every playground tab with a block-diffusion (block-causal) model loaded, without a browser.

The shipped default, models/celeris-tiny-bd, is block-causal: gen length is a cap, block
lengths must divide the model's block size, and it cannot infill. Here random tiny models
(tests/tiny_model.py) stand in for it at several block sizes, so that nothing depends on the
shipped model's block size or threshold; the Infill tab falls back to a tiny full-attention
model (EngineSlot.canvas_model). The tabs' generators are driven directly.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

import ui
from celeris import Engine, GenerationParams
from celeris.families import BlockLayout
from tests.tiny_model import make_tiny_model_dir
from ui import limits, render
from ui.api_tab import snippets
from ui.chat import _preset, make_respond
from ui.context import EngineSlot
from ui.infill import make_fill, model_note
from ui.playground import after_run, make_generate, make_preset, replay_at
from ui.settings import FIELDS, PRESETS, build_params, preset_settings, preset_values
from ui.trajectory import Trajectory

PROMPT = "Once upon a time"


def check_block_params(params: GenerationParams, size: int) -> None:
    """What the engine asks of a request for a block-causal model of ``size`` (its layout)."""
    BlockLayout(SimpleNamespace(block_size=size), 0).check(params)

BLOCK_SIZES = (4, 8, 16)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bd-ui-models")
    out = {f"bd{size}": make_tiny_model_dir(
        root / f"tiny-bd{size}", shift_logits=True, attention="block_causal", block_size=size,
        generation_defaults={"gen_length": 64, "temperature": 0.0, "decoding": "threshold",
                             "threshold": 0.6, "suppress_eos": True})
        for size in (4, 8)}
    out["full"] = make_tiny_model_dir(root / "tiny-full", generation_defaults={
        "gen_length": 32, "block_length": 8, "decoding": "fixed", "cache": "none"})
    return out


@pytest.fixture(scope="module", params=(4, 8))
def bd_engine(request, dirs):
    return Engine.from_pretrained(dirs[f"bd{request.param}"], device="cpu")


def bd_defaults(size: int) -> GenerationParams:
    return GenerationParams(gen_length=64, block_length=size, decoding="threshold",
                            threshold=0.6, cache="prefix")


def expected_starts(engine: Engine, prompt, length: int) -> list[int]:
    """Where the model's blocks start on the answer canvas: the first one ends where the
    prompt's last block does."""
    size = engine.block_size
    first = -len(engine.tokenizer.encode_prompt(prompt)) % size or size
    return [0] + list(range(first, length, size))


# ---------------------------------------------------------------------- settings, pure
@pytest.mark.parametrize("size", BLOCK_SIZES)
@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("gen_length", (8, 40, 64, 200))
def test_every_preset_is_valid_for_a_block_model(size, name, gen_length):
    defaults = bd_defaults(size)
    values = preset_values(name, gen_length, size, defaults)
    params = build_params(defaults, dict(zip(FIELDS, values + [0])))
    check_block_params(params, size)              # what the engine asks of a request
    assert params.gen_length == gen_length              # a cap: kept as the user set it
    assert params.block_length == (1 if name == "story" else size)
    if name == "fast":                                  # the model's own threshold and cache
        assert (params.decoding, params.threshold, params.cache) == ("threshold", 0.6, "prefix")
    if name == "balanced":
        assert params.threshold >= defaults.threshold and params.cache == "prefix"


def test_fast_keeps_a_sub_block_default_and_full_attention_presets_are_unchanged():
    sub = bd_defaults(8).replace(block_length=4)
    assert preset_settings("fast", 64, 8, sub)["block_length"] == 4
    assert preset_values("fast", 64) == [0, 0.0, 64, 32, 0.9, "threshold", "low_confidence",
                                         "prefix"]
    assert preset_values("quality", 48)[3] == 24         # divides gen length


@pytest.mark.parametrize("size", BLOCK_SIZES)
@pytest.mark.parametrize("name", list(PRESETS))
def test_chat_presets_are_valid_for_a_block_model(size, name):
    defaults = bd_defaults(size)
    params = defaults.replace(gen_length=48, **_preset(name, 48, size, defaults))
    check_block_params(params, size)
    assert "steps" not in _preset(name, 48, size, defaults)
    full = {k: v for k, v in PRESETS[name].items() if k != "steps"}   # full attention: as
    assert _preset(name, 16) == {**full, "block_length": min(full["block_length"], 16)}  # before


@pytest.mark.parametrize("size", BLOCK_SIZES)
def test_block_length_choices_divide_the_model_block_and_steps_stay_valid(size):
    assert limits.block_choices(256, size) == [d for d in range(1, size + 1) if size % d == 0]
    assert limits.fit_block(32, 256, size) == size and limits.fit_block(3, 256, size) <= 3
    for gen in (8, 60, 200):       # gen length need not be whole blocks here
        for block in limits.block_choices(gen, size):
            stride = limits.steps_stride(gen, block)
            for steps in range(stride, gen + 1, stride):
                GenerationParams(gen_length=gen, block_length=block, steps=steps)


# ---------------------------------------------------------------------- the engine
def test_a_block_model_refuses_infill_naming_itself_and_the_full_canvas_model(bd_engine):
    name = bd_engine.model_dir.name
    for call in (lambda: bd_engine.infill_text("a [MASK] b"),
                 lambda: list(bd_engine.stream_infill("a [MASK] b"))):
        with pytest.raises(ValueError, match=f"{name} is a block-diffusion") as info:
            call()
        assert "cannot fill [MASK] spans" in str(info.value)
        assert "models/celeris-tiny" in str(info.value)
    with pytest.raises(ValueError, match="models/celeris-tiny"):   # a canvas given directly
        bd_engine.prepare([1, 5, 6], bd_engine.default_params().replace(gen_length=4),
                          canvas=[3, 3, 3, 3])
    info = bd_engine.info()
    assert info["attention"] == "block_causal" and info["block_size"] == bd_engine.block_size


# ---------------------------------------------------------------------- the tabs
def test_the_whole_ui_builds_around_a_block_model(bd_engine, dirs):
    slot = EngineSlot(bd_engine, canvas_path=dirs["full"])
    assert slot.block_size() == bd_engine.block_size
    assert isinstance(ui.build_blocks(slot), gr.Blocks)
    assert "blocks of" in render.model_markdown(bd_engine.info())


@pytest.mark.parametrize("name", list(PRESETS))
def test_playground_runs_every_preset_and_its_canvas_shows_the_model_blocks(bd_engine, dirs,
                                                                            name):
    slot = EngineSlot(bd_engine, canvas_path=dirs["full"], frame_interval=0.0)
    values = make_preset(slot)(name, 20)                 # what the preset radio sets
    frames = list(make_generate(slot)(PROMPT, False, *values, 0, None))
    assert frames[0][0] == []                            # nothing painted before the 1st block
    cells, text, gauges, summary, data = frames[-1]
    assert gauges["state"] == "done" and data is not None
    parsed = [render.parse_cell(c) for c in cells]
    assert 0 < len(parsed) <= 20 + bd_engine.block_size
    starts = [i for i, c in enumerate(parsed) if " bs" in c["b"]]
    assert starts == expected_starts(bd_engine, PROMPT, len(parsed))
    tints = [c["b"].split()[0] for c in parsed]         # alternating tint per model block
    assert all(tints[i] != tints[i - 1] for i in starts[1:])
    # the replay steps through the growing canvas: step 1 shows only the first block
    n = Trajectory.from_dict(data).num_steps
    assert after_run(data)[1].startswith(f"step {n} of {n}")
    first, caption, _ = replay_at(data, 1)
    assert len(first) == (starts[1] if len(starts) > 1 else len(parsed))
    assert "step 1 of" in caption


def test_chat_answers_with_every_preset_on_a_block_model(dirs):
    slot = EngineSlot(Engine.from_pretrained(dirs["bd8"], device="cpu"), frame_interval=0.0)
    history = [{"role": "user", "content": "hello"}]
    for name in PRESETS:
        replies = [chat for chat, _ in make_respond(slot)(history, name, 16, None)]
        assert replies and replies[-1][-1]["role"] == "assistant"
        assert replies[-1][-1]["content"]


def test_infill_runs_on_the_full_canvas_model_and_says_so(bd_engine, dirs):
    slot = EngineSlot(bd_engine, canvas_path=dirs["full"], frame_interval=0.0)
    note = model_note(slot)
    assert "full-canvas model **tiny-full** (loaded on the first fill)" in note
    assert f"**{bd_engine.model_dir.name}**, is block diffusion" in note
    frames = list(make_fill(slot)("Once upon a [MASK] there was a fox.", 2, "fixed", None))
    assert frames[0][2]["state"] == "loading"
    cells, filled, gauges, _, used = frames[-1]
    assert gauges["state"] == "done" and slot.canvas_loaded
    assert "**tiny-full**" in used and "(loaded on the first fill)" not in used
    kinds = [render.parse_cell(c)["k"] for c in cells]
    assert any(k.startswith("pin") for k in kinds) and not any(k.startswith("mask")
                                                               for k in kinds)
    assert filled.startswith("Once upon a") and filled.endswith(" there was a fox.")
    again = list(make_fill(slot)("A [MASK] fox.", 1, "threshold", None))
    assert again[0][2]["state"] != "loading"             # loaded once
    slot.canvas_model()[0].stop()


def test_infill_without_a_full_canvas_model_says_what_to_do(bd_engine, tmp_path):
    slot = EngineSlot(bd_engine, canvas_path=tmp_path / "nothing-here", frame_interval=0.0)
    assert "no full-canvas model at" in model_note(slot)
    frames = []
    with pytest.raises(gr.Error) as info:
        for frame in make_fill(slot)("Once upon a [MASK] there was a fox.", 1, "fixed",
                                     None):
            frames.append(frame)
    message = str(info.value.message)
    assert "is a block-diffusion model" in message and "models/celeris-tiny" in message
    assert "no full-canvas model at" in message and "Traceback" not in message
    assert frames[-1][2]["state"] == "error" and "models/celeris-tiny" in frames[-1][3]


def test_a_full_attention_model_fills_itself(dirs):
    engine = Engine.from_pretrained(dirs["full"], device="cpu")
    slot = EngineSlot(engine, canvas_path=dirs["full"], frame_interval=0.0)
    assert model_note(slot) == "Fills with the loaded model, **tiny-full** (full attention)."
    frames = list(make_fill(slot)("Once upon a [MASK] there was a fox.", 1, "fixed", None))
    assert frames[-1][2]["state"] == "done"
    assert slot.canvas_model()[0] is engine          # the same directory: one shared engine


def test_the_api_tab_snippet_uses_the_loaded_model_block_length(bd_engine):
    params = bd_engine.default_params()
    code = snippets("http://x", "m", False, params)["gradio_client"]
    assert f"64, {params.block_length}, {params.threshold:g}," in code
