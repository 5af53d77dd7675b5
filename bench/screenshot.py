"""Retake assets/playground.png: the playground on the default model, one story request.

Not a figure: it reproduces the README's screenshot.

    python bench/screenshot.py [--prompt "..."] [--out assets/playground.png]

Starts the app in-process on a free port with the default engine (models/celeris-tiny-bd),
opens it in the system Chromium (Playwright, headless), generates and saves a screenshot of
the finished run (canvas, gauges, answer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="Can you tell me a story about a brave fox named Pip "
                                          "who finds a key?")
    ap.add_argument("--out", default=str(ROOT / "assets" / "playground.png"))
    args = ap.parse_args()

    from playwright.sync_api import expect, sync_playwright

    from celeris import Engine
    from tests.test_app import running_app

    engine = Engine.from_pretrained(None, device="cpu")
    with running_app(engine) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                     args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.locator("#pg-prompt textarea").fill(args.prompt)
        page.locator("#pg-chat input").check()
        page.click("#pg-generate")
        expect(page.locator("#pg-gauges [data-g=state] b")).to_have_text("done",
                                                                           timeout=120_000)
        page.screenshot(path=args.out, full_page=False)
        browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
