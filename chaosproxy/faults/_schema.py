"""What a tool's output schema allows, so that faults on its results reach the agent as valid data.

Clients validate `structuredContent` against the `outputSchema` the tool was listed with (the
Python SDK raises before the model sees anything), so an observation or reward fault that breaks
the schema measures the client library, not the agent. This module says which values a fault may
perturb (free text, not enum values, constants, patterns, formats or bounded strings), puts back
whatever the schema rejects after a perturbation, and makes up a valid instance when a fault needs
structured content the server never sent. Not a fault itself: it registers nothing.

Without a schema, strings that look like a format (a date, a UUID, a URL, an email) are still
left alone: an agent reads them as identifiers, not prose.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from chaosproxy.faults._text_edits import Location, replaced_at, value_at
from chaosproxy.faults.base import FaultContext

# Strings an agent reads as identifiers, whatever the schema says.
_FORMAT_LIKE = re.compile(
    r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?"  # ISO date, date-time
    r"|\d{2}:\d{2}(:\d{2}(\.\d+)?)?"  # time
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # UUID
    r"|[A-Za-z][A-Za-z0-9+.-]*://\S+"  # URI
    r"|[^@\s]+@[^@\s]+\.[A-Za-z]{2,}"  # email
    r"|\d{1,3}(\.\d{1,3}){3}")  # IPv4
# Keywords that pin a string's exact value or shape: a perturbation would break them.
_PINNING = ("enum", "const", "format", "pattern", "maxLength", "minLength", "contentEncoding")
_MAX_DEPTH = 32


def looks_like_format(text: str) -> bool:
    return _FORMAT_LIKE.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class Guard:
    """How a fault may perturb one payload: `schema` (when known) must still hold afterwards, and
    the values at `keep` are left exactly as they are."""

    schema: dict[str, Any] | None = None
    keep: frozenset[Location] = frozenset()

    @property
    def strict(self) -> bool:
        """True when a schema fixes the payload's keys and record shapes (grow text, not structure)."""
        return self.schema is not None

    def repaired(self, original: Any, perturbed: Any) -> Any:
        """`perturbed` with every value the schema rejects put back as it was; `original` when that
        is not enough (or the original itself breaks the schema)."""
        if self.schema is None or perturbed is original:
            return perturbed
        check = _validator(orjson.dumps(self.schema, option=orjson.OPT_SORT_KEYS))
        if check is None:
            return perturbed
        for _ in range(16):
            errors = list(check.iter_errors(perturbed))
            if not errors:
                return perturbed
            for error in errors:
                loc = _existing(original, tuple(error.absolute_path))
                if not loc:
                    return original
                perturbed = replaced_at(perturbed, loc, value_at(original, loc))
        return original


def guard(value: Any, schema: dict[str, Any] | None, *, respect: bool = True) -> Guard:
    """The guard for `value` under `schema`: nothing guarded unless `respect`."""
    if not respect:
        return Guard()
    return Guard(schema, frozenset(_pinned(value, [schema] if schema is not None else [], schema or {}, ())))


def _pinned(value: Any, schemas: list[Any], root: dict[str, Any], loc: Location,
            depth: int = 0) -> Iterator[Location]:
    """Locations of the strings in `value` whose exact text matters: pinned by a schema or format-like."""
    applicable = [s for schema in schemas for s in _resolved(schema, root, depth)]
    match value:
        case str():
            if looks_like_format(value) or any(key in s for s in applicable for key in _PINNING):
                yield loc
        case dict():
            for key, item in value.items():
                yield from _pinned(item, [_property(s, key) for s in applicable], root, (*loc, key), depth + 1)
        case list():
            for i, item in enumerate(value):
                yield from _pinned(item, [_item(s, i) for s in applicable], root, (*loc, i), depth + 1)


def _resolved(schema: Any, root: dict[str, Any], depth: int) -> Iterator[dict[str, Any]]:
    """`schema` and every schema it brings in by local $ref or allOf/anyOf/oneOf (all branches:
    a value pinned in any branch is left alone)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return
    yield schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        yield from _resolved(_at_pointer(root, ref), root, depth + 1)
    for key in ("allOf", "anyOf", "oneOf"):
        for option in schema.get(key) or []:
            yield from _resolved(option, root, depth + 1)


def _property(schema: dict[str, Any], key: str) -> Any:
    properties = schema.get("properties")
    if isinstance(properties, dict) and key in properties:
        return properties[key]
    for pattern, sub in (schema.get("patternProperties") or {}).items():
        if re.search(pattern, key):
            return sub
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _item(schema: dict[str, Any], index: int) -> Any:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and index < len(prefix):
        return prefix[index]
    items = schema.get("items")
    return items if isinstance(items, dict) else None


def _at_pointer(root: dict[str, Any], ref: str) -> Any:
    target: Any = root
    for part in ref.lstrip("#").split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        target = target.get(part) if isinstance(target, dict) else None
    return target


@functools.lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> Any:
    """A compiled validator for a schema (imported lazily: the core starts without jsonschema
    loaded); None for a schema that is itself invalid (clients then reject every result anyway)."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    schema = orjson.loads(schema_json)
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema)


def is_valid(value: Any, schema: dict[str, Any]) -> bool:
    check = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    return check is None or check.is_valid(value)


def _existing(value: Any, loc: Location) -> Location:
    """The longest prefix of `loc` that exists in `value`."""
    for n in range(len(loc), 0, -1):
        try:
            value_at(value, loc[:n])
        except (KeyError, IndexError, TypeError):
            continue
        return loc[:n]
    return ()


# --- Made-up instances --------------------------------------------------------------------------


def passed_off_as_success(ctx: FaultContext, result: dict[str, Any]) -> dict[str, Any] | None:
    """`result` claiming success in a form the agent's client accepts for the called tool (see
    success_result), with the tool's own earlier results, or a twin tool's, as the example."""
    schema = ctx.session.output_schemas.get(ctx.message.tool or "")
    return success_result(result, schema, ctx.session.view.example_for(schema) if schema is not None else None)


def success_result(result: dict[str, Any], schema: dict[str, Any] | None, example: Any = None) -> dict[str, Any] | None:
    """`result` passed off as a success (isError false) that a client validating `schema` accepts.

    A tool with an outputSchema must return valid structuredContent on success: a result without one
    gets `example` (a real earlier result for that schema) or a small plausible instance, with the
    result's text in the SDKs' {"result": ...} wrapper of a string-returning tool. None when no valid
    instance can be made.
    """
    result = {**result, "isError": False}
    if schema is None:
        return result
    data = next((real for real in (result.get("structuredContent"), example)
                 if real is not None and is_valid(real, schema)), None)
    if data is None:
        data = sample(schema, schema, empty=False)
    if not isinstance(data, dict):
        return None
    texts = [item["text"] for item in result.get("content") or [] if isinstance(item, dict)
             and item.get("type") == "text" and isinstance(item.get("text"), str)]
    if texts and set(data) == {"result"} and isinstance(data["result"], str):  # a string result restates its text
        data = {"result": "\n".join(texts)}
    return {**result, "structuredContent": data} if is_valid(data, schema) else None  # a made-up one may not fit


def sample(schema: Any, root: dict[str, Any], *, empty: bool, depth: int = 0) -> Any:
    """A small instance of a JSON Schema: plausible values, or (`empty`) empty ones.

    Covers what tool servers generate (types, properties, required, items, enum, const, default,
    anyOf/oneOf/allOf, local $ref, simple bounds); anything else gets null.
    """
    if not isinstance(schema, dict) or depth > 16:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        return sample(_at_pointer(root, ref), root, empty=empty, depth=depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(enum := schema.get("enum"), list) and enum:
        return enum[0]
    if not empty and "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            nullable = {"type": "null"} in options
            return None if empty and nullable else sample(
                next(o for o in options if o != {"type": "null"}), root, empty=empty, depth=depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = "null" if empty and "null" in kind else next((k for k in kind if k != "null"), "null")
    match kind:
        case "object":
            properties = schema.get("properties") or {}
            keys = (schema.get("required") or []) if empty else list(properties)
            return {key: sample(properties.get(key), root, empty=empty, depth=depth + 1) for key in keys}
        case "array":
            items = schema.get("items")
            least = schema.get("minItems")
            size = max(least if isinstance(least, int) else 0, 0 if empty else 1)
            return [sample(items, root, empty=empty, depth=depth + 1) for _ in range(size)]
        case "string":
            least = schema.get("minLength")
            return ("" if empty else "ok").ljust(least if isinstance(least, int) else 0, "x")
        case "integer" | "number":
            value: float = 0 if empty else 1
            if (low := _number(schema.get("minimum"))) is not None:
                value = max(value, low)
            if (high := _number(schema.get("maximum"))) is not None:
                value = min(value, high)
            return int(value) if kind == "integer" else float(value)
        case "boolean":
            return not empty
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
