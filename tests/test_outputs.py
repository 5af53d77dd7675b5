"""celeris/outputs.py: the shared text rule of a growing answer (``settled_text``)."""

from __future__ import annotations

from celeris.outputs import settled_text


def test_settled_text_holds_back_a_split_character_and_a_tail_that_may_become_a_stop():
    assert settled_text("caf\ufffd\ufffd", ()) == "caf"          # a split UTF-8 character
    assert settled_text("The end. ST", ("STOP",)) == "The end. "   # may still become STOP
    assert settled_text("The end. STO", ("STOP", "TO")) == "The end. "
    assert settled_text("The end. SX", ("STOP",)) == "The end. SX"
    assert settled_text("Sure <tool", ("<tool_call>",)) == "Sure "  # a call may open
    assert settled_text("ab", ("abc",)) == "" and settled_text("", ("x",)) == ""
    assert settled_text("STOP", ("STOP",)) == "STOP"   # a whole stop is cut elsewhere
    assert settled_text("text", ("", "x")) == "text"


def test_every_settled_prefix_of_a_growing_text_is_a_prefix_of_the_final_one():
    final, stops = "One <tool_call> two ST three STOP", ("STOP", "<tool_call>")
    settled = [settled_text(final[:n], stops) for n in range(len(final) + 1)]
    assert all(final.startswith(s) for s in settled)
    assert all(a == b[:len(a)] for a, b in zip(settled, settled[1:]))
