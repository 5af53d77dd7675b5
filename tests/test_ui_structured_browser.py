"""The Playground's Structured control in a real browser (Playwright + Debian Chromium) on the
shipped default model (celeris-tiny-bd): the JSON-schema example fills its schema with an
answer that parses and validates, the canvas marks the cells the grammar wrote and the
frontier, and a regex the engine cannot compile shows the engine's own message. The
screenshot goes to artifacts/ (git-ignored)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_app import running_app
from tests.test_browser import ARTIFACTS, chromium, set_number, state

pytestmark = pytest.mark.browser

MODEL = Path(__file__).resolve().parents[1] / "models" / "celeris-tiny-bd"


@pytest.fixture(scope="module")
def served():
    import app

    engine, error = app.load_engine(str(MODEL), device="cpu")
    assert error is None, error
    with running_app(engine, device="cpu") as url:
        yield url
    app.stop_engine(engine)


@pytest.fixture(scope="module")
def browser(chromium_path):
    with chromium(chromium_path, 60_000) as b:
        yield b


@pytest.fixture
def page(served, browser):
    from playwright.sync_api import expect

    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(90_000)
    page.goto(served + "/")
    page.wait_for_selector("#pg-generate")
    expect(page.locator("#pg-gen-length")).not_to_contain_text("prompt 1 tokens")
    yield page
    page.context.close()


def pick_mode(page, label: str) -> None:
    """Open the Structured accordion (closed by default) and pick a mode."""
    from playwright.sync_api import expect

    spec = page.locator("#pg-structured-spec textarea")
    expect(spec).to_have_count(0)                          # off: no spec box shown
    page.get_by_text("Structured output (JSON schema, regex, choice)").click()
    page.locator("#pg-structured-mode").get_by_label(label, exact=True).check()
    expect(spec).to_be_visible()


def test_the_json_schema_example_fills_its_schema_and_the_canvas_shows_the_grammar(page):
    from playwright.sync_api import expect
    import jsonschema

    from ui.structured import example_specs

    pick_mode(page, "JSON schema")
    pet = example_specs("json")["pet"]
    expect(page.locator("#pg-structured-example input")).to_have_value("pet")
    expect(page.locator("#pg-structured-spec textarea")).to_have_value(pet)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done", timeout=120_000)
    expect(page.locator("#pg-summary")).to_contain_text("written by the grammar")
    expect(page.locator("#pg-summary")).to_contain_text("stop")
    answer = page.locator("#pg-answer textarea").input_value()
    jsonschema.validate(json.loads(answer), json.loads(pet))
    forced = page.locator("#pg-canvas .tk.forced")
    assert forced.count() >= 3                             # keys, quotes, braces
    assert "written by the grammar" in forced.first.get_attribute("title")
    assert page.locator("#pg-canvas .tk.front").count() == 0    # finished: no frontier
    legend = page.locator(".cv-legend").first
    expect(legend.locator(".tk.forced")).to_have_count(1)
    expect(legend.locator(".tk.front")).to_have_count(1)
    caption = page.locator("#pg-caption")                 # the replay opens at the end
    expect(caption).to_contain_text(re.compile(r"step (\d+) of \1 "))
    set_number(page, "pg-scrub", 0)                        # before the first step
    expect(caption).to_contain_text("every position masked")
    expect(page.locator("#pg-replay-canvas .tk.front")).to_have_count(1)
    expect(page.locator("#pg-replay-canvas .tk.forced")).to_have_count(0)
    last = int(re.search(r"of (\d+)", caption.inner_text()).group(1))
    set_number(page, "pg-scrub", last // 2)                # mid-fill, for the screenshot
    expect(caption).to_contain_text(f"step {last // 2} of {last}")
    page.screenshot(path=str(ARTIFACTS / "structured-json.png"), full_page=True)


def test_a_regex_the_engine_cannot_compile_shows_its_message(page):
    from playwright.sync_api import expect

    pick_mode(page, "regex")
    page.fill("#pg-structured-spec textarea", "(yes|no")
    page.click("#pg-generate")
    expect(state(page)).to_have_text("error")
    summary = page.locator("#pg-summary")
    expect(summary).to_contain_text("structured output: the regex is not supported")
    expect(summary).to_contain_text("parenthesis is not closed")
    assert "Traceback" not in summary.inner_text()


def test_the_chat_tab_shows_a_required_tool_call_as_a_call(page):
    """Chat tab, Tools open, tool_choice required: the reply is a call box titled with the
    function's name, holding arguments that validate against the example's schema."""
    from playwright.sync_api import expect
    import jsonschema

    from ui.chat import TOOLS_EXAMPLE

    page.get_by_role("tab", name="Chat").click()
    page.get_by_text("Tools (function calling)").click()
    page.locator("#chat-tool-choice").get_by_label("required", exact=True).check()
    set_number(page, "chat-gen-length", 96)       # the listed tools take 358 of 512 tokens
    page.fill("#chat-message textarea", "What is the weather in Paris?")
    page.click("#chat-send")
    box = page.locator("#chat-box")
    title = box.get_by_text(re.compile(r"call (get_weather|add)")).first
    expect(title).to_be_visible(timeout=120_000)
    name = re.search(r"call (\w+)", title.inner_text()).group(1)
    title.click()                                           # open the call's box
    args = box.locator("code").filter(has_text="{").last
    expect(args).to_be_visible()
    schemas = {t["function"]["name"]: t["function"]["parameters"]
               for t in json.loads(TOOLS_EXAMPLE)}
    jsonschema.validate(json.loads(args.inner_text()), schemas[name])
    page.screenshot(path=str(ARTIFACTS / "chat-tool-call.png"), full_page=True)
