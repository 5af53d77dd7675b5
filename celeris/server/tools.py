"""Tool calls on /v1/chat/completions: the request's tools, rendered and decoded in the loaded
family's own syntax (``Family.tool_calls``: the server holds none of its own).

A chat request takes this path when it gives ``tools`` or its history holds tool turns. The
syntax renders the prompt (the checkpoint's template with ``tools`` where it has one), gives
the grammar the answer decodes under (``required`` / a named function: calls only, arguments
valid for the function's schema; ``auto``: text, and calls once the model opens one) and reads
the calls back out; answers with calls finish with ``tool_calls``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..outputs import GenerationResult
from ..params import GenerationParams
from .errors import invalid
from .protocol import ChatCompletionRequest


@dataclass
class ToolPlan:
    syntax: Any                    # the family's ToolSyntax
    tools: list[dict[str, Any]]
    choice: str | None

    @classmethod
    def of(cls, req: Any, engine: Any) -> "ToolPlan | None":
        """The plan of a chat request, or None when it involves no tools."""
        if not isinstance(req, ChatCompletionRequest):
            return None
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        choice = req.tool_choice_name()
        history = any(m.role == "tool" or m.tool_calls for m in req.messages)
        if not tools:
            if choice not in (None, "none"):
                raise invalid(f"tool_choice {choice!r} needs tools", "tool_choice")
            if req.parallel_tool_calls is not None:
                raise invalid("parallel_tool_calls needs tools", "parallel_tool_calls")
            if not history:
                return None
        names = [t["function"]["name"] for t in tools]
        if len(set(names)) != len(names):
            raise invalid("tools must have distinct function names", "tools")
        return cls(engine.family.tool_calls, tools, "none" if not tools else choice or "auto")

    def prompt(self, engine: Any, messages: list[dict[str, Any]]) -> list[int]:
        listed = [] if self.choice == "none" else self.tools
        try:
            return self.syntax.prompt(engine.tokenizer, messages, listed)
        except (ValueError, TypeError) as exc:
            raise invalid(f"messages could not be rendered with tools: {exc}",
                          "messages") from None

    def params(self, params: GenerationParams, parallel: bool | None) -> GenerationParams:
        try:
            constraint = self.syntax.constraint(self.tools, self.choice,
                                                parallel is not False)
        except ValueError as exc:
            raise invalid(str(exc), getattr(exc, "param", "tool_choice")) from None
        if constraint is None:
            return params
        if params.structured is not None:
            raise invalid("tools (with tool_choice other than 'none') cannot be combined with "
                          "a structured-output constraint: the calls have their own grammar",
                          "tools")
        return params.replace(structured=constraint)

    def reads_calls(self) -> bool:
        return self.choice != "none"

    def answer(self, result: GenerationResult) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, OpenAI tool_calls) of a finished answer."""
        if not self.reads_calls():
            return result.text, []
        content, calls = self.syntax.parse(result.text)
        return content, [c.to_openai() for c in calls]


def finish_with_calls(reason: str, has_calls: bool) -> str:
    """The finish reason of an answer read for tool calls: "tool_calls" when it holds calls
    and ended by itself ("stop"); a cut answer keeps "length" (or whatever ended it)."""
    return "tool_calls" if has_calls and reason == "stop" else reason
