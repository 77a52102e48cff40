"""A fault on A2A traffic is logged if and only if it changed what the agent received: the real a2a-sdk
client, through the proxy, to the real a2a-sdk server behind a tap that keeps the bytes the upstream sent.

The reward faults have an A2A meaning (flip_is_error: a completed task reported failed, a failed one
completed; error_in_success: the failure text in a completed task); what an A2A reply cannot carry (an
isError on a working update, structuredContent, a broken frame in a whole reply) does not fire at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import TaskState
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosproxy.engine.message import Phase
from chaosproxy.faults import all_faults
from chaosproxy.protocols import a2a
from tests.helpers.a2a_support import JSONRPC, REST, V03_CARD, _serve, _stop, events, final_task, question
from tests.helpers.support import ServerLoop, call_lines, free_port

BINDINGS = [(JSONRPC, "1.0"), (REST, "1.0"), (JSONRPC, "0.3"), (REST, "0.3")]
CLIENT_TIMEOUT_S = 2.0  # a stuck stream stays silent: the client gives up after this
# The parameters a fault needs to be valid, and the variants worth drawing, by type (the defaults else).
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "agent_card_drift": [{"rename": 1}, {"add": 1}],
    "oversize": [{"factor": 3}],
    "remove_tool": [{"tool": "geography"}],
    "truncate_text": [{"fraction": 0.5}],
    "flip_is_error": [{"direction": "to_error"}, {"direction": "to_success"}, {}],
    "error_in_success": [{}, {"structured": "drop"}],
    "wrong_data": [{"mode": "swap"}, {"mode": "stale"}, {"mode": "empty"}],
    "malformed": [{"variant": v} for v in ("truncated", "invalid_json", "wrong_id", "stray_line")],
    "typos": [{"rate": 0.3}],
}
A2A_METHODS = a2a.TASK_REPLIES | a2a.CARDS | {"tools/call"}  # the relay's views: pieces, cards, texts


def a2a_fault_types() -> list[str]:
    """Every fault whose rule can match a reply the A2A relay decides on (each new fault joins by itself)."""
    return sorted(name for name, fault in all_faults().items()
                  if getattr(fault, "phase", None) is Phase.RESPONSE and fault.level not in ("transport", "http", "llm")
                  and (fault.methods is None or fault.methods & A2A_METHODS))


@dataclass
class Tap:
    """A TCP relay in front of the remote agent that keeps what went each way on each connection."""

    url: str
    connections: list[tuple[bytearray, bytearray]] = field(default_factory=list)  # (to upstream, from it)

    def replies(self) -> list[tuple[str, bytes]]:
        """(request target, response body as the upstream sent it) in the order each connection carried them."""
        return [reply for sent, received in self.connections for reply in _http_exchanges(bytes(sent), bytes(received))]


def _http_exchanges(sent: bytes, received: bytes) -> list[tuple[str, bytes]]:
    """One connection's requests and the bodies the upstream answered them with (de-chunked; the last
    one as far as it came)."""
    server, client = h11.Connection(h11.SERVER), h11.Connection(h11.CLIENT)
    server.receive_data(sent)
    client.receive_data(received)
    found: list[tuple[str, bytes]] = []
    target = ""
    while (event := server.next_event()) not in (h11.NEED_DATA, h11.PAUSED) and \
            not isinstance(event, h11.ConnectionClosed):
        if isinstance(event, h11.Request):
            target = event.target.decode()
            client.send(h11.Request(method=event.method, target=event.target, headers=event.headers))
        elif isinstance(event, h11.Data):
            client.send(h11.Data(data=event.data))
        elif isinstance(event, h11.EndOfMessage):
            client.send(h11.EndOfMessage())
            body, complete = _response(client, server)
            found.append((target, body))
            if not complete:
                break
            client.start_next_cycle()
            server.start_next_cycle()
    return found


def _response(client: h11.Connection, server: h11.Connection) -> tuple[bytes, bool]:
    """The response's body, and whether it was whole; the server side told the same (to keep it in step)."""
    body = bytearray()
    while True:
        event = client.next_event()
        if event in (h11.NEED_DATA, h11.PAUSED) or isinstance(event, h11.ConnectionClosed):
            return bytes(body), False
        if isinstance(event, h11.Response):
            server.send(h11.Response(status_code=event.status_code, headers=event.headers, reason=event.reason))
        elif isinstance(event, h11.Data):
            body += event.data
            server.send(h11.Data(data=event.data))
        elif isinstance(event, h11.EndOfMessage):
            server.send(h11.EndOfMessage())
            return bytes(body), True


async def _start_tap(port: int, upstream_port: int) -> tuple[asyncio.Server, Tap]:
    tap = Tap(f"http://127.0.0.1:{port}")

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kept: bytearray) -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                kept += chunk
                writer.write(chunk)
                await writer.drain()
        writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        sent, received = bytearray(), bytearray()
        tap.connections.append((sent, received))
        await asyncio.gather(pump(reader, up_writer, sent), pump(up_reader, writer, received))

    return await asyncio.start_server(relay, "127.0.0.1", port), tap


@pytest.fixture(scope="module")
def tapped_agent(server_loop: ServerLoop) -> Iterator[Tap]:
    """The remote agent behind a tap; its cards name the tap, so that every call goes through it."""
    agent_port, tap_port = free_port(), free_port()
    serving, _ = server_loop.run(_serve(agent_port, free_port(), base=f"http://127.0.0.1:{tap_port}"))
    server, tap = server_loop.run(_start_tap(tap_port, agent_port))
    yield tap
    server_loop.run(_close(server))
    server_loop.run(_stop(serving))


async def _close(server: asyncio.Server) -> None:
    """(on the loop that serves it: an asyncio server is not to be closed from another thread)"""
    server.close()


class _Kept(httpx.AsyncByteStream):
    """A response body passed on as it comes, each piece kept (a stream the client gives up on included)."""

    def __init__(self, stream: Any, kept: bytearray) -> None:
        self.stream, self.kept = stream, kept

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            self.kept += chunk
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


class Keeping(httpx.AsyncBaseTransport):
    """The client's transport: each response body as the client received it, by request target, in order."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.replies: list[tuple[str, bytearray]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        kept = bytearray()
        self.replies.append((request.url.raw_path.decode(), kept))
        return httpx.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                              stream=_Kept(response.stream, kept))

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _send(url: str, binding: str, version: str, streaming: bool) -> tuple[Keeping, list[Any]]:
    """One question through the SDK's client; what its transport received, and the responses it made of it
    (none when it gave up or failed: the faults make it fail in ways of their own)."""
    transport = Keeping()
    responses: list[Any] = []
    async with httpx.AsyncClient(transport=transport, timeout=CLIENT_TIMEOUT_S) as http:
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], streaming=streaming)
        with contextlib.suppress(Exception):
            client = await ClientFactory(config).create_from_url(
                url, relative_card_path=V03_CARD if version == "0.3" else None)
            try:
                responses = await asyncio.wait_for(events(client, question()), CLIENT_TIMEOUT_S * 2)
            finally:
                await client.close()
    return transport, responses


def _by_target(replies: list[tuple[str, Any]]) -> dict[str, list[bytes]]:
    grouped: dict[str, list[bytes]] = {}
    for target, body in replies:
        grouped.setdefault(target, []).append(bytes(body))
    return grouped


def assert_logged_iff_changed(proxy: Any, tap: Tap, upstream_before: int, client: Keeping) -> None:
    """Each call's line lists a fault exactly when the body its client got differs from the upstream's
    (a card: once its URLs, which the proxy points at itself, are put back)."""
    upstream = _by_target(tap.replies()[upstream_before:])
    received = _by_target([(target, body.replace(proxy.url.encode(), tap.url.encode()))
                           for target, body in client.replies])
    lines = call_lines(proxy, len(client.replies), timeout=10)
    by_target: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_target.setdefault(line["path"], []).append(line)
    for target, bodies in received.items():
        for i, body in enumerate(bodies):
            changed = body != upstream[target][i]
            line = by_target[target.split("?")[0]][i]
            assert bool(line["faults"]) == changed, (target, line, body[:400], upstream[target][i][:400])


fault_specs = st.sampled_from(a2a_fault_types()).flatmap(
    lambda name: st.sampled_from(VARIANTS.get(name, [{}])).map(lambda params: {"type": name, **params}))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(faults=st.lists(fault_specs, min_size=1, max_size=2), probability=st.sampled_from([1.0, 0.5]),
       seed=st.integers(0, 1000), binding=st.sampled_from(BINDINGS), streaming=st.booleans())
def test_a_fault_is_logged_iff_the_agent_got_other_bytes(tapped_agent, make_proxy, faults, probability, seed,
                                                         binding, streaming):
    proxy = make_proxy({"rules": [{"name": f"r{i}", "probability": probability, "fault": fault}
                                  for i, fault in enumerate(faults)]}, to=tapped_agent.url, seed=seed)
    before = len(tapped_agent.replies())
    client, _ = asyncio.run(_send(proxy.url, *binding, streaming))
    assert client.replies, "the client asked nothing"
    assert_logged_iff_changed(proxy, tapped_agent, before, client)


@pytest.mark.parametrize("binding,version", BINDINGS)
@pytest.mark.parametrize("streaming", [False, True])
def test_flip_is_error_reports_a_completed_task_failed(tapped_agent, make_proxy, binding, version, streaming):
    """On A2A a result's isError is the task's outcome: the agent sees its delegated task fail (its answer
    still there), and the fault's line says so."""
    proxy = make_proxy({"rules": [{"name": "lie", "fault": {"type": "flip_is_error"}}]}, to=tapped_agent.url)
    before = len(tapped_agent.replies())
    client, responses = asyncio.run(_send(proxy.url, binding, version, streaming))
    task = final_task(responses)
    assert task.status.state == TaskState.TASK_STATE_FAILED
    assert any(part.text for artifact in task.artifacts for part in artifact.parts)
    lines = [line for line in proxy.events("fault") if line["fault"] == "flip_is_error"]
    assert lines and all(line["rule"] == "lie" for line in lines)
    assert_logged_iff_changed(proxy, tapped_agent, before, client)


@pytest.mark.parametrize("binding,version", [(JSONRPC, "1.0"), (REST, "0.3")])
def test_a_failed_task_passed_off_as_completed(tapped_agent, make_proxy, binding, version):
    """task_failed, then flip_is_error to_success: the task the agent gets completed, with the failure's text."""
    proxy = make_proxy({"rules": [{"name": "fail", "fault": {"type": "task_failed", "message": "quota exceeded"}},
                                  {"name": "lie", "fault": {"type": "flip_is_error", "direction": "to_success"}}]},
                       to=tapped_agent.url)
    _, responses = asyncio.run(_send(proxy.url, binding, version, False))
    task = final_task(responses)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert "quota exceeded" in " ".join(part.text for part in task.status.message.parts)
    assert {line["rule"] for line in proxy.events("fault")} == {"fail", "lie"}


@pytest.mark.parametrize("binding,version", BINDINGS)
def test_a_broken_frame_has_no_place_in_a_whole_reply(tapped_agent, make_proxy, binding, version):
    """malformed breaks a stream's event; a whole A2A reply has no frame of its own to break, so the fault
    does not fire there (before, it was logged while the reply went through as it came)."""
    proxy = make_proxy({"rules": [{"name": "break", "fault": {"type": "malformed", "variant": "truncated"}}]},
                       to=tapped_agent.url)
    client, responses = asyncio.run(_send(proxy.url, binding, version, False))
    assert final_task(responses).status.state == TaskState.TASK_STATE_COMPLETED
    assert not proxy.events("fault")
    assert not any(line["faults"] for line in call_lines(proxy, len(client.replies)))
