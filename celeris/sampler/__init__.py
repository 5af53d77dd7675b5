"""Unmask schedules, confidence measures, Gumbel noise and the denoising loop."""

from .denoise import DenoiseBatch, MaskPredictor, SamplerRequest, SpecialTokens, StepOutput
from .policies import CONFIDENCES, SELECTORS, linear_schedule

__all__ = ["DenoiseBatch", "MaskPredictor", "SamplerRequest", "SpecialTokens", "StepOutput",
           "CONFIDENCES", "SELECTORS", "linear_schedule"]
