"""Chat turns with the shipped model (issue 52, item 4): it learned single-turn chats, so its
family sends a chat as its system turns and its last user turn (``Family.chat_messages``);
a story request after two task turns is answered as it is alone. Other families keep the
whole history."""

from __future__ import annotations

import pytest

import celeris
from celeris.families import by_name
from celeris.synthetic import longcheck

HISTORY = [{"role": "user", "content": "sort: 4 1 9 2"},
           {"role": "assistant", "content": "1 2 4 9"},
           {"role": "user", "content": "add: 47 + 85"},
           {"role": "assistant", "content": "132"}]
REQUEST = {"role": "user", "content": "Tell me a story about a fox named Tom."}


def test_the_celeris_family_keeps_system_turns_and_the_last_request():
    system = {"role": "system", "content": "be kind"}
    chat = [system, *HISTORY, REQUEST]
    assert by_name("celeris").chat_messages(chat) == [system, REQUEST]
    assert by_name("celeris").chat_messages("sort: 1 2") == "sort: 1 2"
    assert by_name("llada").chat_messages(chat) == chat          # real checkpoints: all


@pytest.mark.slow
def test_a_story_request_after_two_task_turns_is_answered_as_alone():
    from celeris.engine import DEFAULT_MODEL

    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.skip(f"needs the shipped model at {DEFAULT_MODEL}")
    engine = celeris.Engine.from_pretrained(None, device="cpu")
    try:
        params = engine.default_params().replace(temperature=0.0, seed=0)
        alone = engine.generate([REQUEST], params)
        after = engine.generate([*HISTORY, REQUEST], params)
        assert after.text == alone.text
        assert after.usage.prompt_tokens == alone.usage.prompt_tokens
        asks = {"kind": "fox", "name": "Tom"}
        assert longcheck.request_misses(after.text, asks) == \
            longcheck.request_misses(alone.text, asks) == []
    finally:
        engine.stop()
