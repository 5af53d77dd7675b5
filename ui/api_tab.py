"""API tab: where the OpenAI-compatible API lives (same port as this page) and how to call it."""

from __future__ import annotations

import json
from typing import Any, Mapping

import gradio as gr

from celeris.params import GenerationParams

from . import render
from .context import EngineSlot

EXAMPLE_PROMPT = "Tell me a story about a brave fox."
SCORED_TEXT = "The fox was brave."
DEFAULT_MODEL_ID = "celeris-tiny-bd"   # shown when no model is loaded (the app's default)


def base_url(headers: Mapping[str, str] | None, fallback: str = "http://localhost:7860") -> str:
    """The URL the browser reached us at (honours a proxy's X-Forwarded-* headers)."""
    if not headers:
        return fallback
    host = headers.get("x-forwarded-host") or headers.get("host")
    if not host:
        return fallback
    scheme = (headers.get("x-forwarded-proto") or "http").split(",")[0].strip()
    return f"{scheme}://{host.split(',')[0].strip()}"


def snippets(url: str, model: str, key_required: bool,
             params: GenerationParams | None = None) -> dict[str, str]:
    """Copy-paste examples: curl, the openai package, and gradio_client for the live steps
    (``params``: the playground model's defaults, whose block length and threshold it uses;
    a block-diffusion model takes only block lengths that divide its block size). With a key,
    the playground's endpoints need it too: gradio_client logs in with it as password."""
    block = params.block_length if params is not None else 32
    threshold = params.threshold if params is not None else 0.9
    body = json.dumps({"model": model, "max_tokens": 64,
                       "messages": [{"role": "user", "content": EXAMPLE_PROMPT}]})
    auth = ' \\\n  -H "Authorization: Bearer $CELERIS_API_KEY"' if key_required else ""
    curl = (f"curl {url}/v1/chat/completions \\\n  -H \"Content-Type: application/json\"{auth}"
            f" \\\n  -d '{body}'")
    key = 'os.environ["CELERIS_API_KEY"]' if key_required else '"not-needed"'
    openai = (f"import os\nfrom openai import OpenAI\n\nclient = OpenAI(base_url=\"{url}/v1\", "
              f"api_key={key})\nstream = client.chat.completions.create(\n    model=\"{model}\","
              f"\n    messages=[{{\"role\": \"user\", \"content\": \"{EXAMPLE_PROMPT}\"}}],\n"
              "    max_tokens=64, stream=True)\nfor chunk in stream:\n"
              "    print(chunk.choices[0].delta.content or \"\", end=\"\", flush=True)\n")
    login = (', auth=("celeris", os.environ["CELERIS_API_KEY"])' if key_required else "")
    client = (("import os\n" if key_required else "")
              + f"from gradio_client import Client\n\nclient = Client(\"{url}/\"{login})\n"
              "# prompt, as_chat, steps, temperature, gen_length, block_length, threshold,\n"
              "# decoding, remasking, cache, seed (then, optional, a structured output mode:\n"
              "# \"json\", \"regex\" or \"choice\", and its spec)\n"
              f"job = client.submit(\"{EXAMPLE_PROMPT}\", True, 0, 0.0, 64, {block}, "
              f"{threshold:g},\n"
              "                    \"threshold\", \"low_confidence\", \"prefix\", 0, "
              "api_name=\"/generate\")\n"
              "for update in job:   # one update per denoising step\n"
              "    canvas, text, gauges = update[0], update[1], update[2]\n"
              "    print(gauges[\"nfe\"], gauges[\"state\"], text)\n")
    scores = (f"import os\nfrom openai import OpenAI\n\nclient = OpenAI(base_url=\"{url}/v1\", "
              f"api_key={key})\n"
              "# each token's log-probability, read at the denoising step that committed it\n"
              f"reply = client.chat.completions.create(\n    model=\"{model}\", max_tokens=16,"
              f"\n    messages=[{{\"role\": \"user\", \"content\": \"{EXAMPLE_PROMPT}\"}}],\n"
              "    logprobs=True, top_logprobs=3)\n"
              "for t in reply.choices[0].logprobs.content:\n"
              "    print(f\"{t.token!r:>12} {t.logprob:8.3f}\", [a.token for a in t.top_logprobs])\n"
              "# score a text (echo + logprobs): log p(token | the tokens before it)\n"
              f"scored = client.completions.create(model=\"{model}\", prompt=\"{SCORED_TEXT}\","
              "\n    max_tokens=0, echo=True, logprobs=1)\n"
              "print(\"total:\", sum(scored.choices[0].logprobs.token_logprobs[1:]))\n")
    return {"curl": curl, "openai": openai, "gradio_client": client, "logprobs": scores}


def max_tokens_line(context: int | None) -> str:
    """The range of max_tokens on this model: the prompt and the answer share the context."""
    if not context:
        return "`max_tokens`: load a model to see its range."
    return (f"`max_tokens`: 1 to {context - 1}, and prompt tokens + `max_tokens` at most "
            f"{context} (this model's context).")


def api_model(slot: EngineSlot) -> str:
    """The model id /v1 serves: the folder name of the model the app started with."""
    info = slot.primary.info() if slot.primary is not None else None
    return (info or {}).get("model") or DEFAULT_MODEL_ID


def playground_defaults(slot: Any) -> GenerationParams | None:
    """The defaults of the model the browser tab's playground runs (``slot``: a session's)."""
    return slot.engine.default_params() if slot.engine is not None else None


def api_context(slot: EngineSlot) -> int | None:
    """The context of the model /v1 serves (the one the app started with)."""
    return slot.primary.info().get("context_length") if slot.primary is not None else None


def describe(url: str, key_required: bool, context: int | None = None) -> str:
    auth = ("**An API key is required**: send `Authorization: Bearer <key>` (the key given "
            "with `--api-key` or `CELERIS_API_KEY`). This playground and its Gradio "
            "endpoints ask for it too: any user name, the key as password." if key_required else
            "No API key is required (start with `--api-key` to require one).")
    return (f"The OpenAI-compatible API is served by this same process, on this same port.\n\n"
            f"- Base URL: `{render.escape_text(url)}/v1`\n- Health: `{render.escape_text(url)}"
            f"/health` · models: `{render.escape_text(url)}/v1/models`\n- {auth}\n"
            f"- {max_tokens_line(context)}")


def create_ui(slot: EngineSlot) -> None:
    url = "http://localhost:7860"
    initial = snippets(url, api_model(slot), slot.api_key_required, playground_defaults(slot))
    with gr.Tab("API", id="api") as tab:
        about = gr.Markdown(describe(url, slot.api_key_required, api_context(slot)),
                            elem_id="api-about")
        codes = {name: gr.Code(initial[name], language=lang, label=name, interactive=False,
                               buttons=["copy"], elem_id=f"api-{name}")
                 for name, lang in (("curl", "shell"), ("openai", "python"),
                                    ("gradio_client", "python"), ("logprobs", "python"))}

    def refresh(request: gr.Request) -> list[Any]:
        url = base_url(dict(request.headers) if request else None)
        code = snippets(url, api_model(slot), slot.api_key_required,
                        playground_defaults(slot.session(request)))
        about = describe(url, slot.api_key_required, api_context(slot))
        return [about] + [code[k] for k in codes]

    tab.select(refresh, None, [about, *codes.values()], queue=False, api_visibility="private")
