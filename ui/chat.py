"""Chat tab: multi-turn chat through the model's chat template (Gradio 6 messages format).

The whole history goes to ``engine.stream`` as messages; the assistant's reply grows as its
committed prefix does, with a shaded tail for the positions still masked.
"""

from __future__ import annotations

import json
from contextlib import closing
from typing import Any, Iterator

import gradio as gr

from celeris import EXAMPLE_TOOLS, GenerationParams, GenerationResult

from . import bounds, render, world
from .context import (EngineSlot, Follow, error_message, paced, session_of, user_error,
                      user_errors)
from .examples import examples
from .playground import make_stop
from .settings import DEFAULT_PRESET, PRESETS, preset_settings

MASK_TAIL = "\u2591"


def reply_so_far(text: str, masked: int) -> str:
    """The assistant bubble while denoising: committed prefix + one shade per 8 masks."""
    return text + (" " + MASK_TAIL * max(1, masked // 8) if masked else "")


EMPTY = "Type a message first."


def add_user_message(message: str, history: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Append the typed message; an empty box only says what to do (a warning toast, the
    history untouched), so no error status lands on the chat."""
    if not isinstance(message, str) or not message.strip():
        gr.Warning(EMPTY, title="Empty message")
        return gr.skip(), gr.skip()
    return "", list(history or []) + [{"role": "user", "content": message}]


BUSY = ("The model is still answering in this tab: wait for the answer, or press Stop, "
        "then send again (your message is still in the box).")


def make_add(slot: EngineSlot):
    """add_user_message, refused while this tab's last message is being answered: its
    answer step would be dropped and the message left without a reply."""
    def add(message: str, history: list[dict[str, Any]], request: gr.Request = None
            ) -> tuple[Any, Any]:
        if isinstance(message, str) and message.strip() and slot.running(session_of(request)):
            gr.Warning(BUSY, title="Still answering")
            return gr.skip(), gr.skip()
        return add_user_message(message, history)
    return add


def send_button(message: Any) -> gr.Button:
    """Send is enabled only while there is something to send."""
    return gr.Button(interactive=isinstance(message, str) and bool(message.strip()))


def reply_bounds(context: int | None, default: int | None = None) -> tuple[int, int]:
    """(max, default) reply length: the history shares the context, so at most context - 64
    (a few short turns), in steps of 16. The default is the model's own gen length
    (``default``; REPLY_DEFAULT without one), which is long enough for its stories."""
    top = 512 if not context else max(16, (context - 64) // 16 * 16)
    wanted = max(16, (default or REPLY_DEFAULT) // 16 * 16)
    return top, min(wanted, top)


REPLY_DEFAULT = 256   # the shipped stories run to ~165 tokens; 64 cut them mid-sentence
SINGLE_TURN = ("The demo models were trained on single questions and answers: each reply "
               "answers your latest message alone (the earlier turns stay on screen).")
TOO_LONG = ("Your message does not fit: with the reply length of {reply} tokens it needs "
            "{need} tokens, and the model's context is {context}. Shorten it or lower the "
            "reply length; it is back in the box and the conversation is unchanged.")
TRIMMED = ("The {n} oldest message(s) were left out of the model's input to fit its context "
           "of {context} tokens (they stay on screen).")


def fit_history(view: Any, messages: list[dict[str, str]], reply: int
                ) -> tuple[list[dict[str, str]], int]:
    """The newest messages that fit the context with a reply of ``reply`` tokens, oldest
    dropped first (user and assistant turns in pairs); (messages, how many were dropped).
    Unknown sizes (no tokenizer) keep everything and let the engine decide."""
    context = view.context_length()
    kept = list(messages)
    while context and len(kept) > 1:
        used = view.prompt_tokens(kept)
        if used is None or used + reply <= context:
            break
        kept = kept[2:] if kept[0]["role"] == "user" and len(kept) > 2 else kept[1:]
    return kept, len(messages) - len(kept)


def too_long(view: Any, messages: list[dict[str, str]], reply: int) -> str | None:
    """Why the last message alone cannot be answered within the context (None: it can)."""
    context = view.context_length()
    used = view.prompt_tokens(messages[-1:])
    if not context or used is None or used + reply <= context:
        return None
    return TOO_LONG.format(reply=reply, need=used + reply, context=context)


TOOLS_EXAMPLE = json.dumps(EXAMPLE_TOOLS, indent=1)
TOOL_CHOICES = ("none", "auto", "required")


def read_tools(text: str, choice: str) -> list[dict[str, Any]] | None:
    """The Tools box as OpenAI ``tools``; None when tool_choice is none."""
    if choice not in TOOL_CHOICES:
        raise user_error(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, got {choice!r}",
                         "Tools")
    if choice == "none":
        return None
    try:
        tools = json.loads(text or "[]")
    except json.JSONDecodeError as exc:
        raise user_error(f"tools is not valid JSON: {exc.msg} (line {exc.lineno})",
                         "Tools") from None
    ok = isinstance(tools, list) and tools and all(
        isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str) for t in tools)
    if not ok:
        raise user_error("tools must be a non-empty list of {type: function, function: {name, "
                         "parameters}} objects", "Tools")
    return tools


def call_messages(syntax: Any, text: str) -> list[dict[str, Any]]:
    """The finished reply as chat messages: its text, then each tool call as a call (a
    titled box holding the arguments)."""
    content, calls = syntax.parse(text)
    out = [{"role": "assistant", "content": content}] if content or not calls else []
    for call in calls:
        out.append({"role": "assistant", "content": f"```json\n{call.arguments}\n```",
                    "metadata": {"title": f"\U0001f527 call {call.name}", "status": "done"}})
    return out


def make_respond(slot: EngineSlot):
    @slot.gpu
    def respond(history: list[dict[str, Any]], preset: str, gen_length: float,
                request: gr.Request, tools: str = "", tool_choice: str = "none"
                ) -> Iterator[Any]:
        """Answer the last user message; yields (history with the reply growing, the
        message box). A message that cannot be answered is taken out of the history and
        put back in the box, so the chat is never stuck on it."""
        view = slot.session(request)
        history = list(history or [])
        messages = render.plain_messages(history)
        if not messages or messages[-1]["role"] != "user":
            yield gr.skip(), gr.skip()        # nothing new to answer: leave the chat alone
            return
        try:
            listed = read_tools(tools, tool_choice)
            yield from _answer(slot, view, history, messages, preset, int(gen_length), request,
                               listed and (listed, tool_choice))
        except gr.Error as exc:
            gr.Warning(error_message(exc), title=exc.title or "Not answered")
            yield history[:-1], messages[-1]["content"]
    return respond


def _answer(slot: EngineSlot, view: Any, history: list[dict[str, Any]],
            messages: list[dict[str, str]], preset: str, reply: int,
            request: gr.Request, tools: tuple[list, str] | None = None) -> Iterator[Any]:
    engine = view.require()
    with user_errors():
        base = engine.default_params()
        params = base.replace(gen_length=reply, **_preset(preset, reply, view.block_size(),
                                                          base))
    why = too_long(view, messages, reply)
    if why:
        raise user_error(why, "Message too long")
    messages, dropped = fit_history(view, messages, reply)
    if dropped:
        gr.Info(TRIMMED.format(n=dropped, context=view.context_length()), title="Trimmed")
    prompt: Any = messages
    syntax = engine.family.tool_calls if tools else None
    if tools:                # the family's syntax renders the tools and constrains the calls
        with user_errors():
            prompt = syntax.prompt(engine.tokenizer, messages, tools[0])
            params = params.replace(structured=syntax.constraint(tools[0], tools[1], True))
        context = view.context_length()
        if context and len(prompt) + reply > context:
            raise user_error(f"the tools and the chat need {len(prompt) + reply} tokens with "
                             f"the reply; the model's context is {context}: list fewer tools "
                             "or shorten the reply", "Message too long")
    session = session_of(request)
    rid = slot.begin(session, engine)
    done = False
    try:
        with user_errors(), closing(engine.stream(prompt, params, request_id=rid)) as run:
            for item in paced(run, slot.frame_interval,
                              final=lambda i: isinstance(i, GenerationResult)):
                done = isinstance(item, GenerationResult)
                if done and syntax is not None and item.text:
                    yield history + call_messages(syntax, item.text), gr.skip()
                    continue
                content = (final_reply(item) if done
                           else reply_so_far(item.text, item.num_masked))
                yield history + [{"role": "assistant", "content": content}], gr.skip()
    finally:
        if not done:
            engine.abort(rid)
        slot.end(session, rid)


EMPTY_REPLY = ("(no answer: the model ended its reply at once. The demo models answer a "
               "question or a request such as \"Tell me a story about a fox\"; to continue a "
               "text, use the Playground with \"chat message\" unticked.)")


def final_reply(result: GenerationResult) -> str:
    return result.text or EMPTY_REPLY


def _preset(name: str, gen_length: int, block_size: int | None = None,
            base: GenerationParams | None = None) -> dict[str, Any]:
    """The preset's settings for a reply of ``gen_length`` tokens (steps: one token a step).
    A block-causal model (``block_size``, its defaults ``base``) gets ui.settings'
    preset_settings: a block length that divides its block size."""
    if name not in PRESETS:
        return {}
    if block_size:
        preset = preset_settings(name, gen_length, block_size, base)
        preset.pop("gen_length", None)
    else:
        preset = dict(PRESETS[name])
        preset["block_length"] = min(preset.get("block_length", 32), gen_length)
    preset.pop("steps", None)
    return preset


def reply_range(view: Any) -> tuple[int, int]:
    """(max, default) reply length for ``view``'s model."""
    engine = view.engine
    return reply_bounds(view.context_length(),
                        engine.default_params().gen_length if engine else None)


def reply_slider(view: Any) -> gr.Slider:
    """The reply length slider's update for ``view``'s model (at event time only: built
    inside the page, a gr.Slider would be a new component)."""
    top, value = reply_range(view)
    return gr.Slider(minimum=16, maximum=top, value=value)


def create_ui(slot: EngineSlot) -> Follow:
    with gr.Tab("Chat", id="chat"):
        gr.Markdown(SINGLE_TURN, elem_id="chat-note")
        chatbot = gr.Chatbot(label="chat", height=420, elem_id="chat-box",
                             buttons=["copy"], placeholder="Ask the model something.")
        with gr.Row():
            message = gr.Textbox(placeholder="Type a message and press Enter", scale=5,
                                 show_label=False, elem_id="chat-message")
            send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send",
                             interactive=False)
            stop = gr.Button("Stop", variant="stop", scale=1, elem_id="chat-stop")
        unknown = world.notice_box("chat-unknown")
        with gr.Row():
            preset = gr.Radio([DEFAULT_PRESET, *PRESETS], value="fast", label="preset",
                              elem_id="chat-preset")
            top, value = reply_range(slot)
            gen_length = gr.Slider(16, top, value=value, step=16,
                                   label="reply length (tokens)", elem_id="chat-gen-length",
                                   info="a cap: the model stops at its end of text")
            clear = gr.Button("Clear", scale=0, elem_id="chat-clear")
        samples = examples("chat")
        if samples:
            gr.Examples([[s] for s in samples], [message], label="examples")
        with gr.Accordion("Tools (function calling)", open=False, elem_id="chat-tools-box"):
            tool_choice = gr.Radio(list(TOOL_CHOICES), value="none", label="tool_choice",
                                   elem_id="chat-tool-choice",
                                   info="required: the reply is calls, decoded under the "
                                        "call grammar; auto: text or calls")
            tools = gr.Code(TOOLS_EXAMPLE, language="json", label="tools (OpenAI format)",
                            elem_id="chat-tools")
    respond = make_respond(slot)
    events = []
    message.change(send_button, message, send, queue=False, api_visibility="private",
                   show_progress="hidden")

    def check_words(text: Any, request: gr.Request) -> str:
        return world.notice(slot.session(request), text) if isinstance(text, str) else ""

    message.change(check_words, message, unknown, queue=False, api_visibility="private",
                   show_progress="hidden")
    for trigger in (send.click, message.submit):
        ev = trigger(make_add(slot), [message, chatbot], [message, chatbot],
                     api_visibility="private", show_progress="hidden")
        events.append(ev.then(respond, [chatbot, preset, gen_length, tools, tool_choice],
                              [chatbot, message],
                              api_visibility="private", concurrency_id="engine",
                              concurrency_limit=slot.concurrency, show_progress="hidden"))
    stop.click(make_stop(slot), None, None, cancels=events, queue=False,
               api_visibility="private")
    clear.click(lambda: [], None, chatbot, queue=False, api_visibility="private")
    bounds.warn_out_of_range(gen_length, "reply length")
    return Follow([], [gen_length], lambda view: [reply_slider(view)])
