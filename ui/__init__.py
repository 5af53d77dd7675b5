"""The Gradio playground. app.py builds it with ``build_blocks(EngineSlot(engine, ...))`` and
mounts it with ``theme()``, ``css()`` and ``HEAD``; every tab talks to the engine only through
its public API (``stream``, ``stream_infill``, ``abort``, ``info``, ``default_params``)."""

from .blocks import HEAD, build_blocks, css, theme
from .context import EngineSlot
from .idle import quiet_queue

__all__ = ["EngineSlot", "build_blocks", "css", "theme", "HEAD", "quiet_queue"]
