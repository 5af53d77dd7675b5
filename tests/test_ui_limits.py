"""Control limits that follow the model and the prompt (ui/limits.py) and the slider and
dropdown updates built from them (ui/bounds.py): gen length goes up to the context left after
the prompt, an out-of-range value gets a message naming the field and the range, every value
the controls offer is valid, and an update keeps a value that still fits."""

from __future__ import annotations

import pytest

from ui import limits


def test_gen_length_goes_up_to_the_context_left_after_the_prompt():
    b = limits.gen_bounds(512, 14)
    assert (b.lo, b.hi) == (8, 498) and "context 512 - prompt 14" in b.why
    assert limits.gen_bounds(512, None).hi == 511          # unknown prompt: a BOS at least
    assert limits.gen_bounds(6, 2).lo == 4                   # a tiny context still works


def test_out_of_range_values_get_a_message_naming_field_and_range():
    b = limits.gen_bounds(512, 14)
    assert b.check(64) is None and b.check("498") is None
    assert b.check(2000) == ("gen length must be in [8, 498] (context 512 - prompt 14 "
                             "tokens); 2000 was set to 498.")
    assert "was set to 8" in b.check(3)
    assert b.check("lots") == "gen length must be a number in [8, 498]; got 'lots'."
    assert "steps must be in [0, 64]" in limits.steps_bounds(64).check(100)
    assert limits.Bounds("temperature", 0.0, 2.0).check(5) == \
        "temperature must be in [0.0, 2.0]; 5 was set to 2.0."


@pytest.mark.parametrize("gen", [64, 40, 498, 7, 1])
def test_block_choices_all_divide_gen_length(gen):
    choices = limits.block_choices(gen)
    assert choices[0] == 1 and choices[-1] == gen
    assert all(gen % c == 0 for c in choices)
    assert len(choices) == sum(1 for d in range(1, gen + 1) if gen % d == 0)


def test_block_and_steps_are_fitted_to_gen_length():
    assert limits.fit_block(32, 64) == 32 and limits.fit_block(32, 40) == 20
    assert limits.fit_block(12, 498) == 6 and limits.fit_block("x", 40) == 40
    assert limits.steps_stride(64, 16) == 4
    assert limits.fit_steps(30, 64, 16) == 28 and limits.fit_steps(100, 64, 16) == 64
    assert limits.fit_steps(0, 64, 16) == 0


def test_every_value_the_controls_offer_is_valid():
    from celeris import GenerationParams

    for gen in (8, 40, 64, 498):
        for block in limits.block_choices(gen):
            stride = limits.steps_stride(gen, block)
            for steps in range(stride, gen + 1, stride):
                GenerationParams(gen_length=gen, block_length=block, steps=steps)


def test_the_steps_grid_update_keeps_a_value_that_fits_and_moves_one_that_does_not():
    # the update is computed from the steps value of before; it lands after the user may have
    # typed another one, so a value already on the new grid is not sent (not overwritten)
    from ui.bounds import steps_slider

    # what an update sends: the arguments passed (gradio's constructor_args)
    kept = steps_slider(1024, 32, 128).constructor_args   # 32 blocks: 128 steps fit
    assert kept == {"minimum": 0, "maximum": 1024, "step": 32}
    moved = steps_slider(1024, 32, 100).constructor_args  # off the grid of 32: down to 96
    assert moved == {"minimum": 0, "maximum": 1024, "step": 32, "value": 96}
    assert steps_slider(64, 8, "x").constructor_args["value"] == 0   # unreadable: 0
    assert "value" not in steps_slider(64, 8, 0).constructor_args     # 0 is on every grid
    assert steps_slider(64, 8, 128).constructor_args["value"] == 64   # above gen length


def test_the_block_choices_update_keeps_a_block_length_that_is_offered():
    from ui.bounds import block_dropdown

    kept = block_dropdown(1024, 32).constructor_args
    assert set(kept) == {"choices"} and 32 in kept["choices"]
    assert block_dropdown(1024, "32").constructor_args.keys() == {"choices"}
    assert block_dropdown(24, 32).constructor_args["value"] == 24   # no longer offered
    assert block_dropdown(64, 32, block_size=4).constructor_args["value"] == 4
