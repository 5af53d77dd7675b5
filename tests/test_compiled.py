"""The compiled step option (celeris/model/compiled.py): under torch.compile the engine decodes
the tokens it decodes eagerly, and where compiling cannot work it falls back to eager with one
warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from celeris import Engine, EngineConfig
from celeris.model.compiled import CompiledForward, compile_mode

SHIPPED = "models/celeris-tiny-bd"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(SHIPPED, device="cpu")


def _params(engine, n=8):
    return engine.default_params().replace(gen_length=n, temperature=0.0)


def test_engine_config_compile_wires_the_compiled_forward():
    eager = Engine.from_pretrained(SHIPPED, device="cpu")
    compiled = Engine.from_pretrained(SHIPPED, device="cpu", compile=True)
    assert eager.runner.model is eager.model
    wrapper = compiled.runner.model
    assert isinstance(wrapper, CompiledForward) and wrapper.model is compiled.model
    assert wrapper.mode is None and wrapper.config is compiled.model.config   # CPU: default
    assert compile_mode(torch.device("cuda")) == "reduce-overhead"
    with pytest.raises(ValueError, match="compile must be True or False"):
        EngineConfig(compile="yes")


@pytest.mark.slow
def test_inductor_compiled_tokens_equal_eager_tokens_on_the_shipped_model(engine):
    """Inductor compiles the module path here (the packed CPU path steps aside while
    tracing); every step of a short generation runs compiled and the tokens are eager's."""
    params = _params(engine)
    want = engine.generate(PROMPT, params)
    eager_model = engine.runner.model
    engine.runner.model = CompiledForward(engine.model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)       # no fallback warning
            got = engine.generate(PROMPT, params)
        wrapper = engine.runner.model
    finally:
        engine.runner.model = eager_model
    assert wrapper.fallback is None
    assert wrapper.compiled_calls == got.nfe == want.nfe > 1
    assert got.token_ids == want.token_ids and got.text == want.text


def _failing_backend(gm, example_inputs):
    raise RuntimeError("no compiler on this machine (test backend)")


def test_a_failing_compiler_falls_back_to_eager_with_one_warning(engine):
    params = _params(engine, 4)
    want = engine.generate(PROMPT, params).token_ids
    eager_model = engine.runner.model
    engine.runner.model = wrapper = CompiledForward(engine.model, backend=_failing_backend)
    try:
        with pytest.warns(RuntimeWarning, match="torch.compile is unavailable") as caught:
            got = engine.generate(PROMPT, params).token_ids
            again = engine.generate(PROMPT, params).token_ids
    finally:
        engine.runner.model = eager_model
    assert len([w for w in caught if "torch.compile" in str(w.message)]) == 1
    assert "no compiler on this machine" in wrapper.fallback
    assert wrapper.compiled_calls == 0
    assert got == want and again == want


def test_no_cpp_compiler_means_eager_from_the_start(engine, monkeypatch):
    from torch._inductor import cpp_builder

    def missing():
        raise RuntimeError("no C++ compiler found")
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    with pytest.warns(RuntimeWarning, match="inductor found no C\\+\\+ compiler"):
        wrapper = CompiledForward(engine.model)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        assert torch.equal(wrapper(ids).logits, engine.model(ids).logits)
    assert wrapper.compiled_calls == 0


def test_an_error_of_the_step_itself_is_raised_not_swallowed(engine):
    wrapper = CompiledForward(engine.model, backend="eager")
    wrapper.compiled_calls = 1                  # as if it had compiled before
    with pytest.raises(IndexError):
        with torch.inference_mode():
            wrapper(torch.tensor([[10 ** 6]]))  # a token id past the vocabulary
    assert wrapper.fallback is None


def test_the_cli_passes_compile_to_the_engine(monkeypatch, capsys):
    import celeris
    from celeris import cli
    seen = {}

    class Fake:
        @classmethod
        def from_pretrained(cls, model, **options):
            seen.update(options)
            raise FileNotFoundError("stop here")

    monkeypatch.setattr(celeris, "Engine", Fake, raising=False)
    assert cli.main(["generate", "--prompt", "x", "--compile"]) == 2
    assert seen["compile"] is True
    assert cli.build_parser().parse_args(["serve", "--compile"]).compile is True
