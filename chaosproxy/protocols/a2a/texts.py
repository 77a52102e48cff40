"""A reply's piece as a tools/call result, so that the content and reward faults act on A2A replies, and
what of such a result the piece can carry back.

The result's `content` is the piece's text parts (a data part as its JSON text), in order; its `isError`
is the task's outcome where the piece reports one (a task or a status update, completed: false, failed:
true). Carried back: each text in its part (a data part only as valid JSON); texts in another number (a
fault that replaced the whole result: error_in_success, a stale replay) as their lines in the first text
part, the other text parts dropped; the other outcome (completed and failed swapped, texts and artifacts
kept). Nothing else of an MCP result has a place in an A2A reply (structuredContent, _meta, an input
request, isError on a piece that reports no outcome): a fault that changes only that changes nothing the
agent gets, and the relay does not let it fire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from chaosproxy.protocols.a2a import wire
from chaosproxy.protocols.a2a.wire import A2aCall, Piece
from chaosproxy.protocols.tasks import TaskState

OUTCOMES = {TaskState.COMPLETED: False, TaskState.FAILED: True}  # a task's outcome as MCP's isError


@dataclass(frozen=True, slots=True)
class PieceTexts:
    """One piece's texts, read as a tools/call result and written back from one."""

    piece: Piece
    spelling: str  # how the piece is spelled (wire.dialect)

    @classmethod
    def of(cls, piece: Piece, call: A2aCall) -> PieceTexts | None:
        """The piece's texts and outcome, or None when it carries neither (then no fault has anything to change)."""
        texts = cls(piece, wire.dialect(piece, call))
        return texts if texts.outcome is not None or _places(piece.obj, piece.kind) else None

    @property
    def outcome(self) -> bool | None:
        """The isError the piece's outcome stands for, None when it reports none."""
        state = self.piece.state
        return OUTCOMES.get(state) if state is not None and self.piece.kind in ("task", "status") else None

    def result(self) -> dict[str, Any]:
        """The piece as a tools/call result."""
        content = [{"type": "text", "text": wire.part_text(parts[i])} for parts, i in _places(self.piece.obj,
                                                                                              self.piece.kind)]
        return {"content": content} | ({"isError": self.outcome} if self.outcome is not None else {})

    def written(self, result: Any) -> dict[str, Any] | None:
        """The piece (a new object) saying what `result` says, or None when it cannot say it."""
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, list) or not all(
                isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)
                for item in content):
            return None
        failed = result.get("isError") is True
        if failed and self.outcome is None:
            return None  # an error said of a piece that reports no outcome: it has nowhere to go
        obj: dict[str, Any] = orjson.loads(orjson.dumps(self.piece.obj))  # (nested: part lists are written in place)
        places = _places(obj, self.piece.kind)
        texts = [item["text"] for item in content]
        if not places and texts:
            return None  # texts said of a piece that has none (a status update with no message)
        if len(texts) == len(places):
            for (parts, i), text in zip(places, texts, strict=True):
                if text != wire.part_text(parts[i]) and (part := wire.with_text(parts[i], text)) is not None:
                    parts[i] = part
        elif places:
            first, i = places[0]
            first[i] = {"kind": "text", "text": "\n".join(texts)} if self.spelling == wire.V0_3 else {
                "text": "\n".join(texts)}
            for parts, j in reversed(places[1:]):
                del parts[j]
        if self.outcome is not None and failed != self.outcome:
            obj = wire.in_state(Piece(self.piece.kind, obj, self.piece.put), self.spelling,
                                TaskState.FAILED if failed else TaskState.COMPLETED)
        return obj


def _places(obj: dict[str, Any], kind: str) -> list[tuple[list[Any], int]]:
    """(parts, index) of each text part in a piece, in order."""
    return [(parts, i) for parts in wire.part_lists(Piece(kind, obj, _nowhere)) for i, part in enumerate(parts)
            if wire.part_text(part) is not None]


def _nowhere(new: dict[str, Any]) -> None:
    """The `put` of a piece only read."""
