"""GenerationParams and EngineConfig validation: every bad value names field and range."""

from __future__ import annotations

import math

import pytest

from celeris import EngineConfig, GenerationParams


@pytest.mark.parametrize("changes,message", [
    ({"gen_length": 0}, r"gen_length must be in \[1, 4096\], got 0"),
    ({"gen_length": 2.5}, r"gen_length must be an integer"),
    ({"gen_length": True}, r"gen_length must be an integer"),
    ({"gen_length": 100, "block_length": 32, "steps": 3},
     r"steps must be 0 \(one token a step\) or a multiple of the number of blocks \(4 = "
     r"gen_length 100 / block_length 32, rounded up\) and at most 128: it counts denoising "
     r"steps over the whole answer; got 3"),
    ({"steps": 3}, r"multiple of the number of blocks \(4 = .*; got 3$"),
    ({"steps": 256}, r"and at most 128: .*; got 256$"),
    ({"steps": -1}, r"steps must be 0 .*; got -1$"),
    ({"steps": 2.5}, r"steps must be 0 .*; got 2.5$"),
    ({"steps": True}, r"steps must be 0 .*; got True$"),
    ({"temperature": math.nan}, r"temperature must be a finite number in \[0.0, 2.0\]"),
    ({"temperature": math.inf}, r"temperature must be a finite number"),
    ({"temperature": -0.1}, r"temperature must be in \[0.0, 2.0\], got -0.1"),
    ({"top_p": 0.0}, r"top_p must be in \(0.0, 1.0\]"),
    ({"threshold": 1.5}, r"threshold must be in \(0.0, 1.0\]"),
    ({"decoding": "greedy"}, r"decoding must be one of fixed, threshold, factor, ltr, dynamic; got 'greedy'"),
    ({"remasking": "confident"}, r"remasking must be one of low_confidence"),
    ({"cache": "full"}, r"cache must be one of none, prefix, dual"),
    ({"cfg_scale": 1.0, "cache": "prefix"}, r"cfg_scale > 0 needs cache 'none'"),
    ({"stop": [""]}, r"stop strings must be non-empty"),
    ({"seed": -1}, r"seed must be in \[0, "),
    ({"early_stop": "yes"}, r"early_stop must be true or false"),
])
def test_invalid_values_name_the_field_and_the_allowed_range(changes, message):
    with pytest.raises(ValueError, match=message):
        GenerationParams(**changes)


def test_defaults_are_valid_and_derived_values_follow_llada():
    p = GenerationParams(gen_length=256, block_length=32, steps=64)
    assert (p.num_blocks, p.steps_per_block) == (8, 8)
    assert GenerationParams(gen_length=64).total_steps == 64   # steps=None: one token a step
    assert GenerationParams(gen_length=64, steps=0) == GenerationParams(gen_length=64)


def test_gen_length_is_a_cap_and_the_canvas_rounds_up_to_whole_blocks():
    p = GenerationParams(gen_length=100, block_length=32)
    assert (p.num_blocks, p.canvas_length, p.total_steps) == (4, 128, 128)
    assert GenerationParams(gen_length=5, block_length=32).canvas_length == 32


def test_dream_algorithm_names_map_onto_confidence_measures():
    assert GenerationParams(remasking="maskgit_plus").remasking == "low_confidence"
    assert GenerationParams(remasking="topk_margin").remasking == "margin"
    assert GenerationParams(remasking="origin").remasking == "random"


def test_temperature_above_openais_range_of_2_is_refused():
    assert GenerationParams(temperature=2.0).temperature == 2.0
    with pytest.raises(ValueError, match=r"temperature must be in \[0.0, 2.0\], got 2.5"):
        GenerationParams(temperature=2.5)


def test_remasking_error_lists_each_accepted_name_once():
    with pytest.raises(ValueError) as exc:
        GenerationParams(remasking="confident")
    names = str(exc.value).split("one of ", 1)[1].split(";", 1)[0].split(", ")
    assert len(names) == len(set(names)), str(exc.value)
    assert set(names) == {"low_confidence", "margin", "entropy", "random", "maskgit_plus",
                          "topk_margin", "origin"}


def test_from_dict_rejects_unknown_fields_and_round_trips():
    p = GenerationParams.from_dict({"gen_length": 64, "stop": ["\n\n"]})
    assert p.stop == ("\n\n",)
    assert GenerationParams.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="unknown generation parameter.*max_new_tokens"):
        GenerationParams.from_dict({"max_new_tokens": 5})


@pytest.mark.parametrize("kwargs,message", [
    ({"dtype": "float8"}, "dtype must be one of"),
    ({"device": "tpu"}, "device must be one of"),
    ({"max_running": 0}, r"max_running must be an integer >= 1"),
])
def test_engine_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)
