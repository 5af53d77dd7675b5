"""Presets and the decoding controls (ui/settings.py, ui/widgets.py): the model's own
settings are the default preset, balanced is stricter than fast on the shipped block model,
and the decoding help names every choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from celeris import Engine, GenerationParams
from ui.settings import DEFAULT_PRESET, FIELDS, preset_settings, preset_values
from ui.widgets import DECODING_CHOICES, decoding_info, preset_radio

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_BD = ROOT / "models" / "celeris-tiny-bd"


def test_the_model_default_preset_is_selected_and_is_the_model_settings():
    radio = preset_radio("x")
    assert radio.value == DEFAULT_PRESET and radio.choices[0][0] == DEFAULT_PRESET
    own = GenerationParams(gen_length=64, block_length=16, steps=32, decoding="fixed")
    values = dict(zip([f for f in FIELDS if f != "seed"], preset_values(DEFAULT_PRESET, 8,
                                                                        None, own)))
    assert (values["gen_length"], values["block_length"], values["steps"]) == (64, 16, 32)


@pytest.mark.skipif(not (SHIPPED_BD / "config.json").is_file(), reason="shipped model")
def test_balanced_is_stricter_than_fast_on_the_shipped_block_model():
    """On the shipped block model, balanced (threshold 0.95) committed exactly what fast
    (0.85) did: the same text in the same 43 forwards."""
    engine = Engine.from_pretrained(str(SHIPPED_BD), device="cpu")
    base, size = engine.default_params(), engine.block_size
    prompt = [{"role": "user", "content": "Tell me a story about a brave fox."}]
    nfe = {}
    for name in ("fast", "balanced"):
        preset = preset_settings(name, 256, size, base)
        preset.pop("steps")
        nfe[name] = engine.generate(prompt, base.replace(**preset)).nfe
    assert nfe["balanced"] > nfe["fast"]


def test_the_decoding_help_names_every_choice_including_ltr():
    info = decoding_info()
    assert all(f"{name} = " in info for name in DECODING_CHOICES) and "ltr = " in info
