"""Every 2026 family served through the real app: the tiny checkpoints of
tests/test_families.py behind ``create_app`` on a live uvicorn server.

The published checkpoints ship a chat template; the tiny ones are given a miniature of their
family's (same roles and markers) so that ``/v1/chat/completions`` runs the template path as a
user's request would. The tiny LLaDA-MoE keeps the published vocabulary (156900 rows, room
for mask id 156895) beside a 307-token tokenizer; its output rows past the tokenizer are zeroed
here so that its greedy answers are text rather than ids that decode to nothing.

At temperature 0 a streamed answer must be the non-streamed one, delta by delta, for chat and
for plain completions, and ``/v1/models`` must name the served model. DiffusionGemma's tiny
checkpoint (tests/test_diffusion_gemma.py) is served the same way with a miniature of Gemma's
turn template; its temperature 0 draws the canvas noise from seed 0 when no seed is given.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerFast

from celeris import Engine
from celeris.server import create_app
from tests.live_server import live_server
from tests.test_diffusion_gemma import write_tiny_diffusion_gemma
from tests.test_families import FAMILIES, write_family

QWEN_CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LING_CHAT = ("{% for m in messages %}<role>{{ m['role'] | upper }}</role>{{ m['content'] }}"
             "{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}")
LLAMA3_CHAT = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
               "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
GEMMA_CHAT = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
              "else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
CHAT_TEMPLATES = {"llada2": LING_CHAT, "sdar_moe": QWEN_CHAT, "llada_moe": LLAMA3_CHAT,
                  "illada": LLAMA3_CHAT, "fast_dllm_v2": QWEN_CHAT,
                  "diffusion_gemma": GEMMA_CHAT}


def _write(path: Path, family: str) -> Path:
    """The family's tiny checkpoint (DiffusionGemma's is built by transformers' own classes,
    tests/test_diffusion_gemma.py; its canvas of 8 makes 12 tokens two canvases)."""
    if family == "diffusion_gemma":
        return write_tiny_diffusion_gemma(path)
    return write_family(path, family)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def fib(n):"}]
# suppress_eos: random weights may put EOS first; an empty answer would prove nothing
KNOBS = {"max_tokens": 12, "temperature": 0.0}
EXTRA = {"suppress_eos": True}


def _with_chat_template(path: Path, template: str) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.chat_template = template
    tok.save_pretrained(str(path))
    return tok


def _answers_in_the_tokenizer(path: Path, vocab: int) -> Path:
    """Zero the output rows of ids the tokenizer cannot spell (logit 0 there loses to the
    best of the random in-vocabulary logits)."""
    state = load_file(str(path / "model.safetensors"))
    head = state.get("lm_head.weight")                                 # (V, C)
    if head is None or head.shape[0] <= vocab:
        return path
    head[vocab:] = 0.0
    save_file(state, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module", params=[*FAMILIES, "diffusion_gemma"])
def served(request, tmp_path_factory):
    """(family, engine, base URL) of one family's tiny checkpoint behind the real app."""
    family = request.param
    path = _write(tmp_path_factory.mktemp("serve") / family, family)
    tok = _with_chat_template(path, CHAT_TEMPLATES[family])
    _answers_in_the_tokenizer(path, len(tok))
    engine = Engine.from_pretrained(path, device="cpu")
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            yield family, engine, url
    finally:
        engine.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def test_models_names_the_served_family_checkpoint(served):
    family, engine, url = served
    models = _client(url).models.list()
    assert [m.id for m in models.data] == [family] == [engine.model_dir.name]


def test_streamed_chat_concatenates_to_the_non_streamed_answer(served):
    family, engine, url = served
    assert engine.tokenizer.has_chat_template
    kwargs = dict(model=family, messages=MESSAGES, extra_body=EXTRA, **KNOBS)
    client = _client(url)
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs))
    answer = full.choices[0].message.content
    assert answer and full.usage.completion_tokens == 12
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == answer and sum(1 for d in deltas if d) > 1   # step by step
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == full.choices[0].finish_reason and set(finals[:-1]) <= {None}
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    expected = engine.generate(MESSAGES, engine.default_params().replace(
        gen_length=12, temperature=0.0, suppress_eos=True))
    assert answer == expected.text


def test_streamed_completion_concatenates_to_the_non_streamed_text(served):
    family, _, url = served
    body = {"model": family, "prompt": "Once upon a time", **KNOBS, **EXTRA}
    full = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    deltas = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    for data in lines[:-1]:
        deltas.append(json.loads(data)["choices"][0]["text"])
    assert full["choices"][0]["text"] and "".join(deltas) == full["choices"][0]["text"]


FAMILY_NAMES = {"llada2": "LLaDA2.x (MoE)", "llada_moe": "LLaDA-MoE", "sdar_moe": "SDAR-MoE",
                "illada": "LLaDA", "fast_dllm_v2": "Fast-dLLM v2",
                "diffusion_gemma": "DiffusionGemma"}


@pytest.mark.parametrize("family", sorted(FAMILY_NAMES))
def test_the_model_tab_names_the_family_of_the_loaded_model(family, tmp_path):
    from ui import render
    engine = Engine.from_pretrained(_write(tmp_path / family, family), device="cpu")
    info = engine.info()
    assert info["family"] == FAMILY_NAMES[family]
    assert f"| family | `{FAMILY_NAMES[family]}` |" in render.model_markdown(info)
