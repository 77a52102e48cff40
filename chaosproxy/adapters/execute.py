"""Carrying out the engine's actions on an HTTP exchange, whatever the transport: what `chaosproxy run`
(adapters/http) and `chaosproxy mitm` (adapters/mitm) do alike with the faults that fired on a request
and on a response's head. Each hands its own thin layer: a `RequestSide` (answer in the proxy's name,
hold the agent, reset its connection), and the shaped body's stages run over its chunks
(`shaping.shaped` for async chunks, `shaping.run` for mitmproxy's chunk callback).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from chaosproxy.adapters.jsonrpc import BodyRelay
from chaosproxy.adapters.shaping import Events, Fraction, Limit, Slices, Stage
from chaosproxy.engine.actions import Action, CutStream, Delay, Drip, Hang, Reply, Reset, Respond, Truncate
from chaosproxy.engine.core import Engine, Fired
from chaosproxy.engine.message import Message
from chaosproxy.telemetry.log_schema import Outcome, StreamEnd

if TYPE_CHECKING:  # (the http package imports this module)
    from chaosproxy.adapters.http.calls import Exchange

# the call's outcome when a fault ended its body (a body that ends as upstream ended it keeps its own)
OUTCOMES = {StreamEnd.CUT: Outcome.STREAM_CUT, StreamEnd.CLOSE: Outcome.TRUNCATED, StreamEnd.RESET: Outcome.RESET,
            StreamEnd.IDLE: Outcome.STREAM_IDLE}


class RequestSide(Protocol):
    """How a transport carries out what faults do to a request before it goes upstream."""

    def answer(self, respond: Respond) -> None:
        """Answer in the proxy's name (the call line logged before the agent can see the answer)."""

    async def hold(self, seconds: float | None) -> bool:
        """Keep the agent waiting `seconds` (None: until it gives up); True when it went away meanwhile."""

    async def reset(self, delay: float) -> None:
        """After `delay` s, cut the agent's connection with a TCP reset."""


def decide(engine: Engine, msg: Message, exchange: Exchange, *, messages: bool = True,
           body_length: int | None = None) -> list[Fired]:
    """The faults that fire on `msg` (on the HTTP exchange as a whole; with `messages`, on the JSON-RPC
    message in its body too), named on the exchange's call line. `body_length`: the bytes of the body the
    agent is to get, when known and no rule can change them: a truncate at or past its end changes
    nothing, so it does not fire."""
    carries = None if body_length is None else functools.partial(_cuts_within, body_length)
    fired = engine.decide(msg, messages=messages, carries=carries)
    exchange.faults.extend(one.rule.name for one in fired)
    return fired


def _cuts_within(length: int, action: Action) -> bool:
    """Whether `action` changes a body of `length` bytes (all but a truncate do, or may)."""
    if isinstance(action, Truncate):
        kept = action.limit if action.limit is not None else int(length * (action.fraction or 0))
        return kept < length
    return True


async def act_on_request(fired: Sequence[Fired], exchange: Exchange, side: RequestSide, relay: BodyRelay,
                         msg: Message) -> bool:
    """The actions that fired on request `msg`, carried out in rule order. True when the exchange ended
    here (answered in the proxy's name, reset, or the agent left a hang); False: it goes upstream."""
    for one in fired:
        match one.action:
            case Delay(seconds):
                await asyncio.sleep(seconds)
            case Respond() as respond:
                exchange.outcome = Outcome.FAULT_RESPONSE
                side.answer(respond)
                return True
            case Reply(message, delay):
                exchange.outcome = Outcome.FAULT_RESPONSE
                await asyncio.sleep(delay)
                side.answer(relay.reply(msg, message))
                return True
            case Hang(release_after):
                exchange.outcome = Outcome.HANG
                if await side.hold(release_after):
                    return True
                exchange.outcome = Outcome.OK
            case Reset(delay=delay):
                exchange.outcome = Outcome.RESET
                await side.reset(delay)
                return True
    return False


@dataclass(slots=True)
class BodyShape:
    """What the faults that fired on a response's head do to it: a delay before the head, then its body
    through `stages` (in the order the faults fired), a piece every `pace` s when dripped."""

    delay: float = 0.0
    stages: list[Stage] = field(default_factory=list)
    pace: float | None = None


def shape_body(actions: Sequence[Action], length: int | None, *, max_held: int, engine: Engine,
               request: Message) -> BodyShape:
    """The shape the actions on a response's head give its body (`length`: its Content-Length, if any).
    A fraction of a body of unknown length holds it to learn its size, at most `max_held` bytes."""
    shape = BodyShape()

    def unended() -> None:
        engine.log.skip(rule=None, fault="truncate", transport=request.transport, session=request.session,
                        path=request.path, reason="fraction of a body that did not end: relayed whole")

    for action in actions:
        match action:
            case Delay(seconds):
                shape.delay += seconds
            case Drip(size, delay):
                shape.stages.append(Slices(size))
                shape.pace = delay
            case Truncate(limit, fraction):
                shape.stages.append(Limit(limit, StreamEnd.CLOSE) if limit is not None
                                    else Fraction(fraction or 0.0, length, max_held, unended))
            case Reset(after_bytes):
                shape.stages.append(Limit(after_bytes or 0, StreamEnd.RESET))
            case CutStream(after_events, idle):
                shape.stages.append(Events(after_events, idle))
    return shape
