"""The playground in a real browser (Playwright + Debian Chromium, headless).

Opens the page, sets steps and gen length, generates and watches masks appear and all turn
into text, checks the tokens/s gauge, opens the replay and moves the scrubber, stops a run,
sees an invalid-settings toast, runs the race and an infill with HTML in it; and races the
shipped block-diffusion model against the full-canvas one and the AR twin. Screenshots go to
artifacts/ (git-ignored). Set CELERIS_UI_TEST_MODEL (and CELERIS_UI_TEST_AR) to model
directories (models/celeris-tiny, models/celeris-tiny-ar) to drive the real models instead of
random tiny ones, e.g. to refresh assets/playground.png.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.test_app import make_ar_dir, running_app
from tests.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# Records the most masked cells the live canvas ever showed (frames can be faster than polling).
WATCH_MASKS = """() => {
  window.__maxMasks = 0;
  const canvas = document.querySelector('#pg-canvas');
  const count = () => {
    const n = canvas.querySelectorAll('.tk.mask').length;
    if (n > window.__maxMasks) window.__maxMasks = n;
  };
  new MutationObserver(count).observe(canvas, {subtree: true, childList: true,
                                               attributes: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import app

    root = tmp_path_factory.mktemp("browser-models")
    model = os.environ.get("CELERIS_UI_TEST_MODEL") or str(make_tiny_model_dir(
        root / "tiny", max_position_embeddings=1100,   # EOS suppressed: runs fill the canvas
        generation_defaults={"gen_length": 64, "block_length": 8, "suppress_eos": True}))
    ar = os.environ.get("CELERIS_UI_TEST_AR") or make_ar_dir(root / "tiny-ar", Path(model))
    engine, error = app.load_engine(model, device="cpu")
    assert error is None, error
    with running_app(engine, ar_path=str(ar), allow_model_paths=True) as url:
        yield url
    app.stop_engine(engine)


@contextlib.contextmanager
def chromium(chromium_path: str, timeout_ms: int):
    """A headless Chromium (one sync Playwright per thread at a time); retrying assertions
    wait up to ``timeout_ms``."""
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path, headless=True,
                                    args=CHROMIUM_ARGS)
        expect.set_options(timeout=timeout_ms)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def browser(chromium_path):
    """One headless Chromium for the module."""
    with chromium(chromium_path, 30_000) as b:
        yield b


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(url + "/")
    return page


@pytest.fixture(scope="module")
def page(served, browser):
    from playwright.sync_api import expect

    page = open_page(browser, served)
    page.wait_for_selector("#pg-generate")
    # the page-load event has fitted gen length to the prompt (it was built for 1 token)
    expect(page.locator("#pg-gen-length")).not_to_contain_text("prompt 1 tokens")
    yield page
    page.close()


def set_number(page, elem_id: str, value) -> None:
    """Type into a slider's number box; wait until the slider itself shows the value.

    First wait until the slider's range admits the value: its range follows other controls
    through server round trips (gen length sets the steps' top), and a value typed before
    that update lands is clamped by the browser."""
    from playwright.sync_api import expect

    page.wait_for_function(
        """([id, v]) => { const r = document.querySelector(`#${id} input[type=range]`);
                          return r && Number(r.min) <= v && v <= Number(r.max); }""",
        arg=[elem_id, float(value)])
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    expect(page.locator(f"#{elem_id} input[type=range]")).to_have_value(str(value))


def set_choice(page, elem_id: str, value) -> None:
    """Pick one of a dropdown's offered values (it must be offered)."""
    from playwright.sync_api import expect

    box = page.locator(f"#{elem_id} input")
    box.fill(str(value))
    page.get_by_role("option", name=str(value), exact=True).click()
    expect(box).to_have_value(str(value))


def state(page, gauges: str = "#pg-gauges"):
    return page.locator(f"{gauges} [data-g=state] b")


def error_pills(page, elem_id: str):
    """Gradio's red "Error" overlay on a component whose event raised."""
    return page.locator(f"#{elem_id} [data-testid=status-tracker] .error")


def test_generate_animates_the_canvas_and_fills_the_gauges(page):
    from playwright.sync_api import expect

    set_number(page, "pg-gen-length", 128)
    set_number(page, "pg-steps", 128)
    page.evaluate(WATCH_MASKS)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done")
    assert page.evaluate("window.__maxMasks") > 64          # masks appeared first ...
    cells = page.locator("#pg-canvas .tk")
    expect(cells).to_have_count(128)
    expect(page.locator("#pg-canvas .tk.mask")).to_have_count(0)   # ... and all turned
    assert page.locator("#pg-canvas .tk.old").count() > 0            # into text
    assert float(page.locator("#pg-gauges [data-g=tps] b").inner_text()) > 0
    assert int(page.locator("#pg-gauges [data-g=nfe] b").inner_text()) > 0
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=False)


def test_replay_scrubber_shows_an_earlier_step(page):
    from playwright.sync_api import expect

    expect(page.locator("#pg-replay")).to_contain_text("Replay")   # open, under the answer
    expect(page.locator("#pg-commits .js-plotly-plot")).to_be_visible()
    expect(page.locator("#pg-heatmap .js-plotly-plot")).to_be_visible()
    set_number(page, "pg-scrub", 5)
    expect(page.locator("#pg-caption")).to_contain_text("step 5 of")
    replay = page.locator("#pg-replay-canvas")
    assert replay.locator(".tk.mask").count() > 100
    assert replay.locator(".tk.new").count() >= 1
    set_number(page, "pg-scrub", 0)
    expect(page.locator("#pg-caption")).to_contain_text("every position masked")
    expect(replay.locator(".tk.mask")).to_have_count(128)
    page.locator("#pg-replay").screenshot(path=str(ARTIFACTS / "replay.png"))


def test_stop_aborts_a_running_generation(page):
    from playwright.sync_api import expect

    if os.environ.get("CELERIS_UI_TEST_MODEL"):
        pytest.skip("needs the random tiny model's 1,100-token context and suppressed EOS")
    set_number(page, "pg-gen-length", 1024)
    set_choice(page, "pg-block-length", 32)
    set_number(page, "pg-steps", 0)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("running")
    page.wait_for_function("document.querySelectorAll('#pg-canvas .tk.old').length > 4")
    page.click("#pg-stop")
    expect(state(page)).to_have_text("stopped")
    unfilled = page.locator("#pg-canvas .tk.mask, #pg-canvas .tk.skip").count()
    assert 0 < unfilled < 1024 - 4                             # stopped midway


def test_invalid_settings_show_a_toast_and_the_app_keeps_working(page):
    from playwright.sync_api import expect

    set_number(page, "pg-gen-length", 64)
    set_choice(page, "pg-block-length", 16)
    expect(page.locator("#pg-steps input[type=range]")).to_have_attribute("step", "4")
    box = page.locator("#pg-steps input[type=number]")
    box.fill("6")                                   # typed off the slider's grid of 4 blocks
    box.press("Enter")
    page.click("#pg-generate")
    expect(page.get_by_text("or a multiple of the number of blocks").first).to_be_visible()
    expect(state(page)).to_have_text("error")
    set_number(page, "pg-steps", 0)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done")
    expect(page.locator("#pg-canvas .tk")).to_have_count(64)


def test_race_view_runs_three_columns(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Race").click()
    set_number(page, "race-gen-length", 64)
    page.click("#race-go")
    expect(page.locator("#race-summary")).to_contain_text("fast vs reference",
                                                          timeout=120_000)
    expect(page.locator("#race-main-title")).to_contain_text("Fast configuration")
    expect(page.locator("#race-canvas-title")).to_contain_text("Reference sampler")
    for column in ("main", "canvas"):
        expect(page.locator(f"#race-{column}-stats")).to_contain_text("done")
        assert float(page.locator(f"#race-{column}-stats [data-g=tps] b").inner_text()) > 0
        expect(page.locator(f"#race-{column}-canvas .tk.mask")).to_have_count(0)
    expect(page.locator("#race-ar-stats")).to_contain_text("done")
    page.screenshot(path=str(ARTIFACTS / "race.png"), full_page=True)


def test_infill_shows_html_in_the_text_as_text(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Infill").click()
    page.fill("#infill-text textarea", "Story: [MASK] then <i>x</i> ${7*6} end")
    page.click("#infill-go")
    expect(state(page, "#infill-gauges")).to_have_text("done")
    canvas = page.locator("#infill-canvas")
    text = canvas.inner_text()
    assert "<i>x</i>" in text and "${7*6}" in text and "42" not in text
    assert canvas.locator("i").count() == 0
    page.screenshot(path=str(ARTIFACTS / "infill.png"), full_page=True)


# ---------------------------------------------------------------------- issue 17, items 10-15
from ui.examples import examples  # noqa: E402

PROMPT = examples("playground")[0]["prompt"]   # the prompt the playground opens with
COVERED = """(sel) => {
  const t = document.querySelector(sel), r = t.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return !t.contains(hit);
}"""


def slider_max(page, elem_id: str) -> int:
    return int(float(page.locator(f"#{elem_id} [data-testid=max-value]").inner_text()))


def test_sliders_follow_the_model_and_typed_values_get_a_message(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Playground").click()
    first = slider_max(page, "pg-gen-length")
    assert 400 < first < 1100                    # the context less the prompt's tokens
    page.fill("#pg-prompt textarea", PROMPT + " Make it long and happy." * 6)
    expect(page.locator("#pg-gen-length [data-testid=max-value]")).not_to_have_text(str(first))
    top = slider_max(page, "pg-gen-length")
    assert top < first
    box = page.locator("#pg-gen-length input[type=number]")
    box.fill("5000")
    box.press("Tab")
    expect(page.get_by_text(f"gen length must be in [8, {top}]").first).to_be_visible()
    expect(box).to_have_value(str(top))            # moved to the top, and said so
    temperature = page.locator("#pg-temperature input[type=number]")
    temperature.fill("5")
    temperature.press("Tab")
    expect(page.get_by_text("temperature must be in [0.0, 2.0]; 5 was set to 2.0").first
           ).to_be_visible()
    set_number(page, "pg-temperature", 0)
    set_number(page, "pg-gen-length", 64)
    expect(page.locator("#pg-steps [data-testid=max-value]")).to_have_text("64")
    set_choice(page, "pg-block-length", 32)
    set_number(page, "pg-gen-length", 40)        # 32 does not divide 40: the largest that does
    expect(page.locator("#pg-block-length input")).to_have_value("20")
    page.fill("#pg-prompt textarea", PROMPT)
    expect(page.locator("#pg-gen-length [data-testid=max-value]")).to_have_text(str(first))


def test_a_run_over_the_context_shows_the_error_not_masks(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Playground").click()
    page.fill("#pg-prompt textarea", "Once upon a time " * 400)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("error")
    expect(page.locator("#pg-summary")).to_contain_text("exceeds the model's context")
    expect(page.locator("#pg-canvas .tk")).to_have_count(0)
    page.fill("#pg-prompt textarea", PROMPT)


def test_race_stop_marks_the_unfinished_columns_stopped(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Race").click()
    set_number(page, "race-gen-length", slider_max(page, "race-gen-length") // 8 * 8)
    page.click("#race-go")
    expect(page.locator("#race-main-stats")).to_contain_text("running")
    page.click("#race-stop")
    for column in ("main", "canvas", "ar"):
        expect(page.locator(f"#race-{column}-stats")).to_contain_text("stopped")
    expect(page.locator("#race-summary")).to_have_text("Stopped.")
    set_number(page, "race-gen-length", 64)


# ---------------------------------------------------------------------- block diffusion
BD_MODELS = {key: ROOT / "models" / name for key, name in
             (("bd", "celeris-tiny-bd"), ("canvas", "celeris-tiny"), ("ar", "celeris-tiny-ar"))}


@pytest.fixture(scope="module")
def bd_page(browser):
    """The app with the shipped block-diffusion model loaded (its full-canvas and AR
    siblings next to it), in a page of its own."""
    import app
    from playwright.sync_api import expect

    missing = [str(p) for p in BD_MODELS.values() if not (p / "config.json").is_file()]
    if missing:
        pytest.skip(f"needs the shipped models: {', '.join(missing)}")
    engine, error = app.load_engine(str(BD_MODELS["bd"]), device="cpu")
    assert error is None, error
    assert engine.block_causal
    with running_app(engine, ar_path=str(BD_MODELS["ar"]),
                     canvas_path=str(BD_MODELS["canvas"])) as url:
        page = open_page(browser, url)
        page.wait_for_selector("#pg-generate")
        expect(page.locator("#pg-gen-length")).not_to_contain_text("prompt 1 tokens")
        yield page
        page.close()
    app.stop_engine(engine)


def test_race_block_diffusion_vs_full_canvas_vs_the_twin(bd_page):
    from playwright.sync_api import expect

    page = bd_page
    page.get_by_role("tab", name="Race").click()
    expect(page.locator("#race-main-title")).to_contain_text("Block diffusion · celeris-tiny-bd")
    expect(page.locator("#race-canvas-title")).to_contain_text("Full canvas · celeris-tiny")
    expect(page.locator("#race-canvas-title")).not_to_contain_text("celeris-tiny-bd")
    expect(page.locator("#race-ar-title")).to_contain_text("Autoregressive twin · celeris-tiny-ar")
    expect(page.locator("#race-block-length")).to_contain_text("full-canvas runs only")
    set_number(page, "race-gen-length", 32)
    page.click("#race-go")
    expect(page.locator("#race-summary")).to_contain_text("block diffusion vs autoregressive",
                                                          timeout=180_000)
    for column in ("main", "canvas", "ar"):
        expect(page.locator(f"#race-{column}-stats")).to_contain_text("done")
        assert float(page.locator(f"#race-{column}-stats [data-g=tps] b").inner_text()) > 0
        assert int(page.locator(f"#race-{column}-stats [data-g=nfe] b").inner_text()) > 0
    for column in ("main", "canvas"):
        expect(page.locator(f"#race-{column}-canvas .tk.mask")).to_have_count(0)
        assert page.locator(f"#race-{column}-canvas .tk.old").count() > 0
        assert page.locator(f"#race-{column}-canvas .tk").count() <= 32
    assert page.locator("#race-ar-text").inner_text().strip()
    summary = page.locator("#race-summary").inner_text()
    assert "block diffusion" in summary and "full canvas" in summary
    assert "block diffusion vs full canvas" in summary
    page.screenshot(path=str(ARTIFACTS / "race-bd.png"), full_page=True)


def bd_config() -> tuple[int, dict]:
    """The shipped block-diffusion model's block size and generation defaults (read, never
    written here: the model is retrained from time to time)."""
    import json

    config = json.loads((BD_MODELS["bd"] / "config.json").read_text())
    return config["block_size"], json.loads(
        (BD_MODELS["bd"] / "generation_config.json").read_text())


def test_playground_presets_and_blocks_of_the_block_diffusion_model(bd_page):
    from playwright.sync_api import expect

    page = bd_page
    size, defaults = bd_config()
    page.get_by_role("tab", name="Playground").click()
    expect(page.locator("#pg-block-length")).to_contain_text(f"model's blocks of {size}")
    page.locator("#pg-preset").get_by_text("story", exact=True).click()
    expect(page.locator("#pg-block-length input")).to_have_value("1")
    expect(page.locator("#pg-decoding input")).to_have_value("fixed")
    page.locator("#pg-preset").get_by_text("fast", exact=True).click()
    own = defaults.get("decoding") in ("threshold", "ltr")     # fast keeps the model's rule
    expect(page.locator("#pg-decoding input")).to_have_value(
        defaults["decoding"] if own else "threshold")
    block = int(page.locator("#pg-block-length input").input_value())
    assert size % block == 0
    if own and "threshold" in defaults:   # fast runs at
        # the model's own threshold
        expect(page.locator("#pg-threshold input[type=number]")).to_have_value(
            f"{defaults['threshold']:g}")
    set_number(page, "pg-gen-length", 32)
    page.click("#pg-generate")
    expect(state(page)).to_have_text("done", timeout=120_000)
    cells = page.locator("#pg-canvas .tk")
    assert 0 < cells.count() <= 32 + size
    expect(page.locator("#pg-canvas .tk.mask")).to_have_count(0)
    starts = page.locator("#pg-canvas .tk.bs").count()    # one mark per model block
    assert 1 <= starts <= -(-cells.count() // size) + 1
    page.screenshot(path=str(ARTIFACTS / "playground-bd.png"), full_page=False)


def test_infill_next_to_the_block_diffusion_model_runs_on_the_full_canvas_one(bd_page):
    from playwright.sync_api import expect

    page = bd_page
    page.get_by_role("tab", name="Infill").click()
    note = page.locator("#infill-model")
    expect(note).to_contain_text("Fills with the full-canvas model celeris-tiny")
    expect(note).to_contain_text("celeris-tiny-bd, is block diffusion")
    page.fill("#infill-text textarea", "Once upon a time, there was a [MASK] named Tom.")
    page.click("#infill-go")
    expect(state(page, "#infill-gauges")).to_have_text("done", timeout=120_000)
    filled = page.locator("#infill-result textarea").input_value()
    assert filled.startswith("Once upon a time, there was a") and filled.endswith(" named Tom.")
    assert "[MASK]" not in filled
    expect(note).not_to_contain_text("loaded on the first fill")
    for elem_id in ("infill-canvas", "infill-note"):
        expect(error_pills(page, elem_id)).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "infill-bd.png"), full_page=True)


def test_chat_does_not_send_an_empty_message(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Chat").click()
    expect(page.locator("#chat-send")).to_be_disabled()
    page.locator("#chat-message textarea").press("Enter")
    expect(page.get_by_text("Type a message first.").first).to_be_visible()
    for elem_id in ("chat-box", "chat-message"):
        expect(error_pills(page, elem_id)).to_have_count(0)
    page.fill("#chat-message textarea", "hello")
    expect(page.locator("#chat-send")).to_be_enabled()
    page.screenshot(path=str(ARTIFACTS / "chat.png"))


def test_infill_keeps_non_ascii_text_and_counts_filled_tokens_only(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Infill").click()
    set_number(page, "infill-span", 1)
    page.fill("#infill-text textarea", "Story: [MASK] naïve 日本 🦊 end.")
    page.click("#infill-go")
    pinned = page.locator("#infill-canvas .tk.pin")
    expect(page.locator("#infill-canvas")).to_contain_text("naïve 日本")   # this run's canvas
    expect(state(page, "#infill-gauges")).to_have_text("done")
    # the pinned cells spell the text whole (byte-level tokens of ï, 日, 本 and 🦊 included),
    # the prompt before the [MASK] first
    assert "".join(pinned.all_inner_texts()).startswith("Story: naïve 日本 🦊 end.")
    filled = page.locator("#infill-result textarea").input_value()
    assert filled.startswith("Story:") and filled.endswith(" naïve 日本 🦊 end.")
    nfe = int(page.locator("#infill-gauges [data-g=nfe] b").inner_text())
    tpf = float(page.locator("#infill-gauges [data-g=tpf] b").inner_text())
    assert tpf == pytest.approx(1 / nfe, abs=0.01)        # one [MASK] of one token
    page.fill("#infill-text textarea", "[MASK]")
    page.click("#infill-go")
    expect(state(page, "#infill-gauges")).to_have_text("error")
    expect(page.locator("#infill-note")).to_contain_text("nothing around the [MASK]")


def test_api_tab_max_tokens_range_matches_the_context(page):
    import re

    from playwright.sync_api import expect

    page.get_by_role("tab", name="API").click()
    about = page.locator("#api-about")
    expect(about).to_contain_text("max_tokens: 1 to")
    low, context = re.search(r"max_tokens: 1 to (\d+), and prompt tokens \+ max_tokens at "
                             r"most (\d+)", about.inner_text()).groups()
    assert int(low) == int(context) - 1 and int(context) in (512, 1100)
    expect(page.locator("#api-gradio_client")).to_contain_text("update[0], update[1]")
    page.screenshot(path=str(ARTIFACTS / "api.png"))


def test_model_tab_load_error_leaves_the_table_readable(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Model").click()
    page.locator("#model-path textarea, #model-path input").first.fill("/no/such/model")
    page.click("#model-load")
    expect(page.locator("#model-status")).to_contain_text("Could not load the model")
    expect(error_pills(page, "model-info")).to_have_count(0)
    assert not page.evaluate(COVERED, "#model-info table")
    page.screenshot(path=str(ARTIFACTS / "model.png"))
