"""The engine: one request record, one step; each family's layout decides the rest.

request.py (the ``Request`` record and its finish rule), runner.py (one forward, choose, one
host sync; the family's layout runs it), scheduler.py (admission, no threads), llm_engine.py
(``Engine`` and its ``step()``), async_engine.py (the only thread code). What differs between
families is in ``celeris/families/``.
"""

from ..config import ContextLengthError, NonFiniteLogitsError
from ..families.infill import split_infill
from ..model.dispatch import memory_info
from .async_engine import AsyncEngine
from .llm_engine import DEFAULT_MODEL, Engine, new_request_id
from .request import cut_at_stop

__all__ = ["AsyncEngine", "ContextLengthError", "DEFAULT_MODEL", "Engine",
           "NonFiniteLogitsError", "cut_at_stop", "memory_info", "new_request_id",
           "split_infill"]
