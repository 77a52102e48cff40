"""The executor `chaosproxy run` and `chaosproxy mitm` share (adapters/execute, adapters/shaping): the same
stages shape a body alike whether they run over async chunks (the HTTP adapter) or chunk by chunk from
mitmproxy's stream callback, however the upstream cut the body; request-side actions end an exchange
where the HTTP and mitm adapters' tests show them doing so on real sockets."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Callable

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from chaosproxy.adapters.execute import OUTCOMES, act_on_request, shape_body
from chaosproxy.adapters.http.calls import Exchange
from chaosproxy.adapters.jsonrpc import JsonRpcRelay
from chaosproxy.adapters.shaping import (
    FRACTION_WAIT_S,
    Events,
    Fraction,
    Limit,
    Slices,
    Stage,
    ending,
    planned,
    run,
    shaped,
)
from chaosproxy.engine.actions import CutStream, Delay, Drip, Hang, Reset, Respond, Truncate
from chaosproxy.engine.core import Engine, Fired
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.log import PerturbationLog
from chaosproxy.telemetry.log_schema import Outcome, StreamEnd
from tests.helpers.framing_support import RawClient, read_request
from tests.helpers.support import rule

SETTINGS = settings(max_examples=150, deadline=None)


def chunked(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(body), *(cut % (len(body) + 1) for cut in cuts)})
    return [body[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


def by_callback(stages: list[Stage], chunks: list[bytes]) -> list[bytes]:
    """As mitm's Shaper runs them: one chunk at a time, then the end (an empty chunk)."""
    out: list[bytes] = []
    for chunk in [*chunks, b""]:
        pieces, end = run(stages, [chunk] if chunk else [], not chunk)
        out += pieces
        if end:
            break
    return out


def by_iterator(stages: list[Stage], chunks: list[bytes]) -> list[bytes]:
    """As the HTTP adapter runs them: over the body's async chunks."""
    async def source() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def collect() -> list[bytes]:
        return [piece async for piece in shaped(source(), stages, None)]

    return asyncio.run(collect())


def both(make: Callable[[], list[Stage]], chunks: list[bytes]) -> list[bytes]:
    """What the stages let through, the same both ways."""
    one, other = by_callback(make(), chunks), by_iterator(make(), chunks)
    assert one == other
    return one


@SETTINGS
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=8), st.integers(0, 450))
def test_a_limit_lets_the_first_bytes_through(body, cuts, left):
    assert b"".join(both(lambda: [Limit(left, StreamEnd.CLOSE)], chunked(body, cuts))) == body[:left]


@SETTINGS
@given(st.binary(min_size=1, max_size=400), st.lists(st.integers(0, 400), max_size=8), st.integers(1, 50))
def test_a_drip_cuts_every_chunk_into_pieces_of_its_size(body, cuts, size):
    pieces = both(lambda: [Slices(size)], chunked(body, cuts))
    assert b"".join(pieces) == body and all(0 < len(piece) <= size for piece in pieces)


@SETTINGS
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=8), st.floats(0, 1), st.booleans())
def test_a_fraction_is_of_the_length_or_of_the_whole_body(body, cuts, fraction, known):
    told: list[bool] = []

    def make() -> list[Stage]:
        return [Fraction(fraction, len(body) if known else None, 1 << 20, lambda: told.append(True))]

    assert b"".join(both(make, chunked(body, cuts))) == body[:int(len(body) * fraction)] and not told


def test_a_fraction_of_a_body_past_what_may_be_held_goes_on_whole_and_says_so():
    told: list[bool] = []
    stages: list[Stage] = [Fraction(0.5, None, 10, lambda: told.append(True))]
    assert b"".join(by_callback(stages, [b"x" * 8, b"y" * 8, b"z" * 8])) == b"x" * 8 + b"y" * 8 + b"z" * 8
    assert told == [True] and ending(stages) is StreamEnd.EOF  # the body ends as upstream ends it


EVENTS = st.lists(st.tuples(st.binary(max_size=20).filter(lambda data: b"\n" not in data and b"\r" not in data),
                            st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r"])), max_size=8)


@pytest.mark.slow
@SETTINGS
@given(EVENTS, st.lists(st.integers(0, 400), max_size=8), st.integers(0, 10))
def test_a_cut_stream_ends_with_its_last_event_and_passes_each_chunk_as_it_comes(events, cuts, after):
    frames = [b"data: " + data + end for data, end in events]
    body = b"".join(frames)
    chunks = chunked(body, cuts)
    out = both(lambda: [Events(after, idle=False)], chunks)
    assert b"".join(out) == (b"".join(frames[:after]) if after < len(frames) else body)
    assert all(piece == chunk for piece, chunk in zip(out[:-1], chunks, strict=False))  # unbuffered


def test_the_shape_of_a_body_follows_the_actions_in_the_order_they_fired():
    engine = Engine(parse_scenario(yaml.safe_dump({"rules": []})), seed=1,
                    log=PerturbationLog(io.BytesIO(), run_id="t", seed=1))
    request = Message("http", Phase.REQUEST, path="/p")
    shape = shape_body([Delay(0.25), Drip(3, 0.01), Truncate(5), Delay(0.25)], None, max_held=100, engine=engine,
                       request=request)
    assert (shape.delay, shape.pace, [type(stage) for stage in shape.stages]) == (0.5, 0.01, [Slices, Limit])
    assert b"".join(by_callback(shape.stages, [b"0123456789"])) == b"01234" and ending(shape.stages) is StreamEnd.CLOSE
    for action, end in ((Reset(after_bytes=2), StreamEnd.RESET), (CutStream(1, idle=True), StreamEnd.IDLE),
                        (CutStream(1), StreamEnd.CUT), (Truncate(None, 0.5), StreamEnd.CLOSE)):
        stages = shape_body([action], 10, max_held=100, engine=engine, request=request).stages
        assert planned(stages) is end and end in OUTCOMES  # before the body: what a cut would be


class Side:
    """A transport's request side that records what it was asked to do."""

    def __init__(self, gone: bool = False) -> None:
        self.done: list[str] = []
        self.gone = gone

    def answer(self, respond: Respond) -> None:
        self.done.append(f"answer {respond.status}")

    async def hold(self, seconds: float | None) -> bool:
        self.done.append(f"hold {seconds}")
        return self.gone

    async def reset(self, delay: float) -> None:
        self.done.append(f"reset {delay}")


def test_request_actions_run_in_order_until_one_ends_the_exchange():
    engine = Engine(parse_scenario(yaml.safe_dump({"rules": [
        {"name": "r", "fault": {"type": "http_error", "status": 503}}]})), seed=1,
        log=PerturbationLog(io.BytesIO(), run_id="t", seed=1))
    rule = engine.scenario.rules[0]
    relay = JsonRpcRelay(engine, "http", URL("http://upstream.invalid"))
    msg = Message("http", Phase.REQUEST, path="/p")

    def act(*actions, gone: bool = False) -> tuple[bool, str, list[str]]:
        exchange, side = Exchange(), Side(gone)
        fired = [Fired(rule, rule.fault, action) for action in actions]
        ended = asyncio.run(act_on_request(fired, exchange, side, relay, msg))
        return ended, exchange.outcome, side.done

    answered = (True, Outcome.FAULT_RESPONSE, ["hold 0.01", "answer 503"])
    assert act(Hang(0.01), Respond(503, b"", {}), Reset()) == answered
    assert act(Hang(None), Respond(503, b"", {}), gone=True) == (True, Outcome.HANG, ["hold None"])
    assert act(Delay(0.0), Reset(delay=0.5)) == (True, Outcome.RESET, ["reset 0.5"])
    assert act(Delay(0.0)) == (False, Outcome.OK, [])


@pytest.mark.slow
def test_a_fraction_of_a_stalled_body_of_unknown_length_is_let_go_after_a_while(make_proxy, scripted):
    """Under `chaosproxy run` the wait for a body's end has a deadline of its own: an upstream that sends
    a piece and then nothing does not keep the agent waiting for it until it sends more."""
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    proxy = make_proxy(rule("cut", {"type": "truncate", "fraction": 0.5}), to=scripted(script).url)
    with RawClient(proxy.url, timeout=10) as client:
        client.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
        started = time.monotonic()
        head = b""
        while not head.endswith(b"first\r\n"):
            head += client.sock.recv(4096)
    assert time.monotonic() - started < FRACTION_WAIT_S + 3
    assert [skip["reason"] for skip in proxy.events("skip")] == ["fraction of a body that did not end: relayed whole"]
