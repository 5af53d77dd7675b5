"""The API tab's text (ui/api_tab.py): the range of ``max_tokens`` it states comes from the
model's context."""

from __future__ import annotations


def test_api_tab_states_the_max_tokens_range_of_the_context():
    from ui.api_tab import describe

    text = describe("http://h:1", False, 512)
    assert "`max_tokens`: 1 to 511" in text and "at most 512" in text
