"""The engine: one request record, one step, a layout per attention kind.

request.py (the ``Request`` record and its finish rule), layouts.py (what differs between
full-attention and block-causal families), families.py (defaults, limits, messages),
runner.py (one forward, choose, one host sync), scheduler.py (admission, no threads),
llm_engine.py (``Engine`` and its ``step()``), async_engine.py (the only thread code).
"""

from .async_engine import AsyncEngine
from .families import (DEFAULT_MODEL, ContextLengthError, check_block_params, memory_info,
                       split_infill)
from .llm_engine import Engine, new_request_id
from .request import NonFiniteLogitsError, cut_at_stop

__all__ = ["AsyncEngine", "ContextLengthError", "DEFAULT_MODEL", "Engine",
           "NonFiniteLogitsError", "check_block_params", "cut_at_stop", "memory_info",
           "new_request_id", "split_infill"]
