"""Stand-ins for the UI handler tests: Gradio's request, a loaded engine, the slot's view of
running sessions, and a byte-level vocabulary (id ``i + 100`` is byte ``i``)."""

from __future__ import annotations

from pathlib import Path

M = 99                          # mask id of the fake runs
EOS = 98                        # a special token: decodes to nothing
NO_PROGRESS = lambda *args, **kwargs: None  # noqa: E731


def request(session: str):
    return type("Request", (), {"session_hash": session})()


class FakeEngine:
    def __init__(self, path):
        self.model_dir = Path(path)
        self.started = self.stopped = False

    def start(self):
        self.started = True
        return self

    def stop(self):
        self.stopped = True

    def info(self):
        return {"model": self.model_dir.name, "parameters": 10, "memory_kind": "rss",
                "memory_bytes": 1}


class ActiveSlot:
    """The part of EngineSlot the settle handlers read: which sessions are running."""

    def __init__(self, *active):
        self.active = set(active)

    def running(self, session):
        return session in self.active


def decode(ids):
    return bytes(t - 100 for t in ids if t >= 100).decode("utf-8", errors="replace")


def token_text(ids):
    return [decode([t]) for t in ids]


def byte_ids(text: str) -> list[int]:
    return [b + 100 for b in text.encode("utf-8")]
