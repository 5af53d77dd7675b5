"""The family registry: what a model family is, declared once, found by its checkpoints.

A ``Family`` holds every fact that differs between families: which ``model_type`` values (and
aliases) its config.json files carry, the class that reads that config, the class names its
checkpoints give their architecture, how its tensor names map onto ours, the special ids its
model card gives and its files do not, its published sampler, how its generation_config.json
spells our knobs, its layout (how it attends and decodes), a loader of its own where the model
is not ours, and its chat/tool-call syntax. Each family module (``llada.py``, ``sdar.py``, ...)
builds one or two and calls ``register``; the loader, the engine, the server and the UI ask the
registry (``find``, ``by_name``) and nothing else holds a table of family facts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config import ModelLoadError
from ..params import GenerationParams
from .layouts import Layout, attention_layout
from .tool_calls import GENERIC, ToolSyntax

Renames = tuple[tuple[str, str], ...]      # (regex over a checkpoint tensor name, replacement)


@dataclass(frozen=True, eq=False)
class Family:
    """One model family. Only ``name``, ``display``, ``model_types`` and ``config_class`` are
    required; the rest default to "like our own checkpoints"."""

    name: str                                # our key, e.g. "llada2"
    display: str                             # what /info and the playground call it
    model_types: tuple[str, ...]             # config.json model_type values it claims
    config_class: type                       # reads its config.json (a PretrainedConfig)
    # the architecture class names its checkpoints carry; with ``auto`` the first becomes a
    # model class registered with transformers' Auto classes for this config class
    architectures: tuple[str, ...] = ()
    # when several families share a model_type (LLaDA and LLaDA-MoE): does this raw
    # config.json belong to this family? Families with a test are asked first.
    claims: Callable[[dict[str, Any]], bool] | None = None
    renames: Renames = ()                    # checkpoint tensor names -> ours
    experts: bool = False                    # checkpoints may hold per-expert MoE tensors
    special_ids: Mapping[str, int] = field(default_factory=dict)   # model-card ids
    sampler: Mapping[str, Any] = field(default_factory=dict)       # published defaults
    generation_keys: Mapping[str, str] = field(default_factory=dict)  # theirs -> ours
    layout: Callable[[Any, int], Layout] = attention_layout     # (config, mask id) -> Layout
    # (config, model_dir, device, dtype, device_map) -> model, for a family whose model is
    # not ours (DiffusionGemma: transformers' classes)
    load: Callable[..., Any] | None = None
    auto: bool = True                        # register with transformers' Auto classes
    causal_lm: bool = False                  # ... and AutoModelForCausalLM (block models)
    # how its answers spell tool calls and how tools reach its prompt (tool_calls.py)
    tool_calls: ToolSyntax = GENERIC
    # its checkpoints learned single-turn chats only: a chat prompt keeps its system turns
    # and its last user turn (``chat_messages``); other families read the whole history
    single_turn_chat: bool = False

    def chat_messages(self, prompt: Any) -> Any:
        """The messages of a chat prompt this family's model is given (a text or token ids
        unchanged): with ``single_turn_chat`` the system turns and the last user turn, in
        order, so that a request after other turns is read as it would be alone; else all."""
        if not self.single_turn_chat or not isinstance(prompt, list) or not all(
                isinstance(m, dict) for m in prompt):
            return prompt
        users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
        last = users[-1] if users else -1
        return [m for i, m in enumerate(prompt) if m.get("role") == "system" or i == last]

    def compiled_renames(self) -> tuple[tuple[re.Pattern, str], ...]:
        return _compiled(self.renames)

    def canonical_name(self, name: str) -> str:
        """A checkpoint tensor name in our spelling."""
        for pattern, replacement in self.compiled_renames():
            name = pattern.sub(replacement, name, count=1)
        return name

    def generation_defaults(self, model_dir: Path) -> dict[str, Any]:
        """The GenerationParams fields a checkpoint's generation_config.json sets (in this
        family's spelling too); other keys are ignored."""
        path = Path(model_dir) / "generation_config.json"
        if not path.is_file():
            return {}
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
        known = set(GenerationParams.field_names())
        found = {k: v for k, v in raw.items() if k in known}
        for theirs, ours in self.generation_keys.items():
            if theirs in raw and ours not in found:
                found[ours] = raw[theirs]
        try:
            GenerationParams.from_dict(found)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: {exc}") from None
        return found

    def request_defaults(self, layout: Layout, given: Mapping[str, Any]) -> GenerationParams:
        """A request's defaults: the checkpoint's generation config (``given``) over the
        family's published sampler over what the layout needs over GenerationParams'."""
        changes = layout.fit_defaults({**layout.defaults(), **self.sampler})
        return GenerationParams.from_dict({**changes, **given})


_FAMILIES: dict[str, Family] = {}
_LISTENERS: list[Callable[[Family], None]] = []


def _compiled(renames: Renames) -> tuple[tuple[re.Pattern, str], ...]:
    return tuple((re.compile(src), dst) for src, dst in renames)


def register(family: Family) -> Family:
    """Add (or replace, by name) a family; returns it."""
    _FAMILIES[family.name] = family
    for listener in _LISTENERS:
        listener(family)
    return family


def on_register(listener: Callable[[Family], None]) -> None:
    """Call ``listener`` for every family registered, now and from now on."""
    _LISTENERS.append(listener)
    for family in list(_FAMILIES.values()):
        listener(family)


def unregister(name: str) -> None:
    _FAMILIES.pop(name, None)


def registered() -> tuple[Family, ...]:
    return tuple(_FAMILIES.values())


def by_name(name: str) -> Family | None:
    return _FAMILIES.get(name)


def find(raw: Mapping[str, Any]) -> Family | None:
    """The family of a raw config.json: those whose ``claims`` test accepts it first, then
    the one that claims its model_type plainly."""
    model_type = raw.get("model_type")
    mine = [f for f in _FAMILIES.values() if model_type in f.model_types]
    for family in mine:
        if family.claims is not None and family.claims(dict(raw)):
            return family
    return next((f for f in mine if f.claims is None), None)


def family_of(config: Any) -> Family:
    """The family of a config built in code (the loader hands the engine the family it found):
    the one the config names, else the one that claims its fields."""
    family = by_name(getattr(config, "family", None) or "") or find(config.to_dict())
    if family is None:
        raise ValueError(f"no registered family reads model_type {config.model_type!r}; "
                         f"supported: {', '.join(supported_model_types())}")
    return family


def supported_model_types() -> list[str]:
    return sorted({t for f in _FAMILIES.values() for t in f.model_types})
