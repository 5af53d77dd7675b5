"""The playground's pure helpers (ui/render, ui/trajectory, ui/settings, ui/charts, ...),
tested without a server or a browser."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from celeris import GenerationParams
from celeris.outputs import FinishReason, GenerationResult, StepEvent, Timings, Usage
from ui import charts, render
from ui.api_tab import base_url, snippets
from ui.chat import reply_so_far
from ui.race import notice_cells, race_params, race_summary, stats
from ui.settings import FIELDS, PRESETS, build_params, preset_values, widget_values
from ui.trajectory import Trajectory

M = 99   # mask id of the fake runs below
STRINGS = {1: "Hello", 2: " world", 3: "<b>bold</b>", 4: "", 5: "\n", 6: "${alert(1)}"}


def token_text(ids):
    return [STRINGS.get(t, f"t{t}") for t in ids]


def event(step, canvas, committed, confs, block=0, block_length=2, finished=False, nfe=None,
          edited=(), draft=()):
    return StepEvent("r1", step, block, tuple(canvas), tuple(committed), tuple(confs),
                     step if nfe is None else nfe, 0.01 * step, "", M, block_length, finished,
                     tuple(edited), tuple(draft))


def result(text="Hello world", tokens=2, nfe=3, total=0.03, finish=FinishReason.LENGTH):
    return GenerationResult("r1", text, tuple(range(tokens)), (), finish, nfe, nfe,
                            Timings(total_s=total), Usage(5, tokens), seed=7)


def run(finish=True):
    """Canvas of 4 in blocks of 2: step 1 commits pos 1, step 2 pos 0, step 3 pos 2."""
    traj = Trajectory(4, 2)
    traj.add(event(1, [M, 2, M, M], [1], [0.5]), token_text)
    traj.add(event(2, [1, 2, M, M], [0], [0.9]), token_text)
    traj.add(event(3, [1, 2, 4, M], [2], [0.99], block=1), token_text)
    if finish:
        traj.finish(result())
    return traj


def canvas(*args, **kwargs):
    return [render.parse_cell(c) for c in render.canvas_cells(*args, **kwargs)]


def masked(*args):
    return [render.parse_cell(c) for c in render.masked_cells(*args)]


def kinds(cells):
    return [c["k"].split()[0] for c in cells]


# ---------------------------------------------------------------------- escaping
@pytest.mark.parametrize("raw,forbidden", [
    ("<script>alert(1)</script>", "<script"),
    ('<img src=x onerror="alert(1)">', "<img"),
    ("${document.cookie}", "${"),
    ("`backtick`", "`"),
    ("back\\slash", "\\"),
    ("{{value}}", "{{"),
])
def test_escape_text_neutralises_html_and_template_syntax(raw, forbidden):
    out = render.escape_text(raw)
    assert forbidden not in out
    assert "<" not in out and ">" not in out


def test_escape_text_keeps_plain_text_and_round_trips():
    import html
    assert render.escape_text("a story, 3 + 4") == "a story, 3 + 4"
    raw = "<b>x</b> ${y} `z` \\ {w}"
    assert html.unescape(render.escape_text(raw)) == raw


def test_html_in_a_pinned_prompt_token_is_shown_as_text():
    traj = Trajectory(0, 4)
    traj.add(event(1, [3, 6, M, 1], [2], [0.7], block_length=4), token_text)
    cells = canvas(traj)
    assert kinds(cells) == ["pin", "pin", "new", "pin"]
    assert cells[0]["t"] == "&lt;b&gt;bold&lt;/b&gt;"
    assert "${" not in cells[1]["t"] and "alert(1)" in cells[1]["t"]


def test_token_label_makes_whitespace_and_end_visible():
    assert render.token_label("\n") == "\u21b5"
    assert render.token_label("") == render.END_GLYPH
    assert render.token_label(" a") == " a"


# ---------------------------------------------------------------------- canvas
def test_live_canvas_distinguishes_mask_new_old_and_marks_blocks():
    traj = run(finish=False)
    cells = canvas(traj, live=True)
    assert kinds(cells) == ["old", "old", "new", "mask"]
    assert [("bs" in c["b"]) for c in cells] == [True, False, True, False]
    assert [c["b"].split()[0] for c in cells] == ["b0", "b0", "b1", "b1"]
    assert "act" in cells[3]["b"] and "act" not in cells[0]["b"]   # block 1 is being denoised
    assert cells[3]["t"] == render.MASK_GLYPH


def test_opacity_follows_confidence():
    cells = canvas(run(finish=False))
    assert float(cells[0]["o"]) > float(cells[1]["o"])      # 0.9 vs 0.5
    assert cells[3]["o"] == "1.00"                          # masks are drawn at full opacity
    assert "confidence 0.500" in cells[1]["h"]


def test_finished_canvas_has_no_masks_and_no_fresh_cells():
    cells = canvas(run())
    assert kinds(cells) == ["old", "old", "old", "skip"]
    assert "end" in cells[2]["k"] and cells[2]["t"] == render.END_GLYPH   # id 4 decodes to ""
    assert render.canvas_summary(render.canvas_cells(run())) == \
        {"mask": 0, "new": 0, "old": 3, "pin": 0, "skip": 1}


def test_replay_shows_any_step_again():
    traj = run()
    assert kinds(canvas(traj, 0)) == ["mask"] * 4
    assert kinds(canvas(traj, 1)) == ["mask", "new", "mask", "mask"]
    assert kinds(canvas(traj, 2)) == ["new", "old", "mask", "mask"]
    assert kinds(canvas(traj, 3)) == ["old", "old", "new", "skip"]   # run over
    assert "step 2 of 3" in render.replay_caption(traj, 2)
    assert "every position masked" in render.replay_caption(traj, 0)


def edit_run():
    """Canvas of 4, one block: step 1 commits 0 and 1 (" world"), step 2 commits 2 and
    edits 1 (" world" -> "Hello"), step 3 commits 3."""
    traj = Trajectory(4, 4)
    traj.add(event(1, [1, 2, M, M], [0, 1], [0.9, 0.6], block_length=4), token_text)
    traj.add(event(2, [1, 1, 5, M], [1, 2], [0.8, 0.7], block_length=4, edited=[1]),
             token_text)
    traj.add(event(3, [1, 1, 5, 4], [3], [0.95], block_length=4), token_text)
    return traj


def test_edited_tokens_are_marked_live_and_in_the_replay():
    traj = edit_run()
    before = canvas(traj, 1)                        # the replay before the edit: the old token
    assert kinds(before) == ["new", "new", "mask", "mask"]
    assert before[1]["t"] == " world" and "edit" not in before[1]["k"]
    assert "edited" not in before[1]["h"]
    at = canvas(traj, 2)                            # the step that edited it
    assert [c["k"] for c in at] == ["old", "new edit", "new", "mask"]
    assert at[1]["t"] == "Hello"
    assert 'edited: " world" -> "Hello"' in at[1]["h"] and "confidence 0.800" in at[1]["h"]
    assert "edit" not in at[2]["k"]                 # filled a mask: not an edit
    live = canvas(traj, live=True)                  # later: still marked, as an older commit
    assert [c["k"] for c in live] == ["old", "old edit", "old", "new end"]
    assert 'edited: " world" -> "Hello"' in live[1]["h"]
    assert render.replay_caption(traj, 2).startswith(
        "step 2 of 3 · block 0 · 2 committed this step (1 of them edited) · NFE 2")
    assert "edited" not in render.replay_caption(traj, 3)
    assert traj.canvas_ids() == [1, 1, 5, 4] and traj.commit_steps()[1] == (2, 0.8)
    assert render.canvas_text(traj) == "HelloHello\n"
    traj.finish(result())
    assert " in 3 steps · 1 token edited · NFE 3 · " in render.run_summary(traj)
    bars = charts.commits_per_step(traj).data
    assert (list(bars[0].y), list(bars[1].y)) == ([2, 1, 1], [0, 1, 0])
    assert bars[1].name == "edited"
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert canvas(again, 2) == at


def test_an_edit_note_shows_every_replaced_text_and_escapes_nothing_twice():
    traj = edit_run()
    traj.add(event(4, [1, 6, 5, 4], [1], [0.99], block_length=4, edited=[1]), token_text)
    c = canvas(traj)[1]
    assert c["k"] == "new edit" and c["t"] == "&#36;&#123;alert(1)&#125;"   # the label escaped
    assert c["h"].endswith('edited: " world" -> "Hello" -> "${alert(1)}"')  # the title: plain
    assert "\t" not in render.edit_note(["a\tb"], "\n")


def draft_run(finish=False):
    """DiffusionGemma-like (the canvas grows a canvas of 4 at a time): steps 1 and 2 hold
    drafts, step 3 accepts the canvas at once."""
    traj = Trajectory(0, 4)
    traj.add(event(1, [7, 8, 9, 10], [], [], block_length=4, draft=range(4)), token_text)
    traj.add(event(2, [7, 11, 9, 4], [], [], block_length=4, draft=range(4)), token_text)
    if finish:
        traj.add(event(3, [1, 2, 5, 4], range(4), [1.0] * 4, block_length=4), token_text)
        traj.finish(result())
    return traj


def test_draft_tokens_are_drawn_as_tokens_marked_as_draft():
    traj = draft_run()
    assert traj.pinned == {}                         # a draft is no prompt text
    first, second = canvas(traj, 1), canvas(traj, 2)
    assert kinds(first) == kinds(second) == ["draft"] * 4
    assert [c["t"] for c in first] == ["t7", "t8", "t9", "t10"]
    assert [c["t"] for c in second] == ["t7", "t11", "t9", render.END_GLYPH]
    assert second[3]["k"] == "draft end"
    assert 'draft (not accepted yet): "t11"' in second[1]["h"]
    assert all(render.MASK_GLYPH not in c["t"] for c in second)
    assert render.canvas_text(traj) == render.MASK_GLYPH * 4     # no text accepted yet
    assert traj.filled_tokens() == 0 and traj.answer_tokens() == 0
    assert "4 draft tokens" in render.replay_caption(traj, 2)
    assert render.canvas_summary(render.canvas_cells(traj))["draft"] == 4
    done = draft_run(finish=True)
    assert kinds(canvas(done)) == ["old"] * 4 and kinds(canvas(done, 2)) == ["draft"] * 4
    assert list(charts.commits_per_step(done).data[0].y) == [0, 0, 4]


def test_drafts_of_a_stopped_run_are_not_shown_as_text():
    traj = draft_run()
    traj.finish(result(finish=FinishReason.ABORT))
    assert kinds(canvas(traj)) == ["skip"] * 4
    assert kinds(canvas(traj, 1)) == ["draft"] * 4     # the replay still shows them


def test_masked_cells_before_the_first_step():
    cells = masked(6, 3)
    assert kinds(cells) == ["mask"] * 6
    assert [("bs" in c["b"]) for c in cells] == [True, False, False, True, False, False]


@pytest.mark.parametrize("conf,level", [(0.25, 0.25), (1.7, 1.0), (-math.log(2), 0.5),
                                        (float("inf"), 1.0), (float("nan"), 1.0), (None, 1.0)])
def test_confidence_level(conf, level):
    assert render.confidence_level(conf) == pytest.approx(level)


def test_canvas_text_joins_pinned_and_committed_tokens():
    traj = run(finish=False)
    assert render.canvas_text(traj) == "Hello world" + render.MASK_GLYPH


# ---------------------------------------------------------------------- trajectory
def test_answer_tokens_stop_at_the_first_end_of_text():
    traj = Trajectory(4, 4)
    traj.add(event(1, [1, 4, 2, M], [0, 1, 2], [0.9, 0.9, 0.9], block_length=4), token_text)
    assert traj.answer_tokens() == 1


def test_trajectory_round_trips_through_json():
    traj = run()
    data = json.loads(json.dumps(traj.to_dict()))
    again = Trajectory.from_dict(data)
    assert canvas(again, 2) == canvas(traj, 2)
    assert again.result["text"] == "Hello world" and again.num_steps == 3
    assert data["steps"][0] == {"step": 1, "block": 0, "nfe": 1, "elapsed": 0.01,
                                "committed": [1], "confidences": [0.5], "tokens": [2],
                                "text": "", "length": 4, "edited": [], "texts": [" world"],
                                "draft": [], "draft_tokens": [], "draft_texts": [],
                                "forced": []}


def test_text_at_uses_the_result_once_finished():
    traj = run()
    assert traj.text_at() == "Hello world"
    assert traj.text_at(1) == ""


# ---------------------------------------------------------------------- gauges
def test_gauges_live_and_final():
    live = render.trajectory_gauges(run(finish=False), None, "running")
    assert live["nfe"] == "3" and live["elapsed"] == "0.03 s" and live["state"] == "running"
    # live: the two text tokens committed (not the end of text at 2), labelled as tokens
    assert float(live["tps"]) == pytest.approx(2 / 0.03, rel=1e-2)
    assert (live["tps_label"], live["tpf_label"]) == ("tokens/s", "tokens / forward")
    done = render.trajectory_gauges(run(), {"memory_kind": "rss", "memory_bytes": 3 * 2**20},
                                    "done")
    assert done["tps"] == f"{result().tokens_per_s:.1f}" and done["tpf"] == "0.67"
    assert done["tps_label"] == "tokens/s"
    assert done["mem"] == "3.0 MB" and done["mem_label"] == "RSS (CPU)"


def test_memory_gauge_labels_gpu_and_rss():
    assert render.memory_gauge({"memory_kind": "gpu", "memory_bytes": 2**30}) == \
        ("1.0 GB", "GPU memory")
    assert render.memory_gauge(None) == ("-", "memory")
    assert render.gauges()["tps"] == "0.0"


# ---------------------------------------------------------------------- settings
def test_build_params_maps_widget_conventions():
    base = GenerationParams(gen_length=64, block_length=16)
    p = build_params(base, [0, 0.0, 64.0, 16.0, 0.9, "threshold", "margin", "prefix", -1])
    assert p.steps is None and p.seed is None and p.gen_length == 64
    assert isinstance(p.block_length, int) and p.decoding == "threshold"
    p = build_params(base, dict(zip(FIELDS, [8, 0.5, 32, 8, 0.8, "fixed", "entropy",
                                             "none", 3.0])))
    assert (p.steps, p.seed, p.temperature, p.remasking) == (8, 3, 0.5, "entropy")


def test_build_params_invalid_combination_names_the_fields():
    base = GenerationParams()
    with pytest.raises(ValueError, match=r"or a multiple of the number of blocks \(4 = "
                                         r"gen_length 64 / block_length 16, rounded up\).*got 5$"):
        build_params(base, [5, 0.0, 64, 16, 0.9, "fixed", "low_confidence", "none", 0])
    with pytest.raises(ValueError, match="decoding must be one of"):
        build_params(base, [0, 0.0, 64, 16, 0.9, "magic", "low_confidence", "none", 0])
    with pytest.raises(ValueError, match="expected 9 settings"):
        build_params(base, [1, 2])


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("gen_length", [64, 40, 8])
def test_presets_always_give_valid_params(name, gen_length):
    values = preset_values(name, gen_length) + [0]
    p = build_params(GenerationParams(), values)
    assert p.gen_length == gen_length and p.gen_length % p.block_length == 0


def test_story_preset_is_the_reference_sampler_left_to_right():
    p = build_params(GenerationParams(), preset_values("story", 64) + [0])
    assert (p.block_length, p.decoding, p.steps, p.cache, p.temperature) == \
        (1, "fixed", None, "none", 0.0)
    assert p.total_steps == 64                     # one position per step, left to right


def test_widget_values_invert_build_params():
    p = GenerationParams(gen_length=64, block_length=16, steps=32, seed=5)
    values = widget_values(p)
    assert build_params(GenerationParams(), [values[f] for f in FIELDS]) == p


# ---------------------------------------------------------------------- charts, race, api
def test_charts_show_the_recorded_run():
    traj = run()
    assert list(charts.commits_per_step(traj).data[0].y) == [1, 1, 1]
    conf = charts.confidence_chart(traj)
    assert list(conf.data[0].y) == [0.5, 0.9, 0.99]
    heat = charts.unmask_heatmap(traj).data[0]
    assert len(heat.z) == 3 and len(heat.z[0]) == 4
    assert heat.z[0][1] == 0.5 and heat.z[2][2] == 0.99 and heat.z[0][0] is None


def test_a_block_causal_canvas_grows_block_by_block():
    """A block-causal run's StepEvents carry the canvas so far (the first, partial block,
    then one more block at a time): the trajectory grows with it."""
    traj = Trajectory(0, 2)
    traj.add(event(1, [2], [0], [0.5]), token_text)
    traj.add(event(2, [2, M, M], [], [], block=1), token_text)
    traj.add(event(3, [2, 1, M], [1], [0.9], block=1), token_text)
    assert traj.gen_length == 3
    assert [c["k"] for c in canvas(traj)] == ["old", "new", "mask"]
    traj.finish(result(tokens=2))
    assert [c["k"] for c in canvas(traj)] == ["old", "old", "skip"]


def test_race_params_for_a_full_attention_model():
    """Full attention: main = the fast configuration, canvas = the reference sampler."""
    main, canvas = race_params(GenerationParams(), 64, 16, 0.8)
    assert (main.decoding, main.cache, main.threshold, main.steps) == ("threshold", "prefix",
                                                                       0.8, None)
    assert (canvas.decoding, canvas.cache, canvas.steps) == ("fixed", "none", None)
    assert main.gen_length == canvas.gen_length == 64
    assert main.block_length == canvas.block_length == 16


def test_race_params_for_a_block_diffusion_model():
    """Block-causal: main keeps its own block length and cache (only threshold decoding, the
    tab's threshold and gen length); the tab's block length goes to the full-canvas model."""
    bd = GenerationParams(gen_length=256, block_length=8, decoding="fixed", cache="prefix",
                          threshold=0.7, temperature=0.0)
    canvas_base = GenerationParams(gen_length=64, block_length=32, steps=64, decoding="fixed",
                                   cache="none")
    main, canvas = race_params(bd, "32", "16", 0.85, block_causal=True,
                               canvas_base=canvas_base)
    assert (main.decoding, main.threshold, main.gen_length) == ("threshold", 0.85, 32)
    assert (main.block_length, main.cache, main.steps) == (8, "prefix", None)
    # the full-canvas model at its own settings (issue 34, item 6), the same length cap
    assert (canvas.decoding, canvas.cache) == ("fixed", "none")
    assert (canvas.gen_length, canvas.block_length, canvas.steps) == (32, 16, None)
    # the full-canvas model unavailable: no canvas settings, main unchanged
    assert race_params(bd, 32, 16, 0.85, block_causal=True) == (main, None)


def test_race_summary_compares_the_three_runs():
    results = {"main": stats(64, 16, 0.25, "done"), "canvas": stats(64, 32, 1.0, "done"),
               "ar": stats(64, 64, 0.5, "done")}
    labels = {"main": "block diffusion", "canvas": "full canvas"}
    assert race_summary(results, labels) == (
        "**tokens/s**: block diffusion 256.0 (64 tokens in 0.25 s) · full canvas 64.0 "
        "(64 tokens in 1.00 s) · autoregressive 128.0 (64 tokens in 0.50 s)\n\n"
        "**block diffusion vs autoregressive**: 2.00x the tokens/s (64 tokens in 0.25 s vs "
        "64 tokens in 0.50 s; NFE 16 vs 64)\n\n"
        "**block diffusion vs full canvas**: 4.00x the tokens/s (64 tokens in 0.25 s vs "
        "64 tokens in 1.00 s; NFE 16 vs 32)")
    # a column that did not finish is left out of the line and of the ratios
    results["ar"] = stats(state="unavailable")
    assert race_summary(results, {"main": "fast", "canvas": "reference"}) == (
        "**tokens/s**: fast 256.0 (64 tokens in 0.25 s) · reference 64.0 (64 tokens in "
        "1.00 s)\n\n**fast vs reference**: 4.00x the tokens/s (64 tokens in 0.25 s vs 64 "
        "tokens in 1.00 s; NFE 16 vs 32)")
    assert race_summary({"main": stats(state="error")}) == ""


def test_race_notice_cell_is_escaped():
    cells = notice_cells("Unavailable: no model at <dir>")
    cell = render.parse_cell(cells[0])
    assert cell["k"] == "race-unavailable" and cell["t"] == "Unavailable: no model at &lt;dir&gt;"


def test_api_snippets_and_base_url():
    url = base_url({"host": "example.org:8000", "x-forwarded-proto": "https"})
    assert url == "https://example.org:8000"
    assert base_url(None) == "http://localhost:7860"
    open_ = snippets(url, "celeris-tiny", key_required=False)
    assert "Authorization" not in open_["curl"]
    assert f"{url}/v1/chat/completions" in open_["curl"]
    assert 'base_url="https://example.org:8000/v1"' in open_["openai"]
    keyed = snippets(url, "celeris-tiny", key_required=True)
    assert "Bearer $CELERIS_API_KEY" in keyed["curl"] and "CELERIS_API_KEY" in keyed["openai"]
    assert 'api_name="/generate"' in keyed["gradio_client"]


def test_plain_messages_and_chat_reply():
    history = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
               {"role": "assistant", "content": "hello"}]
    assert render.plain_messages(history) == [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]
    assert reply_so_far("Once", 16) == "Once \u2591\u2591"
    assert reply_so_far("Once", 0) == "Once"


def test_model_markdown():
    assert "No model loaded" in render.model_markdown(None, "missing <dir>")
    assert "&lt;dir&gt;" in render.model_markdown(None, "missing <dir>")
    md = render.model_markdown({"model": "tiny", "parameters": 2_500_000, "dtype": "float32",
                                "device": "cpu", "memory_kind": "gpu", "memory_bytes": 2**30,
                                "defaults": {"gen_length": 64}})
    assert "`2.50 M`" in md and "GPU memory" in md and "gen_length=64" in md


def test_race_column_without_the_autoregressive_twin_says_why(tmp_path):
    from ui.context import EngineSlot
    from ui.race import run_ar

    slot = EngineSlot(None, ar_path=tmp_path / "no-such-twin")
    (text, st), = list(run_ar(slot, "hello", 8))
    assert "Unavailable" in text and "no-such-twin" in text and st["state"] == "unavailable"


def test_paced_drops_frames_but_never_the_finished_one():
    from ui.context import paced

    traj = run(finish=False)
    frames = [traj] * 50
    assert len(list(paced(iter(frames), 0.0))) == 50
    done = run()
    out = list(paced(iter(frames + [done]), 3600.0))
    assert out == [traj, done]


def test_long_canvases_get_proportionally_fewer_frames():
    from ui.context import FRAME_CELLS, frame_gap

    assert frame_gap(0.04, 0) == frame_gap(0.04, FRAME_CELLS) == 0.04
    assert frame_gap(0.04, 4 * FRAME_CELLS) == pytest.approx(0.16)
    assert frame_gap(0.0, 4096) == 0.0


def test_paced_spaces_frames_by_their_size_and_passes_a_final_item(monkeypatch):
    import ui.context as ctx
    from ui.context import FRAME_CELLS, paced

    clock = iter(range(1000))   # one second passes per item (ui.context's clock only)
    monkeypatch.setattr(ctx, "time", SimpleNamespace(monotonic=lambda: float(next(clock))))
    items = [{"tokens": n, "done": n == 9} for n in range(10)]
    # 1 s per frame up to FRAME_CELLS cells; these items are twice that: 2 s per frame
    out = list(paced(iter(items), 1.0, final=lambda i: i["done"],
                     cells=lambda i: 2 * FRAME_CELLS))
    assert [i["tokens"] for i in out] == [0, 2, 4, 6, 8, 9]


def test_preset_captions_say_what_each_preset_is_on_the_model():
    from ui.settings import preset_caption

    block = GenerationParams(gen_length=256, block_length=4, decoding="ltr", threshold=0.85,
                             cache="prefix")
    caption = preset_caption(4, block)
    assert caption.startswith("default: the model's own settings (ltr decoding at 0.85, "
                              "prefix cache, block 4)")
    assert "fast: the same as default on this model" in caption
    assert "balanced: ltr decoding at 0.999, prefix cache, block 4" in caption
    assert "threshold + prefix cache" not in caption
    full = GenerationParams(gen_length=64, block_length=32, steps=64, decoding="threshold",
                            threshold=0.9, cache="none")
    caption = preset_caption(None, full)
    assert "fast: threshold decoding at 0.9, prefix cache, block 32" in caption
    assert "story: fixed schedule, one token per step, no cache, block 1 (left to right)" \
        in caption
    assert "the same as default" not in caption


def test_a_stopped_run_without_its_result_reads_the_same_figures_everywhere():
    from ui.playground import final_frame

    traj = Trajectory(4, 2)
    traj.add(event(1, [1, M, M, M], [0], [0.9]), token_text)
    traj.add(event(2, [1, 2, M, M], [1], [0.8], nfe=3), token_text)
    view = SimpleNamespace(info=lambda *_: None)
    cells, answer, gauges, summary = final_frame(traj, view)
    assert gauges["state"] == "stopped" and gauges["nfe"] == "3"
    assert summary == (f"**stopped** · 2 tokens in 2 steps · NFE 3 · {gauges['tpf']} "
                       f"tokens/forward · {gauges['tps']} tokens/s")
    assert [render.parse_cell(c)["k"] for c in cells] == ["old", "new", "mask", "mask"]
    traj.finish(result(tokens=2, nfe=4))
    cells, answer, gauges, summary = final_frame(traj, view)
    assert gauges["nfe"] == "4" and "NFE 4" in summary and gauges["state"] == "done"
