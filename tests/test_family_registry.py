"""The family registry (celeris/families/registry.py) and the Layout protocol.

A new family is one module: ``TOY_FAMILY`` below is written to a file on its own and imported,
exactly as a contributor would add ``celeris/families/toy.py`` (docs/ADDING_A_FAMILY.md). It
declares a config spelling of its own, tensor renames, a published sampler, a generation_config spelling and a layout; a checkpoint in its layout then loads,
decodes, and is served through the OpenAI API without any other file changing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
from safetensors.torch import save_file

import celeris
from celeris import families
from celeris.families import BlockLayout, CanvasLayout, Layout
from celeris.families.gemma_layout import GemmaLayout

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "celeris-tiny-bd"

TOY_FAMILY = '''
"""Toy-DLM: a made-up block-diffusion family with its own spellings."""
from celeris import CelerisConfig, Family, register_family
from celeris.families import BlockLayout


class ToyConfig(CelerisConfig):
    model_type = "toy_dlm"

    def __init__(self, n_embd=32, n_layer=2, n_head=4, **kwargs):
        kwargs.setdefault("attention", "block_causal")
        kwargs.setdefault("block_size", kwargs.pop("chunk", 4))
        super().__init__(hidden_size=n_embd, num_hidden_layers=n_layer,
                         num_attention_heads=n_head, **kwargs)


TOY = register_family(Family(
    name="toy", display="Toy-DLM", model_types=("toy_dlm",), config_class=ToyConfig,
    architectures=("ToyForDiffusion",),
    renames=((r"^tok\\.", "model.embed_tokens."), (r"^head\\.", "lm_head.")),
    sampler={"decoding": "threshold", "threshold": 0.7},
    generation_keys={"answer_len": "gen_length"},
    layout=BlockLayout))
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy family's module imported from its own file, and a random checkpoint in its
    layout (its field names, its tensor names) with the shipped tokenizer."""
    root = tmp_path_factory.mktemp("toy")
    module_file = root / "toy_family.py"
    module_file.write_text(TOY_FAMILY, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("toy_family", module_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_family"] = module
    spec.loader.exec_module(module)
    ckpt = root / "toy-ckpt"
    ckpt.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(SHIPPED / name, ckpt / name)
    vocab = json.loads((SHIPPED / "config.json").read_text())["vocab_size"]
    raw = {"model_type": "toy_dlm", "architectures": ["ToyForDiffusion"], "n_embd": 32,
           "n_layer": 2, "n_head": 4, "chunk": 4, "vocab_size": vocab,
           "intermediate_size": 64, "max_position_embeddings": 512}
    (ckpt / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    torch.manual_seed(0)
    model = celeris.CelerisForMaskedDiffusion(module.ToyConfig(
        **{k: v for k, v in raw.items() if k not in ("model_type", "architectures")}))
    state = {k.replace("model.embed_tokens.", "tok.").replace("lm_head.", "head."): v
             for k, v in model.state_dict().items()}
    save_file({k: v.contiguous() for k, v in state.items()}, str(ckpt / "model.safetensors"))
    (ckpt / "generation_config.json").write_text(json.dumps({"answer_len": 12}))
    yield SimpleNamespace(family=module.TOY, module=module, path=ckpt, reference=model.eval())
    families.unregister("toy")
    sys.modules.pop("toy_family", None)


def test_a_family_added_in_one_module_is_found_loaded_and_decoded(toy):
    assert families.find({"model_type": "toy_dlm"}) is toy.family
    found, model, _ = families.load(toy.path, device="cpu")
    assert found is toy.family and type(model.config).__name__ == "ToyConfig"
    ids = torch.randint(10, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():          # renamed tensors landed where the module put them
        assert torch.equal(model(ids).logits, toy.reference(ids).logits)
    engine = celeris.Engine.from_pretrained(toy.path, device="cpu")
    assert isinstance(engine.layout, BlockLayout) and engine.block_size == 4
    p = engine.default_params()
    assert (p.decoding, p.threshold, p.gen_length, p.block_length, p.cache) == (
        "threshold", 0.7, 12, 4, "prefix")             # its sampler, its spelling of length
    assert engine.info()["family"] == "Toy-DLM"
    result = engine.generate("Once upon a time", p.replace(suppress_eos=True))
    assert result.usage.completion_tokens == 12 and result.finish_reason == "length"


def test_a_family_added_in_one_module_is_served_through_the_api(toy):
    from celeris.server import create_app
    from tests.live_server import live_server
    engine = celeris.Engine.from_pretrained(toy.path, device="cpu")
    body = {"model": "toy-ckpt", "prompt": "Once upon a time", "max_tokens": 8,
            "temperature": 0.0, "suppress_eos": True}
    expected = engine.generate("Once upon a time", engine.default_params().replace(
        gen_length=8, temperature=0.0, suppress_eos=True)).text
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            models = httpx.get(f"{url}/v1/models", timeout=30).json()
            answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    finally:
        engine.stop()
    assert [m["id"] for m in models["data"]] == ["toy-ckpt"]
    assert answer["choices"][0]["text"] == expected and expected
    assert answer["usage"]["completion_tokens"] == 8


def test_a_family_added_in_one_module_reaches_transformers_auto_classes(toy):
    from transformers import AutoConfig, AutoModel
    config = AutoConfig.from_pretrained(toy.path)
    assert type(config).__name__ == "ToyConfig" and config.block_size == 4
    auto = AutoModel.from_pretrained(toy.path).eval()
    assert type(auto).__name__ == "ToyForDiffusion"
    ids = torch.randint(10, 200, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(auto(ids).logits, toy.reference(ids).logits)


def test_an_unknown_model_type_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_blah"}))
    with pytest.raises(celeris.ModelLoadError, match=r"model_type 'gpt_blah' is not a "
                                                     r"supported architecture.*llada2_moe"):
        families.load(tmp_path, device="cpu")


@pytest.mark.parametrize("name", [f.name for f in families.registered()])
def test_every_family_is_found_by_each_model_type_it_claims(name):
    family = families.by_name(name)
    for model_type in family.model_types:
        raw = {"model_type": model_type}
        if family.claims is not None:
            assert family.claims(raw) or families.find(raw) is not family
        else:
            assert families.find(raw) is family
    assert family.display and family.config_class is not None


def test_llada_moe_is_told_from_llada_by_its_keys_and_its_dllm_alias():
    assert families.find({"model_type": "llada", "d_model": 64}).name == "llada"
    assert families.find({"model_type": "llada", "moe_layer_freq": [0, 1]}).name == "llada_moe"
    assert families.find({"model_type": "lladamoe"}).name == "llada_moe"


def test_every_layout_implements_the_protocol_and_a_partial_one_does_not():
    dense = celeris.CelerisConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=4)
    block = celeris.CelerisConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=4,
                                  attention="block_causal", block_size=4)
    layouts = [families.attention_layout(dense, 3), families.attention_layout(block, 3),
               GemmaLayout(SimpleNamespace(canvas_length=8, vocab_size=16), 16)]
    assert [type(x) for x in layouts] == [CanvasLayout, BlockLayout, GemmaLayout]
    assert all(isinstance(x, Layout) for x in layouts)

    class NoRun:                       # a layout that forgot how to run its step
        block_causal, block_size, caches, strict_threshold = False, None, ("none",), False

        def check(self, params, canvas, model): ...
        def defaults(self): ...
        def fit_defaults(self, changes): ...
        def new_cache(self, model, slots): ...
        def start(self, req): ...
        def stops_at_eos(self, req): ...
        def advance(self, req): ...
        def release(self, req): ...

    assert not isinstance(NoRun(), Layout)


def test_no_family_table_lives_outside_the_family_modules():
    """The facts the registry holds are not kept again elsewhere in the package."""
    facts = ("151665", "156895", "151669", '"LLaDA2.x (MoE)"', '"Fast-dLLM v2"', '"SDAR-MoE"',
             '"editing_threshold"', '"alg"')
    outside = [p for p in (ROOT / "celeris").rglob("*.py")
               if p.parent.name != "families" and any(f in p.read_text() for f in facts)]
    assert outside == []
