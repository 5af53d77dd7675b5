"""Issue 35, item 5, in a real browser: the playground draws a DiffusionGemma canvas in
progress as draft tokens (marked, with their tooltip), not masks, and the legend names drafts
and edited tokens. The app serves the tiny DiffusionGemma of tests/test_diffusion_gemma.py;
a screenshot goes to artifacts/ (git-ignored)."""

from __future__ import annotations

import re

import pytest

from tests.test_app import running_app
from tests.test_browser import ARTIFACTS, chromium, state

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("transformers")
    import app
    from tests.test_diffusion_gemma import write_tiny_diffusion_gemma

    path = write_tiny_diffusion_gemma(tmp_path_factory.mktemp("dg") / "tiny-dgemma")
    engine, error = app.load_engine(str(path), device="cpu")
    assert error is None, error
    with running_app(engine) as url:
        yield url
    app.stop_engine(engine)


def test_a_diffusion_gemma_run_replays_its_drafts_as_marked_tokens(served, chromium_path):
    from playwright.sync_api import expect

    with chromium(chromium_path, 60_000) as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        page.goto(served + "/")
        page.wait_for_selector("#pg-generate")
        page.locator("#pg-chat input").uncheck()
        page.fill("#pg-prompt textarea", "Once upon a time")
        page.click("#pg-generate")
        expect(state(page)).to_have_text("done")
        legend = page.locator(".cv-legend").first
        expect(legend.locator(".tk.draft")).to_have_count(1)
        expect(legend.locator(".tk.edit")).to_have_count(1)
        caption = page.locator("#pg-caption")       # the replay opens at the run's end
        expect(caption).to_contain_text(re.compile(r"step (\d+) of \1 "))
        last = int(re.search(r"step (\d+) of", caption.inner_text()).group(1))
        expect(page.locator("#pg-scrub input[type=range]")).to_have_attribute("max", str(last))
        # step 1: the first canvas is a draft (a canvas is accepted at once, after its
        # last step, and the tiny checkpoint's sampler takes more than one step)
        box = page.locator("#pg-scrub input[type=number]")
        box.fill("1")
        box.press("Enter")
        expect(caption).to_contain_text(f"step 1 of {last} · block 0 · 0 committed this step"
                                        " · 8 draft tokens")
        replay = page.locator("#pg-replay-canvas")
        drafts = replay.locator(".tk.draft")
        expect(drafts).to_have_count(8)
        expect(replay.locator(".tk.mask")).to_have_count(0)
        assert "draft (not accepted yet)" in drafts.first.get_attribute("title")
        style = drafts.first.evaluate(
            "e => [getComputedStyle(e).fontStyle, getComputedStyle(e).outlineStyle]")
        assert style == ["italic", "dashed"]
        texts = drafts.all_inner_texts()
        assert any(t.strip() for t in texts)          # tokens, not mask glyphs
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator("#pg-replay").screenshot(path=str(ARTIFACTS / "gemma-drafts.png"))
        box.fill(str(last))
        box.press("Enter")
        expect(caption).to_contain_text(f"step {last} of {last}")
        expect(replay.locator(".tk.draft")).to_have_count(0)
