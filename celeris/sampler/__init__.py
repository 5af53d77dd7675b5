"""Choosing tokens: unmask schedules, confidence measures, Gumbel noise, per-row knobs."""

from .choose import RowKnobs
from .policies import CONFIDENCES, SELECTORS, linear_schedule

__all__ = ["RowKnobs", "CONFIDENCES", "SELECTORS", "linear_schedule"]
