"""Perturbing what an agent reads: pure functions of (payload, parameters, random stream).

A payload is plain text (a str) or a parsed JSON value (dicts, lists, scalars). Functions change
string *values* only, never keys, brackets or numbers, unless their docstring says otherwise, so a
valid JSON document stays valid and keeps its shape. They draw from the given `random.Random` in
document order, so one seed gives the same output; they never mutate their input (unchanged parts
are shared with it, and an unchanged payload is returned as the very same object).

`paths` are RFC 9535 JSONPath queries: a matched node and everything under it is targeted; no
paths target the whole payload. Plain text has no paths, so with paths it is never targeted.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import jsonpath

type Location = tuple[str | int, ...]

# --- JSON text in and out -------------------------------------------------------------------


def as_json(text: str) -> Any:
    """The JSON object or array in `text`, or None when it is plain text (scalars count as text)."""
    start = text.lstrip()[:1]
    if start not in ("{", "["):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


_STYLES: tuple[dict[str, Any], ...] = (
    {"separators": (", ", ": ")},  # Python's json.dumps
    {"separators": (",", ":")},  # compact: JSON.stringify, orjson, serde
    {"indent": 2}, {"indent": 4},
)


def render_like(value: Any, original: str) -> str:
    """`value` as JSON text in the style of `original` (separators, indent, ASCII escapes, padding).

    A perturbed document then differs from the original only where its values changed.
    """
    core = original.strip()
    head = original[: len(original) - len(original.lstrip())]
    tail = original[len(original.rstrip()):]
    ascii_only = core.isascii()
    before = json.loads(core)
    style = next((style for style in _STYLES if json.dumps(before, ensure_ascii=ascii_only, **style) == core),
                 _STYLES[1])
    return head + json.dumps(value, ensure_ascii=ascii_only, **style) + tail


def size(value: Any) -> int:
    """Bytes of `value` as sent: UTF-8 for text, compact JSON otherwise (any other style is larger)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


# --- Targeting ------------------------------------------------------------------------------

@functools.cache
def _jsonpath_environment() -> jsonpath.JSONPathEnvironment:
    """Made on first use: loading JSONPath (its lexer's patterns) costs every proxy ~50 ms of start-up."""
    import jsonpath

    return jsonpath.JSONPathEnvironment(strict=True)


@functools.lru_cache(maxsize=256)
def compile_path(path: str) -> jsonpath.JSONPath | jsonpath.CompoundJSONPath:
    """An RFC 9535 JSONPath query (strict: no extensions), or ValueError saying what is wrong with it."""
    import jsonpath

    try:
        return _jsonpath_environment().compile(path)
    except jsonpath.JSONPathError as exc:
        raise ValueError(f"invalid JSONPath {path!r}: {exc.args[0]}") from None


@dataclass(frozen=True, slots=True)
class Targets:
    """The nodes a function perturbs (`hit`, with everything under them), minus the subtrees in
    `keep` (values the payload's schema constrains: left exactly as they are)."""

    hit: frozenset[Location]
    keep: frozenset[Location] = frozenset()

    def __contains__(self, loc: object) -> bool:
        return loc in self.hit


def targets(value: Any, paths: Sequence[str], keep: frozenset[Location] = frozenset()) -> Targets:
    """Where the targeted nodes are: the root without paths, else every node a path matches."""
    if not paths:
        return Targets(frozenset({()}), keep)
    if not isinstance(value, dict | list):
        return Targets(frozenset(), keep)
    return Targets(frozenset(match.parts for path in paths for match in compile_path(path).finditer(value)), keep)


def _rebuild(value: Any, fn: Callable[[Any, Location], Any], where: Targets,
             loc: Location = (), inside: bool = False) -> Any:
    """`value` with `fn` applied to every node at or under a targeted location, children first.

    Containers whose children did not change are returned as they were, not copied.
    """
    if loc in where.keep:
        return value
    inside = inside or loc in where
    new: Any = value
    if isinstance(value, dict):
        items = {key: _rebuild(item, fn, where, (*loc, key), inside) for key, item in value.items()}
        if any(items[key] is not item for key, item in value.items()):
            new = items
    elif isinstance(value, list):
        elements = [_rebuild(item, fn, where, (*loc, i), inside) for i, item in enumerate(value)]
        if any(a is not b for a, b in zip(elements, value, strict=True)):
            new = elements
    return fn(new, loc) if inside else new


def _walk(value: Any, where: Targets, loc: Location = (),
          inside: bool = False) -> Iterator[tuple[Location, Any]]:
    """Every targeted node with its location, in document order (parents before children)."""
    if loc in where.keep:
        return
    inside = inside or loc in where
    if inside:
        yield loc, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, where, (*loc, key), inside)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, where, (*loc, i), inside)


def value_at(value: Any, loc: Location) -> Any:
    for part in loc:
        value = value[part]
    return value


def replaced_at(value: Any, loc: Location, new: Any) -> Any:
    """`value` with the node at `loc` replaced by `new` (only the containers on the way are copied)."""
    if not loc:
        return new
    head, rest = loc[0], loc[1:]
    copy: Any = list(value) if isinstance(value, list) else dict(value)
    copy[head] = replaced_at(value[head], rest, new)
    return copy


def _chosen(rng: random.Random, probability: float) -> bool:
    return probability >= 1 or rng.random() < probability


def edit_strings(value: Any, edit: Callable[[str], str], rng: random.Random, *,
                 paths: Sequence[str] = (), probability: float = 1.0, keep: frozenset[Location] = frozenset()) -> Any:
    """Every targeted string value passed through `edit`, each with `probability`."""
    def fn(node: Any, _loc: Location) -> Any:
        return edit(node) if isinstance(node, str) and _chosen(rng, probability) else node
    return _rebuild(value, fn, targets(value, paths, keep))


# --- Typos ----------------------------------------------------------------------------------

type Layout = Literal["qwerty", "azerty", "qwertz"]

# Letter rows of each layout (non-letters keep the geometry) and each row's offset in key widths.
_KEYBOARDS: dict[str, tuple[tuple[str, float], ...]] = {
    "qwerty": (("qwertyuiop[]", 0.0), ("asdfghjkl;'", 0.25), ("zxcvbnm,./", 0.75)),
    "azerty": (("azertyuiop^$", 0.0), ("qsdfghjklmù*", 0.25), ("<wxcvbn,;:!", -0.25)),
    "qwertz": (("qwertzuiopü+", 0.0), ("asdfghjklöä#", 0.25), ("<yxcvbnm,.-", -0.25)),
}


@functools.cache
def neighbours(layout: Layout) -> dict[str, str]:
    """For each letter key, the letters around it: beside it on its row, touching it above and below."""
    keys = [(key, row, offset + i) for row, (letters, offset) in enumerate(_KEYBOARDS[layout])
            for i, key in enumerate(letters)]
    return {key: "".join(other for other, orow, ox in keys if other.isalpha() and other != key and (
                abs(ox - x) == 1 if orow == row else abs(orow - row) == 1 and abs(ox - x) < 1))
            for key, row, x in keys if key.isalpha()}


def typo(text: str, rate: float, layout: Layout, rng: random.Random) -> str:
    """Each letter, at `rate`: hit a neighbouring key instead, dropped, doubled, or swapped with the next."""
    if rate <= 0:
        return text
    near = neighbours(layout)
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if not ch.isalpha() or rng.random() >= rate:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1] if i + 1 < len(text) else ""
        keys = near.get(ch.lower(), "")
        ops = ["drop", "double"]
        if keys:
            ops += ["substitute", "substitute"]  # the commonest slip
        if nxt.isalpha() and nxt != ch:
            ops.append("transpose")
        match rng.choice(ops):
            case "substitute":
                hit = rng.choice(keys)
                out.append(hit.upper() if ch.isupper() else hit)
            case "double":
                out.append(ch + ch)
            case "transpose":
                out.append(nxt + ch)
                i += 1
            case "drop":
                pass
        i += 1
    return "".join(out)


# --- Noise ----------------------------------------------------------------------------------

type NoiseKind = Literal["homoglyphs", "zero_width", "whitespace", "mojibake"]

HOMOGLYPHS = {  # Latin letter -> a Cyrillic, Greek or IPA look-alike (escaped, to tell them apart)
    "a": "\u0430", "c": "\u0441", "d": "\u0501", "e": "\u0435", "g": "\u0261", "h": "\u04bb", "i": "\u0456",
    "j": "\u0458", "l": "\u04cf", "o": "\u043e", "p": "\u0440", "q": "\u051b", "s": "\u0455", "w": "\u051d",
    "x": "\u0445", "y": "\u0443", "A": "\u0410", "B": "\u0412", "C": "\u0421", "E": "\u0415", "H": "\u041d",
    "I": "\u0406", "J": "\u0408", "K": "\u041a", "M": "\u041c", "N": "\u039d", "O": "\u041e", "P": "\u0420",
    "S": "\u0405", "T": "\u0422", "X": "\u0425", "Y": "\u03a5", "Z": "\u0396",
}
ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff")
_SPACES = ("  ", "\t", "\u00a0", "\n", "")  # what a whitespace character may become
# Windows-1252, the decoder that "Latin-1" means in browsers and most libraries; its five
# undefined bytes fall back to Latin-1.
_CP1252 = tuple(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in range(256))


def _misread(ch: str) -> str:
    return "".join(_CP1252[b] for b in ch.encode("utf-8", "surrogatepass"))


def noise(text: str, kind: NoiseKind, rate: float, rng: random.Random) -> str:
    """Characters changed at `rate` so text looks the same (or nearly) but compares different.

    homoglyphs: letters swapped for look-alikes; zero_width: invisible characters inserted;
    whitespace: spaces doubled, turned into tabs, NBSPs or newlines, dropped, or stray ones added;
    mojibake: non-ASCII characters' UTF-8 bytes read as Latin-1 (café -> cafÃ©).
    """
    if rate <= 0:
        return text
    out: list[str] = []
    for ch in text:
        match kind:
            case "homoglyphs":
                look_alike = HOMOGLYPHS.get(ch)
                out.append(look_alike if look_alike and rng.random() < rate else ch)
            case "zero_width":
                out.append(ch + rng.choice(ZERO_WIDTH) if rng.random() < rate else ch)
            case "whitespace":
                if rng.random() >= rate:
                    out.append(ch)
                else:
                    out.append(rng.choice(_SPACES) if ch.isspace() else ch + " ")
            case "mojibake":
                out.append(_misread(ch) if not ch.isascii() and rng.random() < rate else ch)
    return "".join(out)


# --- Truncation and injection ---------------------------------------------------------------


def truncate(text: str, *, chars: int | None = None, fraction: float | None = None, marker: str = "") -> str:
    """The first `chars` characters (or `fraction` of them), then `marker` if anything was cut.

    `{omitted}` in the marker becomes the number of characters cut.
    """
    keep = chars if chars is not None else int(len(text) * (fraction if fraction is not None else 1))
    if keep >= len(text):
        return text
    return text[:keep] + marker.replace("{omitted}", str(len(text) - keep))


type Position = Literal["append", "prepend", "insert"]

_SENTENCE_END = re.compile(r"(?<=[.!?:;])[ \t]+|\n+")
_SPACE = re.compile(r"\s+")


def inject_into(text: str, snippet: str, position: Position, rng: random.Random) -> str:
    """`snippet` after the text, before it, or at a sentence (else word) boundary within it."""
    if not text:
        return snippet
    sep = "\n" if "\n" in text else " "
    if position == "insert":
        cuts = [m.end() for m in _SENTENCE_END.finditer(text) if m.end() < len(text)] or \
               [m.end() for m in _SPACE.finditer(text) if m.end() < len(text)]
        if cuts:
            at = rng.choice(cuts)
            return text[:at] + snippet + sep + text[at:]
        position = "append"
    return text + sep + snippet if position == "append" else snippet + sep + text


def inject(value: Any, snippet: str, position: Position, rng: random.Random, *,
           paths: Sequence[str] = (), probability: float = 1.0, keep: frozenset[Location] = frozenset()) -> Any:
    """`snippet` injected into one targeted string: the last (append), the first (prepend) or any (insert)."""
    spots = [loc for loc, node in _walk(value, targets(value, paths, keep))
             if isinstance(node, str) and _chosen(rng, probability)]
    if not spots:
        return value
    loc = spots[-1] if position == "append" else spots[0] if position == "prepend" else rng.choice(spots)
    return replaced_at(value, loc, inject_into(value_at(value, loc), snippet, position, rng))


# --- Oversize -------------------------------------------------------------------------------

_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARN")
_SERVICES = ("api-gateway", "worker-2", "worker-3", "indexer", "auth", "cache")
_ROUTES = ("GET /v1/items", "GET /v1/search", "POST /v1/orders", "GET /v1/users/{id}", "GET /healthz")
_STATUSES = (200, 200, 200, 200, 204, 304, 404)
_WORDS = ("update", "record", "status", "pending", "synced", "account", "region", "north", "batch",
          "report", "quarterly", "archive", "customer", "invoice", "shipment", "delayed", "verified")
_EPOCH = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)


def _log_lines(rng: random.Random) -> Iterator[str]:
    """An endless access/debug log, the bulk a chatty server really sends."""
    at = _EPOCH
    while True:
        at += timedelta(milliseconds=rng.randint(1, 250))
        route = rng.choice(_ROUTES).replace("{id}", str(rng.randint(1000, 99999)))
        yield (f"{at.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} {rng.choice(_LEVELS):<5} "
               f"[{rng.choice(_SERVICES)}] {route} {rng.choice(_STATUSES)} {rng.randint(1, 900)}ms "
               f"req={rng.getrandbits(32):08x}")


def filler(nbytes: int, rng: random.Random) -> str:
    """Exactly `nbytes` of log text (ASCII), starting on a new line."""
    parts: list[str] = []
    length = 0
    for line in _log_lines(rng):
        if length >= nbytes:
            break
        parts.append("\n" + line)
        length += len(line) + 1
    return "".join(parts)[:nbytes]


def _record_like(example: Any, rng: random.Random) -> Any:
    """A made-up record of the same shape and value types as `example` (so schemas still hold)."""
    match example:
        case dict():
            return {key: _record_like(item, rng) for key, item in example.items()}
        case list():
            return [_record_like(item, rng) for item in example[:3]]
        case bool():
            return rng.random() < 0.5
        case int():
            return rng.randint(0, max(10, 2 * abs(example)))
        case float():
            return round(rng.uniform(0, max(1.0, 2 * abs(example))), 2)
        case str():
            words = [rng.choice(_WORDS) for _ in range(max(1, min(len(example), 120) // 7))]
            return " ".join(words)
    return example


_LOG_KEYS = ("debug_log", "trace_log", "_debug_log")


def _grow(node: Any, nbytes: int, rng: random.Random) -> Any:
    """`node` made about `nbytes` larger, in its own shape: text, more records, or a log field."""
    match node:
        case str():
            return node + filler(nbytes, rng)
        case list():
            grown, added, lines = list(node), 0, _log_lines(rng)
            while added < nbytes:
                item = _record_like(node[0], rng) if node else next(lines)
                grown.append(item)
                added += size(item) + 1
            return grown
        case dict():
            key = next((k for k in _LOG_KEYS if isinstance(node.get(k, []), list)), None)
            if key is None:
                return node
            return {**node, key: _grow(node.get(key, []), nbytes, rng)}
    return node


MAX_OVERSIZE = 256 * 1024 * 1024


def oversize(value: Any, target: int, rng: random.Random, *, paths: Sequence[str] = (),
             probability: float = 1.0, keep: frozenset[Location] = frozenset(), strings_only: bool = False) -> Any:
    """`value` grown to at least `target` bytes (see `size`), the filler shared by the targeted nodes.

    This adds to the payload rather than changing values: a string gets log lines appended, a
    list more records like its first, an object a `debug_log` list (with `strings_only`, as a schema
    that fixes keys and record shapes needs, only strings grow). Plain text ends exactly at `target`.
    """
    target = min(target, MAX_OVERSIZE)
    where = targets(value, paths, keep)
    grows = str if strings_only else str | list | dict
    matched = [loc for loc, node in _walk(value, where)
               if (loc in where or strings_only) and isinstance(node, grows)]
    outermost = [loc for loc in matched if not any(loc[: len(m)] == m for m in matched if m != loc)]
    spots = [loc for loc in outermost if _chosen(rng, probability)]
    while spots and (current := size(value)) < target:
        share = -(-(target - current) // len(spots))
        grown = value
        for loc in spots:
            grown = replaced_at(grown, loc, _grow(value_at(grown, loc), share, rng))
        if grown is value or size(grown) <= current:
            break
        value = grown
    return value


# --- Wrong data -----------------------------------------------------------------------------


def swap(value: Any, rng: random.Random, *, count: int = 1,
         paths: Sequence[str] = (), probability: float = 1.0, keep: frozenset[Location] = frozenset()) -> Any:
    """`count` pairs of object fields with values of one type swapped: plausible, well typed, wrong.

    A pair prefers one field across two records (two prices, two titles), else any two fields.
    """
    fields = [(loc, node) for loc, node in _walk(value, targets(value, paths, keep))
              if loc and isinstance(loc[-1], str) and isinstance(node, str | int | float | bool)
              and _chosen(rng, probability)]
    for _ in range(count):
        pair = _pair(fields, lambda loc, node: (type(node), loc[-1]), rng) or \
               _pair(fields, lambda loc, node: (type(node),), rng)
        if pair is None:
            break
        (a, x), (b, y) = pair
        value = replaced_at(replaced_at(value, a, y), b, x)
        fields = [f for f in fields if f[0] not in (a, b)]
    return value


def _pair(fields: list[tuple[Location, Any]], key: Callable[[Location, Any], tuple[Any, ...]],
          rng: random.Random) -> tuple[tuple[Location, Any], tuple[Location, Any]] | None:
    """Two fields in one group (by `key`) with different values, or None when no group has them."""
    groups: dict[tuple[Any, ...], list[tuple[Location, Any]]] = {}
    for field in fields:
        groups.setdefault(key(*field), []).append(field)
    usable = [group for group in groups.values() if len({node for _, node in group}) > 1]
    if not usable:
        return None
    group = rng.choice(usable)
    first = rng.choice(group)
    return first, rng.choice([f for f in group if f[1] != first[1]])


def emptied(value: Any, rng: random.Random, *, paths: Sequence[str] = (), probability: float = 1.0,
            keep: frozenset[Location] = frozenset()) -> Any:
    """Every targeted list emptied (no results); where none is targeted, every string emptied."""
    where = targets(value, paths, keep)
    has_list = any(isinstance(node, list) for _, node in _walk(value, where))
    kind = list if has_list else str

    def fn(node: Any, _loc: Location) -> Any:
        return node[:0] if isinstance(node, kind) and node and _chosen(rng, probability) else node
    return _rebuild(value, fn, where)
