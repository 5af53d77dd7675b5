"""``device_map="auto"`` (accelerate's big-model inference, celeris/model/dispatch.py).

On this CPU-only machine "auto" puts the whole shipped model on the CPU (no hooks: the model
keeps its packed CPU path); a ``max_memory`` budget too small for it sends the later layers to
disk (``offload_folder``), which attaches accelerate's hooks, streams those layers' weights in
for every forward and turns the packed path off. Both must generate exactly the tokens of the
ordinary load, on a block-causal and a full-attention model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from celeris import Engine, ModelLoadError
from celeris.cache import SlotKVCache
from celeris.config import EngineConfig, normalize_max_memory
from celeris.model.dispatch import hooked, layer_devices, main_device

pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"block_causal": ROOT / "models" / "celeris-tiny-bd",
          "full_attention": ROOT / "models" / "celeris-tiny"}
PROMPT = "Once upon a time"
# the shipped models are ~23 MB in float32: 12 MB of CPU keeps the embeddings and the first
# layers in memory and sends the rest (later layers, final norm, head) to disk
SPLIT_BUDGET = {"cpu": 12_000_000}


def _params(engine: Engine):
    return engine.default_params().replace(
        gen_length=12, steps=None if engine.block_causal else 6,
        block_length=engine.block_size or 6, temperature=0.0, seed=0)


@pytest.fixture(scope="module", params=sorted(MODELS))
def reference(request):
    """(model dir, the ordinary engine, its tokens for PROMPT)."""
    path = MODELS[request.param]
    engine = Engine.from_pretrained(path, device="cpu")
    return path, engine, engine.generate(PROMPT, _params(engine)).token_ids


def test_auto_on_a_cpu_only_machine_loads_on_the_cpu_and_generates_the_same(reference):
    path, ref, tokens = reference
    engine = Engine.from_pretrained(path, device_map="auto")
    assert engine.model.hf_device_map == {"": "cpu"}
    assert not hooked(engine.model) and engine.packed      # one device: an ordinary model
    assert engine.device == torch.device("cpu")
    assert engine.generate(PROMPT, _params(engine)).token_ids == tokens


def test_layers_offloaded_to_disk_generate_the_same_tokens(reference, tmp_path):
    path, ref, tokens = reference
    engine = Engine.from_pretrained(path, device_map="auto", max_memory=SPLIT_BUDGET,
                                    offload_folder=tmp_path / "offload")
    placed = engine.model.hf_device_map
    assert placed["model.embed_tokens"] == "cpu" and placed["lm_head"] == "disk"
    on_disk = [k for k, v in placed.items() if k.startswith("model.layers") and v == "disk"]
    in_memory = [k for k, v in placed.items() if k.startswith("model.layers") and v == "cpu"]
    assert on_disk and in_memory                                 # a real split
    assert (tmp_path / "offload" / "index.json").is_file()
    assert hooked(engine.model) and not engine.packed           # the hooks' module path
    assert engine.model.model.layers[-1].mlp.down_proj.weight.device.type == "meta"
    assert engine.device == torch.device("cpu")
    assert engine.runner.kv.devices == [torch.device("cpu")] * len(engine.model.model.layers)
    assert engine.generate(PROMPT, _params(engine)).token_ids == tokens
    # two requests in one batch (left-padded rows, several slots) still match
    prompts = [PROMPT, "The little robot went to the park with a red ball"]
    want = [r.token_ids for r in ref.generate_batch(prompts, _params(ref))]
    assert [r.token_ids for r in engine.generate_batch(prompts, _params(engine))] == want


def test_layer_devices_follow_accelerate_execution_devices():
    """GPU-mapped layers run (and keep their K/V) on their GPU; cpu/disk-mapped ones on the
    main device (the map's first GPU). Checked on a map alone: no GPU here."""
    class Fake:
        class config:
            num_hidden_layers = 4
        hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1,
                         "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": 1,
                         "lm_head": 1}
    assert main_device(Fake) == torch.device("cuda:0")
    assert layer_devices(Fake) == [torch.device("cuda:0"), torch.device("cuda:1"),
                                   torch.device("cuda:0"), torch.device("cuda:0")]
    Fake.hf_device_map = {"": "cpu"}
    assert main_device(Fake) == torch.device("cpu")
    assert layer_devices(Fake) == [torch.device("cpu")] * 4


def test_kv_cache_puts_each_layer_on_its_device_and_the_view_follows():
    """Per-layer K/V devices (the meta device stands in for a second GPU): buffers are
    allocated and grown there, and a layer's update reads and returns on its device."""
    cpu, other = torch.device("cpu"), torch.device("meta")
    cache = SlotKVCache(2, 2, 4, 64, torch.float32, cpu, slots=2, length=8,
                        layer_devices=[cpu, other])
    assert [t.device for t in cache.k] == [cpu, other] == [t.device for t in cache.v]
    slots = [cache.take(), cache.take()]
    view = cache.bind(slots, [5, 12], [(0, 0, slots[0], 0, 5), (1, 0, slots[1], 0, 12)])
    assert cache.length == 16 and [t.device for t in cache.k] == [cpu, other]   # grown there
    k = torch.randn(2, 2, 12, 4)
    keys, _ = view.update(0, k, k)
    assert keys.device == cpu and torch.equal(keys[1, :, :12], k[1])
    keys, values = view.update(1, k.to(other), k.to(other))
    assert keys.device == other and values.shape == (2, 2, 12, 4)


def test_disk_needed_without_an_offload_folder_is_refused_by_name():
    with pytest.raises(ModelLoadError, match="offload_folder"):
        Engine.from_pretrained(MODELS["block_causal"], device_map="auto",
                               max_memory=SPLIT_BUDGET)


@pytest.mark.parametrize("options,needle", [
    ({"device_map": "balanced"}, "device_map must be 'auto' or None"),
    ({"device_map": "auto", "device": "cpu"}, "leave device at 'auto'"),
    ({"device_map": "auto", "compile": True}, "compile cannot be combined with device_map"),
    ({"max_memory": {"cpu": 10**9}}, "max_memory only applies with device_map='auto'"),
    ({"offload_folder": "x"}, "offload_folder only applies with device_map='auto'"),
    ({"device_map": "auto", "max_memory": "cpu=lots"}, r"max_memory\['cpu'\] must be"),
    ({"device_map": "auto", "max_memory": {"gpu": 1}}, "max_memory keys must be"),
    ({"device_map": "auto", "max_memory": "0:20GiB"}, "max_memory must look like"),
])
def test_bad_values_name_the_field_and_what_is_allowed(options, needle):
    with pytest.raises(ValueError, match=needle):
        EngineConfig(**options)


def test_max_memory_spellings():
    assert normalize_max_memory("0=20GiB, cuda:1=1.5GB ,cpu=512") == \
        {0: 20 * 2**30, 1: 1_500_000_000, "cpu": 512}
    assert normalize_max_memory({"cpu": "12MB"}) == {"cpu": 12_000_000}
    assert EngineConfig(device_map="AUTO").device_map == "auto"


def test_cli_passes_the_options_and_refuses_bad_ones(monkeypatch, capsys):
    from celeris import cli

    seen = {}

    class FakeEngine:
        @classmethod
        def from_pretrained(cls, model, **kwargs):
            EngineConfig(**{k: v for k, v in kwargs.items()})      # validates as the engine
            seen.update(kwargs)
            raise ValueError("stop here")

    import celeris
    monkeypatch.setattr(celeris, "Engine", FakeEngine)
    assert cli.main(["generate", "--prompt", "x", "--device-map", "auto", "--max-memory",
                     "cpu=12MB", "--offload-folder", "off"]) == 2
    assert seen == {"device": "auto", "dtype": "auto", "device_map": "auto",
                    "max_memory": "cpu=12MB", "offload_folder": "off"}
    assert "stop here" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--device-map", "auto",
                     "--device", "cpu"]) == 2
    assert "leave device at 'auto'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--device-map", "balanced"])
    assert "invalid choice" in capsys.readouterr().err
