"""--quantize (celeris/model/quantize.py): every family's tiny random checkpoint in each mode
the CPU runs, the refusals, the weight bytes, the packed CPU path and pre-quantized
(compressed-tensors) checkpoints.

Each quantized model is held to two references on a fixed batch of positions:

- the same model at full width with each quantized weight replaced by its dequantized
  values: equal within float rounding (module path) or bfloat16 rounding (the packed int8
  path), so the kernels compute exactly the quantized model;
- the model at full width: the relative error of the logits, ||q - f|| / ||f||, and the share
  of positions whose argmax (the T=0 token) is unchanged, within the bounds below, measured
  on these checkpoints (the largest seen, then rounded up). Random tiny checkpoints are far
  more sensitive than trained models (weights of std 0.3-0.5, near-tied logits), hence loose
  bounds there and tighter ones for the shipped trained models.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import celeris
from celeris import (CelerisForMaskedDiffusion, Engine, EngineConfig, ModelLoadError,
                     QuantizeError, config_weight_bytes, load_model, quantize_model,
                     weight_bytes)
from celeris.model import quantize as q
from celeris.model.packed import Int8Rows, Linears
from tests.test_diffusion_gemma import write_tiny_diffusion_gemma
from tests.test_families import write_family
from tests.tiny_model import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_BD, SHIPPED_FULL = ROOT / "models" / "celeris-tiny-bd", ROOT / "models" / "celeris-tiny"
CPU = torch.device("cpu")
NATIVE = ("celeris", "celeris_bd", "illada", "dream", "sdar", "fast_dllm_v2")
MOE = ("llada2", "sdar_moe", "llada_moe", "dgemma")
FAMILIES = NATIVE + MOE
# Relative logit error and argmax agreement vs full width on the random tiny checkpoints.
# Measured maxima / minima (2 x 16 positions): int8 0.059 / 0.875, fp8 0.30 / 0.59,
# int4 0.55 / 0.34; DiffusionGemma's random checkpoint (its encoder's 2% error grows to 20%
# through the decoder; the same tensors dequantized give 1e-6) int8 0.20 / 0.88, fp8 0.22 /
# 0.63.
REL = {"int8": 0.08, "fp8": 0.35, "int4": 0.6}
REL_DGEMMA = {"int8": 0.25, "fp8": 0.3}
AGREE = {"int8": 0.8, "fp8": 0.5, "int4": 0.3}
# The shipped celeris-tiny-bd (trained, 2026-12-07 weights), module path, relative logit error
# / argmax agreement on the probe: measured 0.009 / 1.0 (int8), 0.031 / 0.97 (fp8), 0.18 / 0.78
# (int4: its probe positions are flat, 7 of 32 change); its answers at T=0 to 12 held-out task
# prompts (2 a task) keep >= 85% of their tokens in int4, all in int8.
REL_SHIPPED = {"int8": 0.03, "fp8": 0.06, "int4": 0.35}
TOKENS_SHIPPED = {"int8": 0.95, "int4": 0.85}
AGREE_SHIPPED = {"int8": 0.95, "int4": 0.7}
# Products on bfloat16 inputs (the packed int8 path's torch._weight_int8pack_mm; int4 on the
# CPU, both paths) vs the dequantized weights on float32 inputs: measured 0.023 (random tiny)
# and 0.010 (celeris-tiny-bd) for packed int8, argmax equal; up to 0.036 for int4 (Dream's
# random tiny model, whose q/k/v biases are added in bfloat16).
BF16_INPUTS = 0.05


# ---------------------------------------------------------------------- checkpoints
def _retyped(path: Path, model_type: str, arch: str, **config) -> Path:
    """A make_tiny_model_dir checkpoint (Qwen2-style names: Dream's and SDAR's) whose
    config.json says it is ``model_type``."""
    make_tiny_model_dir(path, **config)
    raw = json.loads((path / "config.json").read_text())
    raw.update(model_type=model_type, architectures=[arch])
    (path / "config.json").write_text(json.dumps(raw))
    return path


BUILDERS = {
    "celeris": lambda p: make_tiny_model_dir(p),
    "celeris_bd": lambda p: make_tiny_model_dir(
        p, shift_logits=True, attention="block_causal", block_size=4,
        generation_defaults={"gen_length": 16, "block_length": 4, "temperature": 0.0}),
    "dream": lambda p: _retyped(p, "Dream", "DreamModel", shift_logits=True, qkv_bias=True,
                                num_key_value_heads=2),
    "sdar": lambda p: _retyped(p, "sdar", "SDARForCausalLM", qk_norm=True, head_dim=8,
                               attention="block_causal", block_size=4,
                               generation_defaults={"gen_length": 16, "block_length": 4,
                                                    "temperature": 0.0}),
    "dgemma": lambda p: write_tiny_diffusion_gemma(p),
    **{f: (lambda p, f=f: write_family(p, f))
       for f in ("illada", "fast_dllm_v2", "llada2", "sdar_moe", "llada_moe")},
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantize")
    out = {}
    for name in FAMILIES:
        BUILDERS[name](root / name)
        out[name] = root / name
    return out


# ---------------------------------------------------------------------- helpers
def _logits(model, seed: int = 0) -> torch.Tensor:
    """The model's logits on a fixed batch (DiffusionGemma: a canvas denoised after an
    encoded prompt), under inference mode as the engine runs it."""
    g = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    with torch.inference_mode():
        if hasattr(model, "hf"):
            ids = torch.randint(5, V, (1, 12), generator=g)
            canvas = torch.randint(5, V, (1, 8), generator=g)
            cache = model.encode(ids)
            return model.denoise(canvas, torch.arange(12, 20)[None], model.stack([cache]))
        ids = torch.randint(5, min(V, 300), (2, 16), generator=g)
        return model(ids).logits


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _agree(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


def _dequantized_twin(path: Path, quantized) -> object:
    """The full-width model of ``path`` with each quantized weight of ``quantized`` written
    back as its dequantized values (float): the function the quantized model must compute."""
    twin, _ = load_model(path, device="cpu")
    with torch.no_grad():
        for target in q.targets(twin):
            module, attr = target.name.rsplit(".", 1)
            held = getattr(quantized.get_submodule(module), attr)
            if isinstance(held, q.ExpertStack):
                values = torch.stack([_dequantize(w) for w in held])
            elif q.quantized(held):
                values = _dequantize(held)
            else:
                continue                   # left full width (named in the report)
            target.tensor.copy_(values)
    return twin


def _dequantize(w: torch.Tensor) -> torch.Tensor:
    """A torchao weight's values: its own dequantize, or (int4's CPU layout has none) the
    product of the identity with it (in the weight's dtype, bfloat16 for int4 on the CPU:
    its scales take the inputs' dtype), which its kernel computes exactly."""
    if hasattr(w, "dequantize"):
        try:
            return w.dequantize()
        except NotImplementedError:
            pass
    with torch.inference_mode():
        eye = torch.eye(w.shape[1], dtype=w.dtype)
        return torch.nn.functional.linear(eye, w).t().float().clone()


def _module_path(model):
    """``model`` with its packed CPU copy dropped (the module path), if it had one."""
    if getattr(model, "_packed", None) is not None:
        model.unpack_inference()
    return model


def _quantized(path: Path, mode: str):
    """(engine, its model) in ``mode``; fp8 is quantized with the device check skipped
    (torchao's fp8 tensors dequantize on the CPU; the engine refuses fp8 there)."""
    if mode != "fp8":
        engine = Engine.from_pretrained(path, device="cpu", quantize=mode)
        return engine, engine.model
    engine = Engine.from_pretrained(path, device="cpu")
    model = _module_path(engine.model)
    model.celeris_quantization = quantize_model(model, "fp8", CPU, torch.float32,
                                                check_device=False)
    return engine, model


def _cases():
    for family in FAMILIES:
        for mode in ("int8", "int4", "fp8"):
            if mode == "int4" and family in MOE:
                continue                   # refused: test_int4_refuses_...
            yield family, mode


# ---------------------------------------------------------------------- every family, every mode
@pytest.mark.parametrize("family,mode", list(_cases()))
def test_each_mode_loads_generates_and_stays_close_to_full_width(dirs, family, mode):
    path = dirs[family]
    engine, model = _quantized(path, mode)
    report = model.celeris_quantization
    assert report["mode"] == mode and report["quantized_tensors"] > 0
    if family in MOE:
        assert report["quantized_experts"] > 0
    # the kernels compute the quantized model: its dequantized twin gives the same logits
    got = _logits(model)
    twin = _dequantized_twin(path, model)
    packed_int8 = mode == "int8" and getattr(model, "_packed", None) is not None
    assert _rel(got, _logits(twin)) < (BF16_INPUTS if packed_int8 or mode == "int4" else 1e-5)
    # close to full width
    full, _ = load_model(path, device="cpu")
    want = _logits(full)
    bound = REL_DGEMMA[mode] if family == "dgemma" else REL[mode]
    assert _rel(got, want) < bound
    assert _agree(got, want) >= AGREE[mode]
    # it generates
    params = engine.default_params().replace(temperature=0.0, seed=0, gen_length=8)
    result = engine.generate("the quick brown fox", params)
    assert result.nfe >= 1 and result.finish_reason in ("stop", "length")
    assert engine.info()["weight_bytes"] == weight_bytes(model)["total"]


def test_shipped_model_quantized_stays_close_to_full_width_on_held_out_tasks():
    from celeris.synthetic.tasks import TASKS, eval_examples

    prompts = [[{"role": "user", "content": ex.prompt}]
               for task in TASKS for ex in eval_examples(task, 2)]
    full = Engine.from_pretrained(SHIPPED_BD, device="cpu")
    params = full.default_params().replace(temperature=0.0, seed=0)
    want = [r.token_ids for r in full.generate_batch(prompts, params)]
    want_logits = _logits(_module_path(full.model))
    for mode in ("int8", "int4"):
        engine = Engine.from_pretrained(SHIPPED_BD, device="cpu", quantize=mode)
        got = [r.token_ids for r in engine.generate_batch(prompts, params)]
        same = sum(sum(a == b for a, b in zip(x, y)) for x, y in zip(got, want))
        total = sum(max(len(x), len(y)) for x, y in zip(got, want))
        assert same / total >= TOKENS_SHIPPED[mode], mode
        logits = _logits(_module_path(engine.model))
        assert _rel(logits, want_logits) < REL_SHIPPED[mode], mode
        assert _agree(logits, want_logits) >= AGREE_SHIPPED[mode], mode
    _, fp8 = _quantized(SHIPPED_BD, "fp8")
    assert _rel(_logits(fp8), want_logits) < REL_SHIPPED["fp8"]


# ---------------------------------------------------------------------- refusals
def test_fp8_on_the_cpu_is_refused_naming_the_mode_device_and_reason(dirs):
    with pytest.raises(QuantizeError) as err:
        Engine.from_pretrained(dirs["celeris"], device="cpu", quantize="fp8")
    text = str(err.value)
    assert "--quantize fp8" in text and "this device is cpu" in text
    assert "compute capability >= 8.9" in text and "int8" in text


@pytest.mark.parametrize("family", MOE)
def test_int4_refuses_a_mixture_of_experts_model_by_name(dirs, family):
    with pytest.raises(QuantizeError) as err:
        Engine.from_pretrained(dirs[family], device="cpu", quantize="int4")
    text = str(err.value)
    assert "--quantize int4" in text and "mixture-of-experts" in text
    assert "experts" in text.split("e.g. ")[1] and "use --quantize int8" in text


@pytest.mark.parametrize("mode,cap,dtype,needle", [
    ("fp8", (8, 0), torch.bfloat16, "has 8.0"),
    ("fp8", (9, 0), torch.bfloat16, None),
    ("int4", (9, 0), torch.float16, "add --dtype bfloat16"),
    ("int4", (7, 5), torch.bfloat16, "compute capability >= 8.0; cuda:0 (Fake GPU) has 7.5"),
    ("int4", (9, 0), torch.bfloat16, None),
    ("int8", (7, 5), torch.float16, None),
])
def test_cuda_refusals_name_the_gpu_its_capability_and_the_reason(monkeypatch, mode, cap,
                                                                   dtype, needle):
    """The rules for GPUs, with the device's name and capability faked (no GPU here)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    why = q.refusal(mode, torch.device("cuda:0"), dtype)
    if needle is None:
        assert why is None
    else:
        assert f"--quantize {mode}" in why and needle in why and "Fake GPU" in why


def test_each_mode_and_device_takes_its_torchao_config():
    """What a GPU would run (no GPU here): the configs handed to torchao's quantize_."""
    from torchao.prototype.quantization.int4.inference_workflow import (
        PrototypeInt4WeightOnlyConfig)
    from torchao.quantization import (Float8WeightOnlyConfig, Int4WeightOnlyConfig,
                                      Int8WeightOnlyConfig)
    cuda = torch.device("cuda")
    assert isinstance(q._config("int8", CPU), Int8WeightOnlyConfig)
    assert isinstance(q._config("int8", cuda), Int8WeightOnlyConfig)
    assert isinstance(q._config("fp8", cuda), Float8WeightOnlyConfig)
    cpu4 = q._config("int4", CPU, 64)
    assert isinstance(cpu4, PrototypeInt4WeightOnlyConfig) and cpu4.group_size == 64
    gpu4 = q._config("int4", cuda, 128)
    assert isinstance(gpu4, Int4WeightOnlyConfig) and gpu4.group_size == 128
    assert gpu4.int4_packing_format == "tile_packed_to_4d"
    assert [q.int4_group(s) for s in ((32, 256), (48, 96), (16, 32), (8, 32), (32, 48))] == \
        [128, 32, 32, None, None]


def test_missing_torchao_is_refused_with_what_to_install(monkeypatch, dirs):
    monkeypatch.setattr(q, "installed", lambda package: package != "torchao")
    with pytest.raises(QuantizeError, match=r"--quantize int8 needs torchao.*"
                                            r"requirements-quant\.txt.*torchao==0\.18\.0"):
        Engine.from_pretrained(dirs["celeris"], device="cpu", quantize="int8")


def test_engine_config_checks_the_mode_and_its_combinations():
    assert EngineConfig(quantize="INT8").quantize == "int8"
    assert EngineConfig(quantize="none").quantize is None
    with pytest.raises(ValueError, match="quantize must be one of int8, int4, fp8"):
        EngineConfig(quantize="int3")
    with pytest.raises(ValueError, match="cannot be combined with device_map='auto'"):
        EngineConfig(quantize="int8", device_map="auto")


def test_torchao_is_imported_only_inside_functions():
    """The default path never imports torchao itself (transformers does, when installed)."""
    for path in (ROOT / "celeris").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torchao" for n in names), path


# ---------------------------------------------------------------------- bytes
def _inner_bytes(t: torch.Tensor) -> int:
    """A tensor's bytes counted from its element counts (a torchao tensor: its inner ones)."""
    if q.quantized(t):
        names, _ = t.__tensor_flatten__()
        return sum(_inner_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


@pytest.mark.parametrize("family,mode", [c for c in _cases() if c[1] != "fp8"]
                         + [("celeris", "fp8"), ("llada2", "fp8"), ("dgemma", "fp8")])
def test_weight_bytes_are_the_tensors_real_sizes_and_the_configs_predict_them(dirs, family,
                                                                              mode):
    _, model = _quantized(dirs[family], mode)
    unique = {id(p): p for p in model.parameters()}.values()
    assert weight_bytes(model)["total"] == sum(_inner_bytes(p) for p in unique)
    raw = json.loads((dirs[family] / "config.json").read_text())
    assert config_weight_bytes(raw, mode, "float32", "cpu") == weight_bytes(model)["total"]
    full, _ = load_model(dirs[family], device="cpu")
    assert config_weight_bytes(raw, None, "float32", "cpu") == weight_bytes(full)["total"]


def test_int8_and_int4_weigh_at_most_052_and_030_of_bfloat16():
    for mode, ratio in (("int8", 0.52), ("int4", 0.30)):
        engine = Engine.from_pretrained(SHIPPED_BD, device="cpu", quantize=mode)
        wb = weight_bytes(engine.model)
        assert wb["quantized"] <= ratio * wb["quantized_bf16"], (mode, wb)
        assert wb["total"] == wb["quantized"] + wb["full_width"]
        info = engine.info()
        assert info["quantize"] == mode and info["weight_bytes"] == wb["total"]
        assert info["quantization"]["quantized_tensors"] == 42      # 6 layers x 7 linears


def test_a_linear_the_int4_layout_cannot_hold_stays_full_width_and_is_named(dirs):
    """fast_dllm_v2's down projection reads 48 inputs: no int4 group of 32/64/128 fits."""
    engine = Engine.from_pretrained(dirs["fast_dllm_v2"], device="cpu", quantize="int4")
    kept = engine.info()["quantization"]["full_width_tensors"]
    assert sorted(kept) == [f"model.layers.{i}.mlp.down_proj.weight" for i in range(2)]
    assert "shape is (32, 48)" in kept["model.layers.0.mlp.down_proj.weight"]
    assert not q.quantized(engine.model.model.layers[0].mlp.down_proj.weight)


def test_tied_weights_stay_tied_and_count_once(dirs):
    """DiffusionGemma's encoder and decoder layers share their weights."""
    _, model = _quantized(dirs["dgemma"], "int8")
    enc = model.hf.model.encoder.language_model.layers[0]
    dec = model.hf.model.decoder.layers[0]
    assert enc.self_attn.q_proj.weight is dec.self_attn.q_proj.weight
    assert enc.experts.gate_up_proj is dec.experts.gate_up_proj
    assert q.quantized(dec.self_attn.q_proj.weight)
    assert not q.quantized(dec.router.proj.weight)          # routers stay as loaded


def test_embedding_and_head_stay_full_width(dirs):
    _, model = _quantized(dirs["celeris"], "int8")
    assert not q.quantized(model.model.embed_tokens.weight)
    assert not q.quantized(model.lm_head.weight)
    assert q.quantized(model.model.layers[0].self_attn.q_proj.weight)


def test_published_configs_fit_table_matches_the_configs():
    from celeris.bench.quant import fit_rows
    rows = {r["model"]: r for r in fit_rows()}
    llada = rows["LLaDA-8B"]
    assert llada["bytes"]["bf16"] == 2 * 8_015_581_184          # LLaDA-8B's parameters
    # int8: the layers' 6.98B values a byte + a float32 scale and int8 zero point per row;
    # the embedding and head (2 x 126464 x 4096) stay bfloat16
    layers = 32 * (4 * 4096 * 4096 + 3 * 4096 * 12288)
    rows_per_layer = 4 * 4096 + 2 * 12288 + 4096
    norms = 32 * 2 * 4096 + 4096
    assert llada["bytes"]["int8"] == (2 * 2 * 126464 * 4096 + 2 * norms
                                      + layers + 5 * 32 * rows_per_layer)
    assert rows["LLaDA2.0-mini"]["int4_gb"] == "refused (MoE)"
    assert 0.26 < llada["bytes"]["int4"] / llada["bytes"]["bf16"] < 0.40


# ---------------------------------------------------------------------- the packed CPU path
def test_int8_goes_into_the_packed_path_and_matches_the_module_path():
    engine = Engine.from_pretrained(SHIPPED_BD, device="cpu", quantize="int8")
    model = engine.model
    assert engine.packed and engine.info()["packed"]
    layer = model._packed.layers[0]
    assert isinstance(layer.qkv, Int8Rows) and layer.qkv.q.dtype == torch.int8
    assert isinstance(layer.gate_up, Int8Rows) and not isinstance(model._packed.head, Int8Rows)
    packed = _logits(model)
    module = _logits(_module_path(model))
    assert _rel(packed, module) < BF16_INPUTS
    assert _agree(packed, module) == 1.0


def test_int4_packed_path_runs_torchaos_kernel_per_projection():
    """The same kernel on the same bfloat16 inputs, up to where float32 rounding of the
    packed path's fused ops moves an input across a bfloat16 step (measured 0.0015)."""
    engine = Engine.from_pretrained(SHIPPED_BD, device="cpu", quantize="int4")
    model = engine.model
    assert isinstance(model._packed.layers[0].qkv, Linears)
    packed, module = _logits(model), _logits(_module_path(model))
    assert _rel(packed, module) < 0.01
    assert _agree(packed, module) == 1.0


# ---------------------------------------------------------------------- pre-quantized checkpoints
def _ct_fp8(src: Path, dst: Path, model_cls) -> Path:
    """``src`` rewritten by compressed-tensors as an FP8 (per channel) checkpoint, its
    linear layers but the head and routers quantized (what llm-compressor writes)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    model = model_cls.from_pretrained(str(src), dtype=torch.float32).eval()
    qc = QuantizationConfig(config_groups={"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
        "dynamic": False}}}, ignore=["lm_head", "re:.*router.*", "re:.*vision.*"])
    apply_quantization_config(model, qc, show_progress=False)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "weight_scale"):
                m.weight_scale.copy_(m.weight.abs().amax(1, keepdim=True).float() / 448.0)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(str(dst))
    compressor.update_config(str(dst))
    for f in src.iterdir():
        if f.name != "config.json" and not f.name.endswith(".safetensors"):
            shutil.copy(f, dst / f.name)
    return dst


def _fp8_values(src: Path, dst: Path):
    """The full-width model of ``src`` holding the values ``dst`` stores: each quantized
    weight read from the file and multiplied by its scale, by hand."""
    model, _ = load_model(src, device="cpu")
    state = load_file(str(dst / "model.safetensors"))
    params = dict(model.named_parameters(remove_duplicate=False))
    prefix = "hf." if hasattr(model, "hf") else ""
    with torch.no_grad():
        for name, t in state.items():
            if name.endswith(".weight_scale"):
                weight = name.replace(".weight_scale", ".weight")
                params[prefix + weight].copy_(state[weight].float() * t)
    return model


@pytest.mark.parametrize("family", ["celeris", "dgemma"])
def test_compressed_tensors_fp8_checkpoint_loads_with_its_library(dirs, tmp_path, family):
    pytest.importorskip("compressed_tensors", reason="pip install -r requirements-quant.txt")
    from transformers import DiffusionGemmaForBlockDiffusion
    cls = DiffusionGemmaForBlockDiffusion if family == "dgemma" else CelerisForMaskedDiffusion
    ckpt = _ct_fp8(dirs[family], tmp_path / "ct", cls)
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["quantization_config"]["quant_method"] == "compressed-tensors"
    engine = Engine.from_pretrained(ckpt, device="cpu")
    info = engine.info()
    assert info["quantize"] is None
    assert info["quantization"]["prequantized"] == ("compressed-tensors float-quantized: "
                                                    "float8 weights per channel")
    assert "dequantized" in info["quantization"]["runs_as"]
    # the checkpoint's values, not its raw bytes read as floats
    got = _logits(_module_path(engine.model))
    assert _rel(got, _logits(_fp8_values(dirs[family], ckpt))) < 1e-5
    full, _ = load_model(dirs[family], device="cpu")
    assert _rel(got, _logits(full)) < (REL_DGEMMA if family == "dgemma" else REL)["fp8"]
    result = engine.generate("the quick brown fox",
                             engine.default_params().replace(temperature=0.0, gen_length=8))
    assert result.nfe >= 1
    with pytest.raises(ModelLoadError, match="already quantized.*drop --quantize"):
        Engine.from_pretrained(ckpt, device="cpu", quantize="int8")


def _with_quantization_config(src: Path, dst: Path, qc: dict) -> Path:
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    raw["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "quantization_status": "compressed",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
              "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
              "dynamic": False}}}, "ignore": ["lm_head"]}


def test_compressed_tensors_checkpoint_without_the_library_is_refused_by_name(
        dirs, tmp_path, monkeypatch):
    from celeris.families import loading
    ckpt = _with_quantization_config(dirs["celeris"], tmp_path / "ct", CT_FP8)
    monkeypatch.setattr(loading, "installed", lambda package: package != "compressed_tensors")
    with pytest.raises(ModelLoadError) as err:
        Engine.from_pretrained(ckpt, device="cpu")
    text = str(err.value)
    assert "compressed-tensors float-quantized: float8 weights per channel" in text
    assert "pip install -r requirements-quant.txt" in text and "compressed-tensors" in text


@pytest.mark.parametrize("qc,name", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8"),
])
def test_other_pre_quantized_formats_are_refused_by_name(dirs, tmp_path, qc, name):
    ckpt = _with_quantization_config(dirs["celeris"], tmp_path / name, qc)
    with pytest.raises(ModelLoadError) as err:
        Engine.from_pretrained(ckpt, device="cpu")
    text = str(err.value)
    assert f"quantization_config {name}" in text and "compressed-tensors format only" in text


# ---------------------------------------------------------------------- surfaces
def test_cli_generate_and_eval_take_quantize(dirs, capsys):
    from celeris import cli
    rc = cli.main(["generate", "--model", str(dirs["celeris"]), "--prompt", "the quick",
                   "--device", "cpu", "--quantize", "int8", "--gen-length", "8", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["nfe"] >= 1
    rc = cli.main(["generate", "--model", str(dirs["celeris"]), "--prompt", "x",
                   "--device", "cpu", "--quantize", "fp8"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --quantize fp8 needs a CUDA GPU")
    parser = cli.build_parser()
    for command in (["serve"], ["bench"], ["eval"]):
        assert parser.parse_args([*command, "--quantize", "int4"]).quantize == "int4"
    rc = cli.main(["eval", "--kind", "ar", "--quantize", "int8"])
    assert rc == 2 and "--quantize applies to --kind diffusion" in capsys.readouterr().err


def test_app_takes_quantize_for_its_model():
    import app
    assert app.parse_args(["--quantize", "int8"]).quantize == "int8"


def test_model_card_line_shows_the_weights_and_their_width():
    from ui import render
    engine = Engine.from_pretrained(SHIPPED_BD, device="cpu", quantize="int8")
    md = render.model_markdown(engine.info())
    assert "| weights | `7.5 MB, int8` |" in md
    full = render.model_markdown(Engine.from_pretrained(SHIPPED_BD, device="cpu").info())
    assert "| weights | `22.0 MB, full width` |" in full
    assert celeris.weight_bytes is weight_bytes


def test_v1_models_names_the_quantization_and_weight_bytes():
    import httpx

    from celeris.server import create_app
    from tests.live_server import live_server

    engine = Engine.from_pretrained(device="cpu", quantize="int8")
    try:
        with live_server(create_app(engine)) as url:
            card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
        assert card["quantize"] == "int8"
        assert card["weight_bytes"] == engine.info()["weight_bytes"] > 0
    finally:
        engine.stop()


def test_serve_with_ray_passes_quantize_to_the_replicas(monkeypatch):
    """--quantize is not a device-map option: --ray takes it (each replica quantizes its
    own copy) instead of refusing it with --device-map's message."""
    import argparse

    from celeris.server import ray_serve, serve

    seen = {}
    monkeypatch.setattr(ray_serve, "main", lambda args: seen.setdefault("quantize",
                                                                        args.quantize) and 0)
    args = argparse.Namespace(ray=True, quantize="int8", device_map=None, max_memory=None,
                              offload_folder=None)
    assert serve.main(args) == 0 and seen == {"quantize": "int8"}
