"""Tool calls: how a family's answers spell a function call, and how tools reach its prompt.

A family declares a ``ToolSyntax`` (``Family.tool_calls``); the server asks it for the three
things a tool request needs and holds no syntax of its own:

- ``prompt``: the chat messages as the checkpoint's own template renders them with ``tools``
  (Qwen-style templates list the functions and show the call syntax themselves); a template
  that ignores tools (the shipped tiny models, LLaDA's) gets the *generic* rendering: the
  functions and the call syntax in a system message, calls in earlier assistant turns written
  in the syntax, tool results as ``<tool_response>`` user turns.
- ``constraint``: the structural grammar (xgrammar's structural tag) a request decodes under.
  ``required`` and a named function: the answer is one or more calls (one when
  ``parallel_tool_calls`` is false) whose arguments follow the function's JSON schema, so a
  call is well-formed and validates even from a tiny model; ``auto``: free text in which the
  call syntax, once opened, is held to the same call grammar. A family whose sampler takes no
  grammar (``constrained=False``) reads calls from the finished text instead (``auto`` only).
- ``parse`` / ``CallStream``: the calls in an answer, and the same calls as OpenAI-shaped
  stream deltas (the name first, then argument chunks) that reassemble to them.

The syntax (``<tool_call>`` + ``{"name": ..., "arguments": {...}}`` + ``</tool_call>``, one per
call) is Qwen2.5/Qwen3's, which Fast-dLLM v2 and SDAR inherit; the generic rendering uses the
same text, so one parser serves both.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Sequence

from ..outputs import settled_text

CHOICES = ("none", "auto", "required")
# Two small functions the shipped models' context holds: the playground's example, the bench's
EXAMPLE_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "London", "Tokyo"]},
                                         "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"]}}}]


class ToolRequestError(ValueError):
    """A tool request the syntax cannot honour; ``param`` names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str            # JSON text, as OpenAI sends it
    id: str = ""

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ToolSyntax:
    name: str                          # "qwen" (the template renders tools) or "generic"
    open: str = "<tool_call>"
    close: str = "</tool_call>"
    constrained: bool = True           # the family's sampler takes a grammar

    # ------------------------------------------------------------------ prompt
    def head(self, name: str) -> str:
        """The text of a call up to its arguments."""
        return f'{self.open}\n{{"name": {json.dumps(name)}, "arguments": '

    @property
    def tail(self) -> str:
        return f"}}\n{self.close}"

    def call_text(self, name: str, arguments: str) -> str:
        return f"{self.head(name)}{arguments}{self.tail}"

    def prompt(self, tokenizer: Any, messages: Sequence[dict[str, Any]],
               tools: Sequence[dict[str, Any]]) -> list[int]:
        """Prompt ids for ``messages`` (OpenAI shapes, tool turns included) with ``tools``."""
        functions = [t["function"] for t in tools]
        if tokenizer.renders_tools:
            return tokenizer.encode_chat(_template_messages(messages), tools=list(tools))
        return tokenizer.encode_chat(self.generic_messages(messages, functions))

    def generic_messages(self, messages: Sequence[dict[str, Any]],
                         functions: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
        """The conversation for a template without tools: plain system/user/assistant turns."""
        listing = "\n".join(json.dumps(f, ensure_ascii=False, separators=(",", ":"))
                            for f in functions)
        guide = (f"Functions:\n{listing}\nCall one as "
                 f"{self.call_text('NAME', '{ARGUMENTS}')}")
        out: list[dict[str, str]] = []
        for m in messages:
            role, content = m["role"], m.get("content") or ""
            if role == "assistant" and m.get("tool_calls"):
                calls = [self.call_text(c["function"]["name"],
                                        _arguments_text(c["function"].get("arguments")))
                         for c in m["tool_calls"]]
                content = "\n".join([content, *calls] if content else calls)
            elif role == "tool":
                role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
            if out and role == "user" and out[-1]["role"] == "user":
                out[-1]["content"] += "\n" + content      # consecutive tool results: one turn
            else:
                out.append({"role": role, "content": content})
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{guide}"}
        else:
            out.insert(0, {"role": "system", "content": guide})
        return out

    # ------------------------------------------------------------------ decoding
    def constraint(self, tools: Sequence[dict[str, Any]], choice: str | None,
                   parallel: bool) -> tuple[str, str] | None:
        """GenerationParams.structured for a tool request (None: decode freely)."""
        if choice == "none":
            return None
        named = choice not in (None, "auto", "required")
        if not self.constrained:
            if named or choice == "required":
                raise ToolRequestError(
                    f"tool_choice {choice!r} needs constrained decoding, which this model's "
                    "sampler does not take; use 'auto' (calls are read from the answer)",
                    "tool_choice")
            return None
        functions = {t["function"]["name"]: t["function"] for t in tools}
        if named and choice not in functions:
            raise ToolRequestError(f"tool_choice names {choice!r}, which is not in tools "
                                   f"({', '.join(functions)})", "tool_choice")
        tags = [self._tag(f) for n, f in functions.items() if not named or n == choice]
        if choice in (None, "auto"):
            fmt: dict[str, Any] = {"type": "triggered_tags", "triggers": [self.open],
                                   "tags": tags, "at_least_one": False,
                                   "stop_after_first": not parallel}
        else:
            fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n",
                   "at_least_one": True, "stop_after_first": not parallel}
        return ("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}))

    def _tag(self, function: dict[str, Any]) -> dict[str, Any]:
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        return {"type": "tag", "begin": self.head(function["name"]),
                "content": {"type": "json_schema", "json_schema": schema}, "end": self.tail}

    # ------------------------------------------------------------------ reading
    def stream(self) -> "CallStream":
        return CallStream(self)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(the text outside the calls or None, the calls in order); a block that is not a
        call (no name, arguments not an object) stays in the text; a call cut short by the
        length cap is kept with the arguments it has (the finish reason says "length")."""
        content, calls = self.scan(text, final=True)
        return content or None, [ToolCall(name, args, new_call_id()) for name, args, _ in calls]

    def scan(self, text: str, final: bool) -> tuple[str, list[tuple[str, str, bool]]]:
        """(the text outside calls, stripped; [(name, arguments text, closed)]). Not
        ``final`` (a stream): a tail that may still open or finish a call is left out of
        the content, and the last call may be open (its arguments so far)."""
        head = re.compile(re.escape(self.open) + r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
                          r'\s*,\s*"arguments"\s*:\s*')
        close = re.compile(r"\s*\}\s*" + re.escape(self.close))
        content: list[str] = []
        calls: list[tuple[str, str, bool]] = []
        pos = 0
        while True:
            i = text.find(self.open, pos)
            if i < 0:
                rest = text[pos:]
                content.append(rest if final else settled_text(rest, (self.open,)))
                break
            content.append(text[pos:i])
            m = head.match(text, i)
            end = None if m is None else _json_end(text, m.end())
            shut = None if end is None else close.match(text, end)
            if m is None or (shut is not None and not _is_object(text[m.end():end])):
                if final:                 # not a call: its text is the answer's
                    content.append(text[i:])
                break
            if shut is None:              # a call being written (or cut by the length cap)
                calls.append((json.loads(f'"{m.group(1)}"'), text[m.end():end or len(text)],
                              False))
                break
            calls.append((json.loads(f'"{m.group(1)}"'), text[m.end():end], True))
            pos = shut.end()
        return "".join(content).strip(), calls


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments or "{}"
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def _template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that renders tools: call arguments as objects (what Qwen's
    templates and transformers' chat-template docs expect)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"type": "function", "id": c.get("id"),
                      "function": {"name": c["function"]["name"],
                                   "arguments": json.loads(_arguments_text(
                                       c["function"].get("arguments")))}}
                     for c in m["tool_calls"]]
            m = {**m, "content": m.get("content") or "", "tool_calls": calls}
        out.append(m)
    return out


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class CallStream:
    """A streamed answer's deltas: fed the stable text after each step (and the final text),
    returns the new content and the new OpenAI ``tool_calls`` delta entries (a call's id and
    name once, then its arguments as they grow); concatenated they are ``parse``'s answer."""

    def __init__(self, syntax: ToolSyntax) -> None:
        self.syntax = syntax
        self.content = ""              # content sent so far
        self.sent: list[int] = []      # argument characters sent, per call
        self.ids: list[str] = []

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict[str, Any]]]:
        content, calls = self.syntax.scan(text, final)
        new = content[len(self.content):] if content.startswith(self.content) else ""
        self.content += new
        deltas: list[dict[str, Any]] = []
        for k, (name, args, _) in enumerate(calls):
            if k == len(self.sent):
                self.sent.append(0)
                self.ids.append(new_call_id())
                deltas.append({"index": k, "id": self.ids[k], "type": "function",
                               "function": {"name": name, "arguments": ""}})
            if len(args) > self.sent[k]:
                deltas.append({"index": k, "function": {"arguments": args[self.sent[k]:]}})
                self.sent[k] = len(args)
        return new, deltas


def _json_end(text: str, start: int) -> int | None:
    """The end of the JSON object starting at ``start`` (None: not closed yet)."""
    depth, in_string, escape = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


QWEN = ToolSyntax("qwen")
GENERIC = ToolSyntax("generic")
