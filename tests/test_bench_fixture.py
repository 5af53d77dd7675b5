"""Random tiny model directories for the bench and batch tests (and a check that they load).

``tiny_model_dir`` is the shared ``tests/tiny_model.make_tiny_model_dir``; ``tiny_ar_dir``
saves a random tiny ``LlamaForCausalLM`` next to a copy of the same tokenizer (chat template
included), so the AR twin and Celeris encode prompts identically.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.tiny_model import make_tiny_model_dir

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


def tiny_model_dir(path: Path, seed: int = 0, **options) -> Path:
    return Path(make_tiny_model_dir(Path(path), seed=seed, **options))


def tiny_ar_dir(path: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for f in Path(tokenizer_from).iterdir():
        if f.is_file() and f.name not in MODEL_FILES:
            shutil.copy(f, path / f.name)
    tok = AutoTokenizer.from_pretrained(str(path))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(str(path))
    return path


def test_tiny_dirs_load_as_engine_and_ar_twin(tmp_path):
    from celeris import ARBaseline, Engine

    model = tiny_model_dir(tmp_path / "m")
    ar = ARBaseline.from_pretrained(tiny_ar_dir(tmp_path / "ar", model))
    engine = Engine.from_pretrained(str(model), device="cpu")
    messages = [{"role": "user", "content": "copy: 1 2 3"}]
    assert ar.encode(messages) == engine.tokenizer.encode_prompt(messages)
    assert ar.info()["context_length"] == engine.info()["context_length"]


@pytest.fixture(scope="module")
def one_thread():
    """Two torch threads on two shared cores spin against each other (100x slower here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
