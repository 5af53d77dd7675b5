"""The story builder and the unknown-word notice in a real browser (Playwright, Chromium), on
the shipped block-diffusion model (issue 52, item 5)."""

from __future__ import annotations

import re

import pytest

from tests.test_app import running_app
from tests.test_browser import chromium, open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def served():
    import app
    from celeris.engine import DEFAULT_MODEL

    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.skip(f"needs the shipped model at {DEFAULT_MODEL}")
    engine, error = app.load_engine(str(DEFAULT_MODEL), device="cpu")
    assert error is None, error
    with running_app(engine) as url:
        yield url
    app.stop_engine(engine)


def _pick(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} input")
    box.click()
    box.fill(value)
    page.keyboard.press("Enter")


def test_story_builder_writes_the_request_and_the_answer_names_the_hero(served,
                                                                      chromium_path):
    from playwright.sync_api import expect

    with chromium(chromium_path, 60_000) as browser:
        page = open_page(browser, served)
        page.wait_for_selector("#pg-generate")
        page.locator("#pg-world").get_by_text("The demo world").click()
        expect(page.locator("#pg-world-list")).to_contain_text("in the forest")
        _pick(page, "pg-world-kind", "cat")
        _pick(page, "pg-world-name", "Luna")
        page.locator("#pg-world-write").click()
        prompt = page.locator("#pg-prompt textarea")
        expect(prompt).to_have_value("Tell me a story about a cat named Luna.")
        expect(page.locator("#pg-unknown")).not_to_contain_text("never saw")
        page.locator("#pg-generate").click()
        expect(page.locator("#pg-answer textarea")).to_have_value(
            re.compile(r"Luna"), timeout=120_000)
        prompt.fill("Tell me a story about a unicorn \U0001f984")
        expect(page.locator("#pg-unknown")).to_contain_text("unicorn")
        page.close()
