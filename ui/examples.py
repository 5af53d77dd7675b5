"""Example prompts from assets/examples.json (ones the shipped tiny model does well on)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

EXAMPLES_FILE = Path(__file__).resolve().parents[1] / "assets" / "examples.json"


@functools.lru_cache(maxsize=1)
def _all() -> dict[str, Any]:
    try:
        return json.loads(EXAMPLES_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def examples(section: str) -> Any:
    """The examples of one tab ([] when the file or the section is missing)."""
    return _all().get(section, [])
