"""What the playground shows, in a real browser (Playwright + Debian Chromium) on the shipped
models (block diffusion by default, the full-canvas one and the AR twin next to it): the
Infill step view shows the whole text; after Stop the gauges and the summary read the same
final figures; the preset captions say what each preset is on the loaded model; the race
gives both ratios by one rule. Screenshots go to artifacts/ (git-ignored)."""

from __future__ import annotations

import contextlib
import re
import time

import pytest

from tests.live_server import slow_down
from tests.test_browser import ARTIFACTS, set_choice, set_number, state
from tests.test_playground_browser import (STORY, browser, generation_config, shipped,  # noqa: F401
                                           tab, visit)

pytestmark = pytest.mark.browser

LILY = ("Once upon a time, there was a [MASK] [MASK] named Lily. One day, Lily found a red "
        "[MASK] under a tree.")


@pytest.fixture(scope="module")
def page(shipped, browser):  # noqa: F811
    page = visit(browser, shipped[0])
    yield page
    page.context.close()


def cell_texts(page, selector: str) -> list[str]:
    return page.locator(selector).all_inner_texts()


def test_the_infill_step_view_shows_the_whole_text_with_the_prompt_pinned(page):
    from playwright.sync_api import expect

    tab(page, "Infill")
    set_number(page, "infill-span", 1)
    page.fill("#infill-text textarea", LILY)
    page.click("#infill-go")
    expect(state(page, "#infill-gauges")).to_have_text("done", timeout=120_000)
    filled = page.locator("#infill-result textarea").input_value()
    cells = cell_texts(page, "#infill-canvas .tk")
    assert "".join(cells) == filled                       # the view reads as the result
    assert filled.startswith("Once upon a time, there was a")
    lead = "".join(cell_texts(page, "#infill-canvas .tk.pin.lead"))
    assert lead == "Once upon a time, there was a"        # the prompt: pinned, marked
    generated = page.locator("#infill-canvas .tk.old, #infill-canvas .tk.new")
    expect(generated).to_have_count(3)                      # three [MASK]s of one token
    expect(page.locator("#infill-canvas .tk.pin.end")).to_have_count(0)   # no padding cells
    page.screenshot(path=str(ARTIFACTS / "infill-whole-text.png"), full_page=True)


@contextlib.contextmanager
def late_stop_answer(engine, seconds: float):
    """Stop's own answer reaches the page late, as over a slow network: the engine aborts the
    run at once, the Stop handler returns ``seconds`` later (after the run's last frame)."""
    abort = engine.abort

    def slow(request_id):
        abort(request_id)
        time.sleep(seconds)
    engine.abort = slow
    try:
        yield
    finally:
        del engine.abort


def gauge(page, key: str) -> str:
    return page.locator(f"#pg-gauges [data-g={key}] b").inner_text()


def test_after_stop_gauges_and_summary_read_the_same_figures(shipped, page):  # noqa: F811
    from playwright.sync_api import expect

    tab(page, "Playground")
    page.fill("#pg-prompt textarea", STORY)
    hook = slow_down(shipped[1], 0.1)
    try:
        with late_stop_answer(shipped[1], 1.0):
            page.click("#pg-generate")
            expect(state(page)).to_have_text("running")
            page.wait_for_function(
                "Number(document.querySelector('#pg-gauges [data-g=nfe] b').innerText) >= 6")
            page.click("#pg-stop")
            expect(state(page)).to_have_text("stopped")
            summary = page.locator("#pg-summary")
            expect(summary).to_contain_text("NFE")
            page.wait_for_timeout(2000)      # Stop's late answer, and anything else, landed
    finally:
        hook.remove()
    text = summary.inner_text()
    assert re.search(r"\bNFE (\d+)\b", text).group(1) == gauge(page, "nfe"), text
    assert f"{gauge(page, 'tpf')} tokens/forward" in text
    expect(state(page)).to_have_text("stopped")
    page.screenshot(path=str(ARTIFACTS / "stop-figures.png"), full_page=True)


def test_preset_captions_say_what_presets_are_here(shipped, browser):  # noqa: F811
    from playwright.sync_api import expect

    own = generation_config("celeris-tiny-bd")
    page = visit(browser, shipped[0])
    preset = page.locator("#pg-preset")
    expect(preset).to_contain_text("fast: the same as default on this model")
    expect(preset).not_to_contain_text("threshold + prefix cache")
    expect(preset).to_contain_text(f"{own['decoding']} decoding at {own['threshold']:g}")
    page.locator("#pg-preset input[value=fast]").check()
    expect(page.locator("#pg-decoding input")).to_have_value(own["decoding"])
    expect(page.locator("#pg-threshold input[type=number]")).to_have_value(
        f"{own['threshold']:g}")
    # another model, another caption: on the full-canvas model fast adds the prefix cache
    tab(page, "Model")
    set_choice(page, "model-choice", "celeris-tiny")
    expect(page.locator("#model-status")).to_contain_text("This tab now runs celeris-tiny")
    tab(page, "Playground")
    expect(preset).to_contain_text("fast: threshold decoding at 0.9, prefix cache")
    expect(preset).not_to_contain_text("the same as default")
    page.screenshot(path=str(ARTIFACTS / "preset-captions.png"))
    page.context.close()
