"""Issue 34, playground items 1-7, in a real browser (Playwright + Debian Chromium): two
visitors with their own models, a chat that survives blank and over-long messages, the
replay box clamping, an empty answer that says why, race ratios with their tokens and time,
the model's own preset selected, Stop clearing the last run's replay, and the settings
within reach on a phone. The app runs the shipped models (block diffusion by default, the
full-canvas one offered next to it); screenshots go to artifacts/ (git-ignored)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.live_server import slow_down
from tests.test_app import running_app
from tests.test_browser import ARTIFACTS, chromium, error_pills, set_choice, set_number, \
    state

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
MODELS = {name: ROOT / "models" / name
          for name in ("celeris-tiny-bd", "celeris-tiny", "celeris-tiny-ar")}
STORY = "Tell me a story about a brave fox."


@pytest.fixture(scope="module")
def shipped():
    import app

    missing = [str(p) for p in MODELS.values() if not (p / "config.json").is_file()]
    assert not missing, f"the shipped models are missing: {missing}"
    engine, error = app.load_engine(str(MODELS["celeris-tiny-bd"]), device="cpu")
    assert error is None, error
    with running_app(engine, ar_path=str(MODELS["celeris-tiny-ar"]),
                     canvas_path=str(MODELS["celeris-tiny"]), device="cpu",
                     models=[str(MODELS["celeris-tiny-bd"]), str(MODELS["celeris-tiny"])]
                     ) as url:
        yield url, engine
    app.stop_engine(engine)


@pytest.fixture(scope="module")
def browser(chromium_path):
    with chromium(chromium_path, 60_000) as b:
        yield b


def visit(browser, url: str, width: int = 1400, height: int = 1000):
    """A new visitor: its own browser context (cookies, Gradio session)."""
    from playwright.sync_api import expect

    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(90_000)
    page.goto(url + "/")
    page.wait_for_selector("#pg-generate")
    expect(page.locator("#pg-gen-length")).not_to_contain_text("prompt 1 tokens")
    return page


@pytest.fixture(scope="module")
def page(shipped, browser):
    page = visit(browser, shipped[0])
    yield page
    page.context.close()


def generation_config(name: str) -> dict:
    """A shipped model's generation defaults (read, never written: models get retrained)."""
    import json

    return json.loads((MODELS[name] / "generation_config.json").read_text())


def tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


# ---------------------------------------------------------------------- item 1
def test_a_visitors_model_choice_is_theirs_alone(shipped, browser, page):
    from playwright.sync_api import expect

    other = visit(browser, shipped[0])
    tab(other, "Model")
    expect(other.locator("#model-path")).to_have_count(0)      # no free-text directory
    set_choice(other, "model-choice", "celeris-tiny")
    expect(other.locator("#model-status")).to_contain_text("This tab now runs celeris-tiny")
    expect(other.locator("#celeris-header")).to_contain_text("Model: celeris-tiny on")
    tab(other, "Playground")
    other.screenshot(path=str(ARTIFACTS / "model-choice-playground.png"), full_page=True)
    own = generation_config("celeris-tiny")                 # its own defaults, not the bd's
    expect(other.locator("#pg-decoding input")).to_have_value(own["decoding"])
    expect(other.locator("#pg-block-length input")).to_have_value(str(own["block_length"]))
    expect(other.locator("#pg-preset input[value=default]")).to_be_checked()
    tab(other, "Race")
    expect(other.locator("#race-main-title")).to_contain_text("Fast configuration · "
                                                              "celeris-tiny")
    other.screenshot(path=str(ARTIFACTS / "model-choice.png"))
    # the first visitor, who never opened the Model tab, keeps the block model
    page.reload()
    page.wait_for_selector("#pg-generate")
    expect(page.locator("#celeris-header")).to_contain_text("Model: celeris-tiny-bd on")
    expect(page.locator("#pg-decoding input")).to_have_value(
        generation_config("celeris-tiny-bd")["decoding"])
    expect(page.locator("#pg-block-length")).to_contain_text("model's blocks of 4")
    tab(page, "Race")
    expect(page.locator("#race-main-title")).to_contain_text("Block diffusion · "
                                                             "celeris-tiny-bd")
    tab(page, "Playground")
    page.fill("#pg-prompt textarea", STORY)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done")
    expect(page.locator("#pg-summary")).to_contain_text("stop")
    assert page.locator("#pg-canvas .tk.bs").count() > 10     # block after block of 4
    other.context.close()


# ---------------------------------------------------------------------- item 7 (first look)
def test_the_model_own_preset_is_selected_and_every_decoding_is_explained(page):
    from playwright.sync_api import expect

    tab(page, "Playground")
    expect(page.locator("#pg-preset input[value=default]")).to_be_checked()
    expect(page.locator("#pg-decoding")).to_contain_text("ltr = threshold, left to right")
    tab(page, "Chat")
    expect(page.locator("#chat-note")).to_contain_text("single questions and answers")
    expect(page.locator("#chat-gen-length input[type=number]")).to_have_value("256")


# ---------------------------------------------------------------------- item 4
def test_the_replay_step_box_clamps_a_value_beyond_the_run(page):
    from playwright.sync_api import expect

    tab(page, "Playground")
    page.fill("#pg-prompt textarea", STORY)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done")
    caption = page.locator("#pg-caption")
    slider = page.locator("#pg-scrub input[type=range]")
    expect(caption).to_contain_text(re.compile(r"step \d+ of \d+"))
    # The caption and the slider are separate components that update in either order
    # (and the caption's text passes through the progress tracker's): wait until both
    # name the same run length before typing past its end.
    last = None
    for _ in range(120):
        m = re.search(r"step \d+ of (\d+)", caption.text_content() or "")
        if m and slider.get_attribute("max") == m.group(1):
            last = int(m.group(1))
            break
        page.wait_for_timeout(500)
    assert last is not None, "the replay caption and slider never agreed on the run length"
    box = page.locator("#pg-scrub input[type=number]")
    box.fill("9999")
    box.press("Enter")
    expect(page.locator("#pg-caption")).to_contain_text(f"step {last} of {last}")
    expect(page.locator("#pg-scrub input[type=range]")).to_have_value(str(last))
    page.wait_for_timeout(1000)
    assert page.get_by_text("greater than maximum").count() == 0
    assert page.locator(".toast-body.error").count() == 0
    expect(error_pills(page, "pg-replay-canvas")).to_have_count(0)


# ---------------------------------------------------------------------- item 5
def test_a_run_that_writes_nothing_says_why(page):
    from playwright.sync_api import expect

    tab(page, "Playground")
    page.fill("#pg-prompt textarea", "Once upon a time")
    page.locator("#pg-chat input").check()
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done")
    summary = page.locator("#pg-summary")
    expect(summary).to_contain_text("Nothing was generated")
    expect(summary).to_contain_text("untick chat message")
    page.locator("#pg-chat input").uncheck()
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done")
    expect(summary).not_to_contain_text("Nothing was generated")


# ---------------------------------------------------------------------- item 7: Stop
def test_stop_clears_the_replay_and_charts_of_the_previous_run(shipped, page):
    """Once a new run starts, the last run's replay and charts go; after Stop they show
    nothing, or this stopped run (when its aborted result arrived before the cancel), never
    the run before."""
    import re

    from playwright.sync_api import expect

    tab(page, "Playground")
    page.fill("#pg-prompt textarea", STORY)
    page.locator("#pg-chat input").check()
    hook = slow_down(shipped[1], 0.05)       # slow enough to see each run start
    try:
        page.click("#pg-generate")
        expect(state(page)).to_have_text("running")
        expect(state(page)).to_have_text("done")
    finally:
        hook.remove()
    expect(page.locator("#pg-commits .js-plotly-plot")).to_be_visible()
    expect(page.locator("#pg-caption")).to_contain_text(re.compile(r"step \d+ of \d+"))
    previous = int(re.search(r"step \d+ of (\d+)",
                             page.locator("#pg-caption").text_content()).group(1))
    hook = slow_down(shipped[1], 0.1)
    try:
        page.click("#pg-generate")
        expect(state(page)).to_have_text("running")
        expect(page.locator("#pg-caption")).to_contain_text("once it has finished")
        for chart in ("pg-commits", "pg-confidence", "pg-heatmap"):
            expect(page.locator(f"#{chart}")).to_be_hidden()
        expect(page.locator("#pg-replay-canvas .tk")).to_have_count(0)
        page.click("#pg-stop")
        expect(state(page)).to_have_text("stopped")
    finally:
        hook.remove()
    page.wait_for_timeout(1500)
    caption = page.locator("#pg-caption").text_content()   # as the expectations read it
    shown = re.search(r"step \d+ of (\d+)", caption)
    assert "once it has finished" in caption or int(shown.group(1)) < previous, caption


# ---------------------------------------------------------------------- items 2 and 3: chat
def chat_counts(page) -> tuple[int, int]:
    box = page.locator("#chat-box")
    return (box.locator("[data-testid=user]").count(), box.locator("[data-testid=bot]").count())


def send(page, text: str) -> None:
    """Type ``text`` and send it: with Send once the page enabled it (the box's value has
    reached the server), with Enter when blank (Send stays disabled then)."""
    from playwright.sync_api import expect

    page.fill("#chat-message textarea", text)
    if text.strip():
        expect(page.locator("#chat-send")).to_be_enabled()
        page.click("#chat-send")
    else:
        page.locator("#chat-message textarea").press("Enter")


def wait_reply(page, count: int) -> None:
    """Until the chat shows ``count`` replies, the last one finished (no masked tail)."""
    from playwright.sync_api import expect

    bots = page.locator("#chat-box [data-testid=bot]")
    expect(bots).to_have_count(count)
    expect(bots.last).not_to_contain_text("\u2591")
    last, same = None, 0     # a block model's reply has no masked tail between blocks:
    while same < 4:          # wait until it stops growing too
        text = bots.last.inner_text()
        same, last = (same + 1 if text == last else 0), text
        page.wait_for_timeout(400)


def test_enter_on_a_blank_message_keeps_the_conversation(page):
    from playwright.sync_api import expect

    tab(page, "Chat")
    send(page, STORY)
    wait_reply(page, 1)
    send(page, "Tell me a story about a little bear.")
    wait_reply(page, 2)
    before = chat_counts(page)
    send(page, "   ")
    expect(page.get_by_text("Type a message first.").first).to_be_visible()
    page.wait_for_timeout(1500)
    assert chat_counts(page) == before == (2, 2)
    for elem_id in ("chat-box", "chat-message"):
        expect(error_pills(page, elem_id)).to_have_count(0)


def test_an_over_long_message_is_not_kept_and_the_chat_goes_on(page):
    from playwright.sync_api import expect

    tab(page, "Chat")
    before = chat_counts(page)
    long = "Once upon a time " * 200
    send(page, long)
    expect(page.get_by_text("Your message does not fit").first).to_be_visible()
    expect(page.locator("#chat-message textarea")).to_have_value(long)   # back in the box
    assert chat_counts(page) == before
    expect(error_pills(page, "chat-box")).to_have_count(0)
    send(page, "Tell me a story about a cat.")
    wait_reply(page, before[1] + 1)
    assert chat_counts(page)[0] == before[0] + 1
    page.screenshot(path=str(ARTIFACTS / "chat-round2.png"))


def test_a_message_sent_during_a_reply_waits_in_the_box(shipped, page):
    from playwright.sync_api import expect

    tab(page, "Chat")
    page.click("#chat-clear")
    expect(page.locator("#chat-box [data-testid=user]")).to_have_count(0)
    hook = slow_down(shipped[1], 0.05)
    try:
        send(page, STORY)
        expect(page.locator("#chat-box [data-testid=bot]")).to_have_count(1)
        send(page, "Tell me a story about a cat.")
        expect(page.get_by_text("still answering").first).to_be_visible()
        expect(page.locator("#chat-message textarea")).to_have_value(
            "Tell me a story about a cat.")
    finally:
        hook.remove()
    wait_reply(page, 1)
    page.click("#chat-send")
    wait_reply(page, 2)
    assert chat_counts(page) == (2, 2)


# ---------------------------------------------------------------------- item 6: race
def test_race_shows_tokens_and_time_and_withholds_meaningless_ratios(page):
    from playwright.sync_api import expect

    tab(page, "Race")
    page.fill("#race-prompt textarea", "add: 38 + 57")
    set_number(page, "race-gen-length", 64)
    page.click("#race-go")
    summary = page.locator("#race-summary")
    expect(summary).to_contain_text("block diffusion vs full canvas", timeout=180_000)
    expect(summary).to_contain_text("tokens in")
    expect(summary).to_contain_text("no speed ratio")
    expect(summary).to_contain_text("too short to time")
    expect(page.locator("#race-canvas-title")).to_contain_text("its own settings")
    for column in ("main", "canvas", "ar"):
        expect(page.locator(f"#race-{column}-stats")).to_contain_text("done")
        expect(page.locator(f"#race-{column}-stats [data-g=tps] span")).to_have_text(
            "tokens/s")
    page.screenshot(path=str(ARTIFACTS / "race-round2.png"), full_page=True)


# ---------------------------------------------------------------------- item 7: phone
def test_on_a_phone_the_settings_come_before_the_replay_and_charts(shipped, browser):
    phone = visit(browser, shipped[0], width=390, height=844)
    top = {name: phone.locator(f"#{name}").bounding_box()["y"]
           for name in ("pg-generate", "pg-canvas", "pg-preset", "pg-replay", "pg-charts")}
    assert top["pg-generate"] < top["pg-canvas"] < top["pg-preset"] < top["pg-replay"]
    assert top["pg-preset"] < top["pg-charts"]
    assert top["pg-preset"] - top["pg-canvas"] < 2 * 844     # not three screens below
    phone.screenshot(path=str(ARTIFACTS / "phone.png"), full_page=True)
    phone.context.close()
