"""Toxiproxy's toxics as chaosproxy rules: what the Toxiproxy-compatible API (control/toxiproxy.py) keeps
of each toxic, and the rule it puts in force on its proxy.

Toxiproxy's own types map onto the transport faults; chaosproxy's faults are toxics too, under their type
with a `chaosproxy.` prefix, whose attributes are the fault's YAML parameters. A toxic's toxicity is its
rule's probability. Toxiproxy acts on raw TCP bytes and draws toxicity once per connection; chaosproxy
is HTTP-aware and decides per request: where that differs, `MAPPING` below and the README say how.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from chaosproxy.engine.scenario import Rule

STREAMS = ("upstream", "downstream")  # Toxiproxy's order when it lists a proxy's toxics
OWN_PREFIX = "chaosproxy."  # toxic types naming a chaosproxy fault
# Each Toxiproxy toxic type: its attributes (all whole numbers, 0 when left out, as Go decodes them) and
# what it becomes. Toxiproxy's `bandwidth` rate is in KB/s of 1000 bytes; its slicer delay in µs.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "timeout": ("timeout",),
    "bandwidth": ("rate",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
    "reset_peer": ("timeout",),
    "slow_close": ("delay",),
}
# Toxics that act on the bytes of a body as it streams: chaosproxy shapes response bodies only.
DOWNSTREAM_ONLY = frozenset({"bandwidth", "slicer", "limit_data"})
DRIP_EVERY_MS = 100  # a bandwidth toxic drips the body once per this many ms


class ToxicError(ValueError):
    """A toxic Toxiproxy would refuse (or that chaosproxy cannot carry out): `status` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Toxic:
    """One toxic as the Toxiproxy API shows it, and the rule that carries it out (None: no HTTP effect)."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, Any] = field(default_factory=dict)
    rule: Rule | None = None

    def as_json(self) -> dict[str, Any]:
        return {"attributes": self.attributes, "name": self.name, "type": self.type, "stream": self.stream,
                "toxicity": self.toxicity}


def new_toxic(body: Any) -> Toxic:
    """A toxic from a POST /proxies/{name}/toxics body, with Toxiproxy's defaults (downstream, toxicity 1,
    named TYPE_STREAM); ToxicError with Toxiproxy's message when it would refuse it."""
    if not isinstance(body, dict):
        raise ToxicError("bad request body: expected a JSON object")
    stream = body.get("stream") or "downstream"
    if not isinstance(stream, str) or stream.lower() not in STREAMS:
        raise ToxicError("stream was invalid, can be either upstream or downstream")
    kind = body.get("type")
    if not isinstance(kind, str) or not (kind in ATTRIBUTES or kind.startswith(OWN_PREFIX)):
        raise ToxicError("invalid toxic type")
    name = body.get("name") or f"{kind}_{stream}"
    if not isinstance(name, str):
        raise ToxicError("bad request body: name is a string")
    toxic = Toxic(name, kind, stream.lower(), 1.0)
    return changed(toxic, {"toxicity": body.get("toxicity", 1.0), "attributes": body.get("attributes") or {}})


def changed(toxic: Toxic, body: Any) -> Toxic:
    """`toxic` with a POST /proxies/{name}/toxics/{toxic} body's attributes and toxicity (those left out
    stay as they were), its rule made anew; ToxicError when they are not valid."""
    if not isinstance(body, dict):
        raise ToxicError("bad request body: expected a JSON object")
    toxicity = body.get("toxicity", toxic.toxicity)
    if isinstance(toxicity, bool) or not isinstance(toxicity, int | float) or not 0 <= toxicity <= 1:
        raise ToxicError(f"bad request body: toxicity is a number from 0 to 1, got {toxicity!r}")
    given = body.get("attributes") or {}
    if not isinstance(given, dict):
        raise ToxicError("bad request body: attributes is a JSON object")
    attributes = {**toxic.attributes, **given}
    if toxic.type in ATTRIBUTES:
        attributes = _whole_numbers(toxic.type, attributes)
    result = Toxic(toxic.name, toxic.type, toxic.stream, float(toxicity), attributes)
    result.rule = _rule(result)
    return result


def _whole_numbers(kind: str, attributes: dict[str, Any]) -> dict[str, int]:
    """A Toxiproxy toxic's attributes: its own, whole numbers (0 when left out); others are dropped, as Go's
    decoder drops them."""
    known: dict[str, int] = {}
    for key in ATTRIBUTES[kind]:
        value = attributes.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToxicError(f"bad request body: attributes.{key} of a {kind} toxic is a whole number, got {value!r}")
        if value < 0:
            raise ToxicError(f"attributes.{key} of a {kind} toxic cannot be negative, got {value}")
        known[key] = value
    return known


def _rule(toxic: Toxic) -> Rule | None:
    """The rule that carries `toxic` out, named after it; None when it would change nothing over HTTP."""
    fault = _own_fault(toxic) if toxic.type.startswith(OWN_PREFIX) else _mapped_fault(toxic)
    if fault is None:
        return None
    try:
        return Rule.model_validate({"name": toxic.name, "probability": toxic.toxicity, "fault": fault,
                                    "description": f"Toxiproxy toxic {toxic.type} ({toxic.stream})"})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'attributes'}: {e['msg']}" for e in exc.errors())
        raise ToxicError(f"invalid attributes for a {toxic.type} toxic: {problems}") from None


def _own_fault(toxic: Toxic) -> dict[str, Any]:
    """A `chaosproxy.TYPE` toxic: the fault TYPE with the attributes as its parameters (it acts where
    that fault acts, whatever the stream)."""
    from chaosproxy.faults import REGISTRY

    kind = toxic.type.removeprefix(OWN_PREFIX)
    if kind not in REGISTRY:
        raise ToxicError(f"invalid toxic type: chaosproxy has no fault {kind!r} (see `chaosproxy faults`)")
    return {**toxic.attributes, "type": kind}


def _mapped_fault(toxic: Toxic) -> dict[str, Any] | None:
    """The chaosproxy fault a Toxiproxy toxic type maps onto (None: none would change what an HTTP agent gets)."""
    a, downstream = toxic.attributes, toxic.stream == "downstream"
    if toxic.type in DOWNSTREAM_ONLY and not downstream:
        raise ToxicError(f"chaosproxy cannot carry out an upstream {toxic.type} toxic: it shapes response "
                         "bodies only; use stream downstream")
    match toxic.type:
        case "latency":
            if not a["latency"] and not a["jitter"]:
                return None
            return {"type": "latency", "delay_ms": a["latency"], "jitter_ms": a["jitter"],
                    "phase": "response" if downstream else "request"}
        case "timeout":  # data stops; the connection closes after `timeout` ms (0: never)
            return {"type": "reset", "after_ms": a["timeout"]} if a["timeout"] else {"type": "hang"}
        case "reset_peer":
            return {"type": "reset", **({"after_ms": a["timeout"]} if a["timeout"] else {})}
        case "bandwidth":
            if not a["rate"]:
                return {"type": "hang"}  # no byte gets through at 0 KB/s
            return {"type": "slow_body", "chunk_bytes": a["rate"] * DRIP_EVERY_MS, "delay_ms": DRIP_EVERY_MS}
        case "slicer":
            if not a["average_size"]:
                return None
            return {"type": "slow_body", "chunk_bytes": a["average_size"], "delay_ms": a["delay"] / 1000}
        case "limit_data":
            return {"type": "truncate", "bytes": a["bytes"]}
    return None  # slow_close: an HTTP agent's connection is the proxy's own; an upstream close never reaches it
