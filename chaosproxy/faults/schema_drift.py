from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults import _text_edits
from chaosproxy.faults._effects import with_result
from chaosproxy.faults.base import RESULTS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols.mcp import call_result


@register
class SchemaDrift(Fault):
    """Rename, drop or retype keys in tool results (structuredContent and JSON text), as after an API change."""

    type: Literal["schema_drift"] = "schema_drift"
    mode: Literal["rename", "drop", "retype"] = "rename"
    keys: list[str] = Field(default_factory=list, description="keys to change; empty: `count` keys picked at random")
    count: int = Field(1, ge=1, description="how many keys to pick when `keys` is empty")
    where: Literal["structured", "text", "both"] = "both"

    component = Component.TRANSITION
    level = Level.CONTENT
    phase = Phase.RESPONSE
    methods = RESULTS

    def act(self, ctx: FaultContext) -> Rewrite | None:
        result = call_result(ctx.message)
        if result is None or result.get("isError"):
            return None
        structured = result.get("structuredContent") if self.where != "text" else None
        texts = [_as_json(item) for item in result.get("content", [])] if self.where != "structured" else []
        found = sorted(_all_keys(structured) | set().union(*(_all_keys(t) for t in texts if t is not None)))
        if self.keys:
            keys = [key for key in self.keys if key in found]
        else:
            keys = ctx.rng.sample(found, min(self.count, len(found)))
        if not keys:
            return None
        # retype: each key's new type, drawn once so every occurrence drifts the same way, and never
        # the type it has (a string "retyped" to a string changes nothing)
        values = [structured, *texts]
        drift = {key: ctx.rng.choice(_new_types(key, values)) if self.mode == "retype" else "" for key in keys}
        changed = dict(result)
        if structured is not None:
            changed["structuredContent"] = self._apply(structured, drift)
        if texts:
            changed["content"] = [
                {**item, "text": _text_edits.render_like(new, item["text"])}
                if parsed is not None and (new := self._apply(parsed, drift)) != parsed else item
                for item, parsed in zip(result.get("content", []), texts, strict=True)]
        return with_result(ctx.message, changed)

    def _apply(self, value: Any, drift: dict[str, str]) -> Any:
        if isinstance(value, list):
            return [self._apply(item, drift) for item in value]
        if not isinstance(value, dict):
            return value
        out: dict[str, Any] = {}
        for key, item in value.items():
            item = self._apply(item, drift)
            if key not in drift:
                out[key] = item
            elif self.mode == "rename":
                out[_renamed(key)] = item
            elif self.mode == "retype":
                out[key] = _retyped(item, drift[key])
        return out


def _as_json(item: Any) -> Any:
    """The JSON object or array a text item holds, else None."""
    text = item.get("text") if isinstance(item, dict) and item.get("type") == "text" else None
    return _text_edits.as_json(text) if isinstance(text, str) else None


def _all_keys(value: Any) -> set[str]:
    if isinstance(value, list):
        return set().union(*(_all_keys(item) for item in value))
    if isinstance(value, dict):
        return set(value) | set().union(*(_all_keys(item) for item in value.values()))
    return set()


def _new_types(key: str, values: list[Any]) -> list[str]:
    """The types `key` may drift to: any but the one its first value has."""
    first = next((found for value in values if (found := _first_value(value, key)) is not _ABSENT), None)
    current = "string" if isinstance(first, str) else "list" if isinstance(first, list) else \
        "null" if first is None else ""
    return [kind for kind in ("string", "list", "null") if kind != current]


_ABSENT = object()


def _first_value(value: Any, key: str) -> Any:
    if isinstance(value, list):
        return next((found for item in value if (found := _first_value(item, key)) is not _ABSENT), _ABSENT)
    if isinstance(value, dict):
        if key in value:
            return value[key]
        return next((found for item in value.values() if (found := _first_value(item, key)) is not _ABSENT), _ABSENT)
    return _ABSENT


def _renamed(key: str) -> str:
    """snake_case -> camelCase, camelCase -> snake_case, else a suffix: the usual API-version drift."""
    if "_" in key:
        head, *rest = key.split("_")
        return head + "".join(part.title() for part in rest)
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()
    return snake if snake != key else key + "_value"


def _retyped(value: Any, to: str) -> Any:
    match to:
        case "string":
            return value if isinstance(value, str) else json.dumps(value)
        case "list":
            return [value]
        case _:
            return None
