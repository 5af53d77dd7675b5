"""The playground's trajectory and the server's canvas events show each family's decoding as
it is: token editing (LLaDA2.1's rule) marks the tokens it replaced, and DiffusionGemma's
uniform-noise canvases show draft tokens that change, not masks, until a canvas is accepted.

Real engine runs: the tiny block-causal model of tests/test_token_editing.py with an
``edit_threshold``, and DiffusionGemma's tiny checkpoint of tests/test_diffusion_gemma.py;
their StepEvents go through ``ui.trajectory``/``ui.render`` (what the playground draws) and
through the server's SSE encoder (``celeris.denoise`` events).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from celeris import Engine, GenerationParams
from celeris.outputs import GenerationResult, StepEvent
from celeris.server.shaping import Shapes
from celeris.server.streaming import ChoiceStream, sse_events
from tests.engine_harness import (EDIT_BLOCK, EDIT_MASK, EDIT_PAD, EDIT_STOP, bare_engine,
                                  editing_model)
from ui import render
from ui.trajectory import Trajectory

MASK, PAD, STOP, BS = EDIT_MASK, EDIT_PAD, EDIT_STOP, EDIT_BLOCK


def token_text(ids):
    return [f"<{t}>" for t in ids]


def stream(engine, prompt, params) -> tuple[list[StepEvent], GenerationResult]:
    items = list(engine.stream(prompt, params))
    return items[:-1], items[-1]


def record(events, result, grows=True) -> Trajectory:
    traj = Trajectory(0 if grows else len(events[0].canvas), events[0].block_length)
    for ev in events:
        traj.add(ev, token_text)
    traj.finish(result)
    return traj


def cells(traj, step=None, live=False):
    return [render.parse_cell(c) for c in render.canvas_cells(traj, step, live=live)]


def denoise_events(events, result) -> list[dict]:
    """The ``celeris.denoise`` SSE events the server sends for these items."""
    async def items():
        for item in [*events, result]:
            yield item

    async def collect():
        out = []
        streams = [ChoiceStream(0, [], items())]
        async for chunk in sse_events(streams, Shapes(False, "r", "m"), (), False, True,
                                      lambda r: str(r.finish_reason)):
            if chunk.startswith("event: celeris.denoise\n"):
                out.append(json.loads(chunk.split("data: ", 1)[1]))
        return out

    return asyncio.run(collect())


# ------------------------------------------------------------------ token editing
@pytest.fixture(scope="module")
def editing_engine():
    return bare_engine(editing_model(), MASK, PAD, (STOP,))


def editing_run(engine):
    prompt = torch.randint(4, 64, (5,), generator=torch.Generator().manual_seed(5)).tolist()
    params = GenerationParams(gen_length=27, block_length=BS, decoding="threshold",
                              threshold=0.6, edit_threshold=0.3, max_post_edit_steps=16,
                              cache="prefix", temperature=0.0)
    return stream(engine, prompt, params)


def test_edited_tokens_are_marked_in_the_live_canvas_and_the_replay(editing_engine):
    events, result = editing_run(editing_engine)
    edits = [(e.step, p) for e in events for p in e.edited]
    assert edits                                   # this run edits (tests/test_token_editing)
    traj = record(events, result)
    for ev in events:
        traj_so_far = record([e for e in events if e.step <= ev.step], result)
        traj_so_far.result = None                  # as the live canvas saw it at that step
        live = cells(traj_so_far, live=True)
        for p in ev.edited:
            assert live[p]["k"] == "new edit", (ev.step, p)
            assert live[p]["t"] == render.token_label(f"<{ev.canvas[p]}>")
        for p in set(ev.committed) - set(ev.edited):
            assert "edit" not in live[p]["k"]
    step, pos = edits[0]                           # the first edit: one replaced text
    at = {e.step: e for e in events}
    old, new = at[step - 1].canvas[pos], at[step].canvas[pos]
    assert old != new and MASK not in (old, new)
    replay = cells(traj, step)
    assert replay[pos]["k"] == "new edit"
    assert f'edited: "<{old}>" -> "<{new}>"' in replay[pos]["h"]
    assert "edit" not in cells(traj, step - 1)[pos]["k"]       # not before it happened
    assert cells(traj, step - 1)[pos]["t"] == render.token_label(f"<{old}>")
    n = sum(len(e.edited) for e in events if e.step == step)
    assert f"({n} of them edited)" in render.replay_caption(traj, step)
    assert f"{len(edits)} token" in render.run_summary(traj)
    # the final canvas marks every position whose token replaced an earlier one
    final = cells(traj)
    assert {p for p, c in enumerate(final) if "edit" in c["k"]} == {p for _, p in edits}


def test_the_server_canvas_events_carry_the_edits(editing_engine):
    events, result = editing_run(editing_engine)
    snaps = denoise_events(events, result)
    assert [s["step"] for s in snaps] == [e.step for e in events]
    assert [s["edited"] for s in snaps] == [list(e.edited) for e in events]
    assert [s["committed"] for s in snaps] == [list(e.committed) for e in events]
    assert sum(len(s["edited"]) for s in snaps) > 0
    assert all(s["draft"] == [] for s in snaps)
    assert all(set(s["edited"]) <= set(s["committed"]) for s in snaps)


def test_denoise_shape_lists_edits_and_drafts():
    ev = StepEvent("r", 4, 1, (5, 6, 7, 3), (1, 2), (0.91234567, 0.5), 4, 0.25, "x", 3, 4,
                   edited=(1,), draft=(3,))
    shaped = Shapes(True, "r", "m").denoise(ev)
    assert {k: shaped[k] for k in ("object", "step", "canvas", "committed", "confidences",
                                   "edited", "draft", "mask_id", "text")} == {
        "object": "celeris.denoise", "step": 4, "canvas": [5, 6, 7, 3], "committed": [1, 2],
        "confidences": [0.91235, 0.5], "edited": [1], "draft": [3], "mask_id": 3, "text": "x"}
    assert ev.to_dict()["draft"] == [3] and ev.num_masked == 2     # a mask and a draft


# ------------------------------------------------------------------ DiffusionGemma
@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.test_diffusion_gemma import write_tiny_diffusion_gemma
    path = write_tiny_diffusion_gemma(tmp_path_factory.mktemp("dg") / "m")
    return Engine.from_pretrained(path, device="cpu", dtype="float32")


def gemma_run(engine):
    params = engine.default_params().replace(gen_length=16, seed=1, temperature=1.0,
                                             suppress_eos=True)
    return stream(engine, list(range(20, 31)), params)


def test_a_diffusion_gemma_canvas_is_drawn_as_changing_draft_tokens(gemma):
    events, result = gemma_run(gemma)
    L = gemma.layout.block_size
    drafts = [e for e in events if e.draft]
    assert len(drafts) >= 2 and len(drafts) == len(events) - 16 // L
    traj = record(events, result)
    assert traj.pinned == {}                        # drafts are never taken for prompt text
    shown = {}
    for e in drafts:
        replay = cells(traj, e.step)
        span = range(e.draft[0], e.draft[-1] + 1)
        assert [replay[p]["k"].split()[0] for p in span] == ["draft"] * len(span)
        assert all(render.MASK_GLYPH not in replay[p]["t"] for p in span)
        assert [replay[p]["t"] for p in span] == \
            [render.token_label(f"<{e.canvas[p]}>") for p in span]
        assert all(replay[p]["k"].split()[0] == "old" for p in range(span.start))
        assert render.canvas_text(traj, e.step).endswith(render.MASK_GLYPH * len(span))
        shown.setdefault(e.block, []).append([replay[p]["t"] for p in span])
    assert any(len({tuple(s) for s in seen}) > 1 for seen in shown.values())   # they change
    final = cells(traj)
    assert all(c["k"].split()[0] == "old" for c in final)
    assert [c["t"] for c in final] == [render.token_label(f"<{t}>") for t in result.token_ids]
    snaps = denoise_events(events, result)
    assert [s["draft"] for s in snaps] == [list(e.draft) for e in events]
    assert [s["canvas"] for s in snaps] == [list(e.canvas) for e in events]
    assert all(s["text"] == result.text[:len(s["text"])] for s in snaps)
