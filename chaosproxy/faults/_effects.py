"""What a fault did, said in its log line's `effect`: the names it mapped, the characters it changed
and where, the parts of a result or a tool list it touched. Not a fault itself: it registers nothing.

An effect is found by comparing what upstream (or the agent) sent with what the fault made of it,
so it says what reached the other side, whichever fault made it. It is small whatever the payload:
at most MAX_ENTRIES places, names cut to MAX_NAME characters, no value copied but a tool's or an
argument's name (a result may be large, and what agents and upstreams send is not trusted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from chaosproxy.engine.actions import Garble, Rewrite
from chaosproxy.engine.message import Message

MAX_ENTRIES = 8  # places an effect lists; the rest are counted
MAX_NAME = 64  # characters of a name or a place an effect shows
MAX_DEPTH = 16  # levels of JSON an effect looks into
# Aligning two texts (text_change): equal stretches are skipped CHUNK characters at a time; after a
# difference the texts are in step again where RESYNC characters agree within WINDOW characters of it,
# or where ANCHOR characters of one turn up within JUMP of the other (text added or dropped). After
# MAX_EDITS differences, the rest up to what both end with counts as one.
CHUNK, RESYNC, WINDOW, ANCHOR, JUMP, MAX_EDITS = 64, 3, 8, 32, 1 << 16, 128


def short(name: Any) -> str:
    text = name if isinstance(name, str) else repr(name)
    return text if len(text) <= MAX_NAME else text[:MAX_NAME] + "…"


def bounded(entries: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """At most MAX_ENTRIES entries, their keys cut short; how many more there were under "more"."""
    kept: dict[str, Any] = {}
    more = 0
    for key, value in entries:
        if len(kept) < MAX_ENTRIES:
            kept[short(key)] = value
        else:
            more += 1
    if more:
        kept["more"] = more
    return kept


def text_change(before: str, after: str) -> dict[str, Any]:
    """How a text changed: characters replaced, dropped or added (as aligning the two finds them: exact
    for scattered slips, at most the changed stretch when changes crowd), the first offsets in the
    original where they are, and the lengths before and after. Linear in the texts' length."""
    edits = _edits(before, after)
    change = {"chars": sum(size for _, size in edits), "at": [at for at, _ in edits[:MAX_ENTRIES]],
              "length": [len(before), len(after)]}
    return change | {"upper_bound": True} if len(edits) > MAX_EDITS else change  # (the rest counted whole)


def _edits(a: str, b: str) -> list[tuple[int, int]]:
    """(offset in `a`, characters) of each difference, walking both texts in step."""
    i = j = 0
    edits: list[tuple[int, int]] = []
    while i < len(a) and j < len(b) and len(edits) < MAX_EDITS:
        while a[i:i + CHUNK] == b[j:j + CHUNK] and i + CHUNK <= len(a) and j + CHUNK <= len(b):
            i, j = i + CHUNK, j + CHUNK
        if a[i] == b[j]:
            i, j = i + 1, j + 1
            continue
        skip_a, skip_b = _in_step(a, b, i, j)
        edits.append((i, max(skip_a, skip_b)))
        i, j = i + skip_a, j + skip_b
    if i < len(a) or j < len(b):
        rest_a, rest_b = a[i:], b[j:]
        edits.append((i, max(len(rest_a), len(rest_b)) - _common_suffix(rest_a, rest_b)))
    return edits


def _in_step(a: str, b: str, i: int, j: int) -> tuple[int, int]:
    """How far each text must go from a difference at a[i], b[j] to agree again (nearest first)."""
    for total in range(1, 2 * WINDOW + 1):
        for skip_a in range(max(0, total - WINDOW), min(total, WINDOW) + 1):
            skip_b = total - skip_a
            tail_a, tail_b = a[i + skip_a:i + skip_a + RESYNC], b[j + skip_b:j + skip_b + RESYNC]
            if tail_a == tail_b and (tail_a or (i + skip_a == len(a) and j + skip_b == len(b))):
                return skip_a, skip_b
    added, dropped = b.find(a[i:i + ANCHOR], j, j + JUMP), a.find(b[j:j + ANCHOR], i, i + JUMP)
    jumps = ([(0, added - j)] if added > j else []) + ([(dropped - i, 0)] if dropped > i else [])
    return min(jumps, key=sum) if jumps else (1, 1)


def _common_suffix(a: str, b: str) -> int:
    """The length of what `a` and `b` both end with (slices compared, so in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[len(a) - middle:] == b[len(b) - middle:]:
            low = middle
        else:
            high = middle - 1
    return low


def json_changes(before: Any, after: Any, where: str, depth: int = 0) -> Iterable[tuple[str, Any]]:
    """(place, what changed there) for every place two JSON values differ, depth first."""
    if before == after:
        return
    if depth >= MAX_DEPTH:
        yield where, "changed"
    elif isinstance(before, str) and isinstance(after, str):
        yield where, text_change(before, after)
    elif isinstance(before, dict) and isinstance(after, dict):
        for key in before:
            if key not in after:
                yield f"{where}.{short(key)}", "removed"
            else:
                yield from json_changes(before[key], after[key], f"{where}.{short(key)}", depth + 1)
        for key in after.keys() - before.keys():
            yield f"{where}.{short(key)}", "added"
    elif isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            yield f"{where}[]", {"items": [len(before), len(after)]}
        for i, (old, new) in enumerate(zip(before, after, strict=False)):
            yield from json_changes(old, new, f"{where}[{i}]", depth + 1)
    else:
        yield where, f"replaced ({_kind(before)} to {_kind(after)})"


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _tool_name(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, dict) else None
    return name if isinstance(name, str) else None


def tools_effect(before: list[Any], after: list[Any]) -> dict[str, Any]:
    """A tool list's change: tools renamed in place, added (a copy of a listed tool says how it
    differs from it), removed, and what changed in the tools kept (inputSchema, description, ...)."""
    old, new = [_tool_name(tool) for tool in before], [_tool_name(tool) for tool in after]
    effect: dict[str, Any] = {}
    renamed = [(a, b) for a, b in zip(old, new, strict=True) if a != b] if len(old) == len(new) else []
    if renamed and Counter(old) - Counter(a for a, _ in renamed) == Counter(new) - Counter(b for _, b in renamed):
        effect["renamed"] = bounded((str(a), short(b)) for a, b in renamed)
        new = old  # the tools are then compared as the tools they were
    originals = {name: tool for name, tool in reversed(list(zip(old, before, strict=True))) if name is not None}
    listed = Counter(old)
    shown: dict[str, list[Any]] = {}
    for name, tool in zip(new, after, strict=True):
        if name is not None:
            shown.setdefault(name, []).append(tool)
    added: list[tuple[str, Any]] = []
    changed: list[tuple[str, Any]] = []
    for name, tools in shown.items():
        original = originals.get(name)
        if original is None:
            added += [(name, "new")] * len(tools)
            continue
        kept = next((tool for tool in tools if tool == original), tools[0])
        changed += json_changes(_without_name(original), _without_name(kept), name)
        copies = [tool for tool in tools if tool is not kept][:max(0, len(tools) - listed[name])]
        added += [(name, _copy_of(original, copy)) for copy in copies]
    if added:
        effect["added"] = bounded(added)
    if removed := listed - Counter(new):
        effect["removed"] = bounded((str(name), count) for name, count in removed.items())
    if changed:
        effect["changed"] = bounded(changed)
    return effect


def _copy_of(original: dict[str, Any], copy: Any) -> str:
    differs = sorted(key for key in original.keys() | (copy.keys() if isinstance(copy, dict) else set())
                     if key != "name" and original.get(key) != (copy.get(key) if isinstance(copy, dict) else None))
    return f"a copy, other {', '.join(map(short, differs[:MAX_ENTRIES]))}" if differs else "an identical copy"


def _without_name(tool: Any) -> Any:
    return {key: value for key, value in tool.items() if key != "name"} if isinstance(tool, dict) else tool


def result_effect(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A tools/call result's change: each text item, value of structuredContent or flag that changed."""
    return {"changed": bounded(json_changes(before, after, "result"))}


def call_effect(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A tools/call request's change: the tool it now names, the arguments renamed, added or dropped,
    and those whose value changed (by name only: an argument's value may hold what the user wrote)."""
    effect: dict[str, Any] = {}
    if before.get("name") != after.get("name"):
        effect["tool"] = {"called": short(before.get("name")), "sent_as": short(after.get("name"))}
    old, new = before.get("arguments") or {}, after.get("arguments") or {}
    if isinstance(old, dict) and isinstance(new, dict) and old != new:
        gone, came = [key for key in old if key not in new], [key for key in new if key not in old]
        values = {key: value for key, value in old.items() if key in gone}
        renamed = [(key, next(k for k in came if new[k] == values[key]))
                   for key in gone if any(new[k] == values[key] for k in came)]
        effect["arguments"] = {key: value for key, value in {
            "renamed": bounded((a, short(b)) for a, b in renamed),
            "dropped": [short(key) for key in gone if key not in dict(renamed)][:MAX_ENTRIES],
            "added": [short(key) for key in came if key not in dict(renamed).values()][:MAX_ENTRIES],
            "changed": [short(key) for key in old if key in new and old[key] != new[key]][:MAX_ENTRIES],
        }.items() if value}
    return effect


def with_tools(msg: Message, tools: list[Any]) -> Rewrite:
    """A Rewrite of a tools/list response with this tool list (nextCursor and all else kept), saying
    what changed in it."""
    rpc = msg.rpc
    assert rpc is not None
    return Rewrite({**rpc, "result": {**rpc["result"], "tools": tools}},
                   effect=tools_effect(rpc["result"]["tools"], tools))


def with_result(msg: Message, result: dict[str, Any]) -> Rewrite:
    """A Rewrite of a response with this result, saying what changed in it."""
    rpc = msg.rpc
    assert rpc is not None
    before = rpc.get("result")
    return Rewrite({**rpc, "result": result}, effect=result_effect(before if isinstance(before, dict) else {}, result))


def garbled_body(before: str, after: str, charset: str) -> Garble:
    """A plain (REST) body's text `before` replaced by `after` (in `charset`), saying how it changed."""
    return Garble(after.encode(charset, "replace"), effect={"changed": {"body": text_change(before, after)}})
