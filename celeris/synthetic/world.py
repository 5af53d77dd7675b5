"""What the shipped demo models know, for the people who use them: the world's tables (kinds,
names, adjectives, colours, objects, places) as one description, a story request the models
honour from a few picked details, and the words of a prompt the world never uses.

Everything is read from the story grammar (``corpus``) and the checkable tasks (``tasks``)
themselves, so the description and the word list follow the grammar when it changes. The
playground (its story builder and unknown-word notice) and the server (the response's
``celeris.unknown_words``) both use these functions.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from . import corpus, phrasing, tasks

_WORD = re.compile(r"[A-Za-z]+")
_PIECE = re.compile(r"[^\W\d_]+|.", re.DOTALL)     # a word (letters of any script) or a char
# ASCII punctuation and spacing a prompt may hold without it counting as an unknown character
_ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                      " \t\r\n.,!?;:'\"-+()")


def world() -> dict[str, list[str]]:
    """The demo world as lists of its story grammar's values: ``kinds`` (people, then
    animals), ``names_she``, ``names_he``, ``adjectives``, ``colors``, ``objects``,
    ``places`` (as the stories say them: "in the forest") and ``tasks`` (the checkable
    tasks, "sort: 4 1 9 2")."""
    return {"kinds": list(corpus.KINDS), "names_she": list(corpus.NAMES_SHE),
            "names_he": list(corpus.NAMES_HE), "adjectives": list(corpus.ADJECTIVES),
            "colors": list(corpus.COLORS), "objects": list(corpus.OBJECTS),
            "places": list(corpus.PLACES), "tasks": list(tasks.TASKS)}


def world_markdown() -> str:
    """``world()`` as a compact Markdown list (one line per table)."""
    w = world()
    rows = [("kinds", w["kinds"]), ("names", w["names_she"] + w["names_he"]),
            ("adjectives", w["adjectives"]), ("colours", w["colors"]),
            ("objects", w["objects"]), ("places", w["places"]),
            ("tasks", [f"`{t}: 4 1 9 2`" if t != "add" else "`add: 47 + 85`"
                       for t in w["tasks"]])]
    return "\n".join(f"- **{label}**: {', '.join(values)}" for label, values in rows)


def builder_request(kind: str | None = None, name: str | None = None, adj: str | None = None,
                    obj: str | None = None, place: str | None = None) -> str:
    """A story request for the picked details in the free-phrasing grammar's training parts
    (``phrasing.compose``): "Tell me a story about a brave fox named Pip who lives in the
    forest and finds a key.". An adjective needs a kind to be said; empty picks give "Tell me
    a story."."""
    return phrasing.compose({"kind": kind, "name": name, "adj": adj, "obj": obj,
                             "place": place})[0]


def _literal_words(source: str) -> set[str]:
    """The words of every string literal the grammar's code writes (table entries, the
    literal parts of its f-strings), docstrings and regular expressions left out."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))                      # a docstring
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "compile":
            skip.update(id(a) for a in ast.walk(node))       # re.compile(...) patterns
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip:
            words.update(w.lower() for w in _WORD.findall(node.value))
    return words


@lru_cache(maxsize=1)
def known_words() -> frozenset[str]:
    """Every word the story grammar (stories, long stories, story requests, freely phrased
    requests) and the checkable tasks' prompts can write, lower-case: the words of the string
    literals of ``corpus.py`` (its tables and sentence templates) and ``phrasing.py`` (whose
    held-out parts use only words its training parts or the stories use) and the task names."""
    words = {t.lower() for t in tasks.TASKS}
    for module in (corpus, phrasing):
        words |= _literal_words(Path(module.__file__).read_text(encoding="utf-8"))
    return frozenset(words)


def unknown_words(text: str) -> list[str]:
    """The words and characters of ``text`` the demo world never uses, in order of first
    appearance, each once.

    A word is a run of letters (of any script); it is known when its lower-case form is in
    ``known_words()`` (case does not matter, punctuation around or inside it is no part of
    it: "Fox," and "fox" are the same word; "don't" is "don" and "t"); an unknown word is
    reported lower-case. Digits are always known (the tasks' numbers). A character outside
    the alphabet (ASCII letters, digits, spaces and ``.,!?;:'"-+()``) is reported as itself,
    after the word holding it: emoji, accented letters ("café" gives "café" and "é") and every
    other non-ASCII character, and ASCII symbols such as ``@`` or ``#``. An empty or
    all-known text gives []."""
    known = known_words()
    out: dict[str, None] = {}
    for piece in _PIECE.findall(text):
        if piece[0].isalpha():
            if piece.lower() not in known:
                out.setdefault(piece.lower())
            for ch in piece:
                if ch not in _ALPHABET:
                    out.setdefault(ch)
        elif piece not in _ALPHABET:
            out.setdefault(piece)
    return list(out)


def prompt_unknown_words(prompt: object) -> list[str]:
    """``unknown_words`` of a prompt as the engine takes it: a text, or chat messages (the
    user and system turns' text; earlier answers are the model's own words). Token ids and
    anything else give []."""
    if isinstance(prompt, str):
        return unknown_words(prompt)
    if isinstance(prompt, (list, tuple)):
        texts = [m.get("content") for m in prompt if isinstance(m, dict)
                 and m.get("role") in ("user", "system")]
        return unknown_words("\n".join(t for t in texts if isinstance(t, str)))
    return []
