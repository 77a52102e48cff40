"""What the observation faults share: which parts of a tool result they perturb, and how they get there.

Not a fault itself: it registers nothing. A fault says how to perturb one payload (plain text or a
parsed JSON value, see chaosproxy.faults._text_edits); this base finds the payloads in an MCP tool result
(text items of `content`, `structuredContent`) or in a plain HTTP body, and puts the results back.
"""

from __future__ import annotations

import codecs
import random
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from chaosproxy.engine.actions import Garble, Rewrite, Skip
from chaosproxy.engine.message import Message, Phase
from chaosproxy.faults import _text_edits
from chaosproxy.faults._effects import garbled_body, with_result
from chaosproxy.faults._input_required import asks_for_input, with_questions_perturbed
from chaosproxy.faults._schema import Guard, guard
from chaosproxy.faults.base import RESULTS, Component, Fault, FaultContext, Level
from chaosproxy.protocols.mcp import call_result


def _valid_path(path: str) -> str:
    _text_edits.compile_path(path)
    return path


JSONPathQuery = Annotated[str, AfterValidator(_valid_path)]


class ContentFault(Fault):
    """Base of the faults that perturb what a tool returns, value by value, never breaking its JSON.

    A text item that holds a JSON object or array is perturbed as JSON; other text as text. When a
    text item restates `structuredContent` (as servers send it: its JSON form, or the text that
    `{"result": text}` wraps), it follows the perturbed structuredContent, so both still agree.
    Images, audio and other binary content pass untouched.
    """

    where: Literal["text", "structured", "both"] = Field(
        "both", description="perturb the text items of `content`, `structuredContent`, or both")
    items: list[int] | None = Field(
        None, description="indices of the `content` items to perturb (negative: from the end); unset: all")
    paths: list[JSONPathQuery] = Field(default_factory=list, description=(
        "JSONPath queries (RFC 9535) selecting the JSON values to perturb, e.g. $.items[*].name; "
        "unset: every value. Plain text has no paths: with paths, only JSON is perturbed"))
    probability: float = Field(1.0, ge=0, le=1, description="chance that each targeted value is perturbed")
    respect_schema: bool = Field(True, description=(
        "keep results valid for the tool's outputSchema: free text is perturbed, enum values, formats, "
        "patterns and keys are not, and what the schema rejects is put back; false: perturb everything, "
        "so clients that validate results may reject them"))

    component = Component.OBSERVATION
    level = Level.CONTENT
    phase = Phase.RESPONSE
    methods = RESULTS
    # True for faults that treat JSON text as text when no paths are given (a cut mid-document).
    text_first: ClassVar[bool] = False

    def perturb(self, value: Any, rng: random.Random, guard: Guard) -> Any:
        """`value` (plain text, or a parsed JSON value) perturbed outside `guard.keep`; the same
        object when unchanged."""
        raise NotImplementedError

    @property
    def needs_output_schema(self) -> bool:
        return self.respect_schema and self.where != "text"

    def act(self, ctx: FaultContext) -> Rewrite | Garble | Skip | None:
        msg = ctx.message
        if msg.rpc is not None:
            result = call_result(msg)
            if result is None:
                return None
            if asks_for_input(result):
                return self.perturb_questions(msg, result, ctx.rng)
            schema = ctx.session.output_schemas.get(msg.tool or "") if self.respect_schema else None
            fault = self
            if self.needs_output_schema and result.get("structuredContent") is not None \
                    and (msg.tool or "") not in ctx.session.view.listed:
                fault = self.model_copy(update={"where": "text"})  # its schema unknown: the text alone
                ctx.skipped.append(f"structuredContent left as it is: the output schema of tool {msg.tool!r} "
                                   "is not known (upstream never listed it to the proxy), and a value "
                                   "perturbed blind may break it")
            changed = fault.perturb_result(result, ctx.rng, schema)
            if isinstance(changed, dict):
                return with_result(msg, changed)
            return Skip(ctx.skipped[0]) if changed is None and ctx.skipped else changed
        text = body_text(msg)
        if not isinstance(text, str):
            return text
        changed_text = self.perturb_text(text, ctx.rng)
        return garbled_body(text, changed_text, charset_of(msg)) if changed_text != text else None

    def perturb_questions(self, msg: Message, result: dict[str, Any], rng: random.Random) -> Rewrite | Skip | None:
        """An input_required result (MCP 2026-07-28) with the free text of its questions perturbed, as a
        result's text is: the requested schemas, the keys and the requestState (the server's) stay."""
        requests = result.get("inputRequests")
        if self.where == "structured":
            return None
        if not isinstance(requests, dict):
            return Skip("the input_required result asks no question (it carries a requestState alone)")
        asked = {key: with_questions_perturbed(request, lambda text: self.perturb_text(text, rng))
                 for key, request in requests.items()}
        return with_result(msg, {**result, "inputRequests": asked}) if asked != requests else None

    def perturb_result(self, result: dict[str, Any], rng: random.Random,
                       schema: dict[str, Any] | None = None) -> dict[str, Any] | Skip | None:
        """The tools/call result with its targeted parts perturbed; None when nothing changed, Skip
        when there was nothing it could change. `structuredContent` stays valid for `schema` (the
        tool's outputSchema), and the text that restates it follows it."""
        content = result.get("content")
        items: list[Any] = content if isinstance(content, list) else []
        structured: Any = result.get("structuredContent")
        wanted = self._wanted(items)
        targeted = structured is not None and self.where != "text"
        if not wanted and not targeted:
            if self.where == "structured":
                return Skip("the result has no structuredContent")
            kinds = sorted({str(item.get("type")) for item in items if isinstance(item, dict)})
            return Skip(f"no text or JSON to perturb: the result holds {', '.join(kinds) or 'nothing'}")
        changed: dict[str, Any] = {}
        wrapped = _wrapped(structured) if targeted else None
        if not targeted:
            new_structured = structured
        else:
            shield = guard(structured, schema, respect=self.respect_schema)
            new_structured = shield.repaired(structured, self.perturb(structured, rng, shield) if wrapped is None
                                             else {**structured, "result": self.perturb_text(wrapped, rng)})
        if not _same(new_structured, structured):
            changed["structuredContent"] = new_structured
        new_items = list(items)
        for i in wanted:
            text = items[i]["text"]
            new_text = self._mirrored(text, structured, new_structured) if targeted else None
            if new_text is None:
                new_text = self.perturb_text(text, rng)
            if new_text != text:
                new_items[i] = {**items[i], "text": new_text}
        if new_items != items:
            changed["content"] = new_items
        return {**result, **changed} if changed else None

    def perturb_text(self, text: str, rng: random.Random) -> str:
        """A text item or body perturbed: as JSON when it holds JSON, else as text."""
        parsed = None if self._as_text(text) else _text_edits.as_json(text)
        if parsed is None:
            perturbed: str = self.perturb(text, rng, Guard())  # a string perturbed stays one
            return perturbed
        new = self.perturb(parsed, rng, guard(parsed, None, respect=self.respect_schema))
        return text if _same(new, parsed) else _text_edits.render_like(new, text)

    def _mirrored(self, text: str, structured: Any, new_structured: Any) -> str | None:
        """The new text of an item that restates structuredContent (it follows it), else None."""
        if text == _wrapped(structured):
            mirrored: str = new_structured["result"]
            return mirrored
        if (self.respect_schema or not self._as_text(text)) and _text_edits.as_json(text) == structured:
            return text if _same(new_structured, structured) else _text_edits.render_like(new_structured, text)
        return None

    def _as_text(self, text: str) -> bool:
        return self.text_first and not self.paths

    def _wanted(self, items: list[Any]) -> list[int]:
        """Indices of the text items to perturb, in order."""
        if self.where == "structured":
            return []
        chosen = range(len(items)) if self.items is None else sorted(
            {i % len(items) for i in self.items if -len(items) <= i < len(items)})
        return [i for i in chosen if isinstance(items[i], dict) and items[i].get("type") == "text"
                and isinstance(items[i].get("text"), str)]


def _wrapped(structured: Any) -> str | None:
    """The text of a result the SDKs wrap as {"result": value} when a tool returns plain text."""
    if isinstance(structured, dict) and list(structured) == ["result"]:
        wrapped = structured["result"]
        return wrapped if isinstance(wrapped, str) else None
    return None


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript",
               "application/x-ndjson", "application/yaml", "application/x-www-form-urlencoded")


def body_text(msg: Message) -> str | Skip | None:
    """The body of a plain (not JSON-RPC) HTTP response as text; Skip when it is not text, None
    when there is no response body."""
    if msg.phase is not Phase.RESPONSE or not msg.body:
        return None
    encoding = _header(msg.headers, "content-encoding")
    if encoding not in (None, "", "identity"):
        return Skip(f"body is {encoding}-encoded")
    kind = (_header(msg.headers, "content-type") or "").split(";")[0].strip().lower()
    if kind and not (kind.startswith(_TEXT_TYPES) or kind.endswith(("+json", "+xml"))):
        return Skip(f"body is {kind}, not text or JSON")
    try:
        return msg.body.decode(charset_of(msg))
    except UnicodeDecodeError:
        return Skip(f"body is not {charset_of(msg)} text")


def charset_of(msg: Message) -> str:
    """The charset a plain body's Content-Type names (utf-8 when it names none or an unknown one)."""
    kind = _header(msg.headers, "content-type") or ""
    for param in kind.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            try:
                return codecs.lookup(value.strip().strip('"')).name
            except LookupError:
                break
    return "utf-8"


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value
