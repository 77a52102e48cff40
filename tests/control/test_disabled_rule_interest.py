"""A disabled rule changes no byte and costs nothing (DESIGN invariant 10): while the only rule on replies is
disabled, the upstream gets the agent's own Accept-Encoding, not a request for a plain body the proxy would read
for nothing; enabled through the control API, the rule counts from the next request on. Real sockets: an
upstream that records what it is sent, the proxy, its control API."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from chaosproxy.client import ControlClient
from chaosproxy.control.api import ControlServer
from chaosproxy.demo.serving import serve
from tests.helpers.support import ServerLoop

# A rule on requests that never fires: it has requests inspected, but acts on no reply.
NEVER = {"name": "never", "fault": {"type": "http_error", "status": 503}, "probability": 0}
READER = {"name": "reader", "fault": {"type": "typos", "rate": 0.5}, "enabled": False}  # reads replies when enabled


@pytest.fixture
def recording_upstream(server_loop: ServerLoop) -> Iterator[tuple[str, list[str | None]]]:
    """A REST tool that answers every request alike and keeps each request's Accept-Encoding."""
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Accept-Encoding"))
        return web.json_response({"city": "Paris", "forecast": "sunny and mild all afternoon"})

    app = web.Application()
    app.router.add_get("/api/weather", answer)
    runner, port = server_loop.run(serve(app))
    yield f"http://127.0.0.1:{port}", seen
    server_loop.run(runner.cleanup())


def ask(proxy_url: str) -> int:
    conn = http.client.HTTPConnection(proxy_url.removeprefix("http://"), timeout=10)
    try:
        conn.request("GET", "/api/weather?city=paris", headers={"Accept-Encoding": "gzip, br"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize("rules", [[READER], [NEVER, READER]], ids=["alone", "beside a rule on requests"])
def test_a_disabled_rule_leaves_the_agents_accept_encoding_until_enabled(
        make_proxy: Any, server_loop: ServerLoop, recording_upstream: tuple[str, list[str | None]],
        rules: list[dict[str, Any]]) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy({"rules": rules}, to=upstream)
    server = ControlServer(proxy.engine, token=None)
    port = server_loop.run(server.start("127.0.0.1", 0))
    try:
        control = ControlClient(f"http://127.0.0.1:{port}")
        assert [ask(proxy.url) for _ in range(2)] == [200, 200]
        assert seen == ["gzip, br"] * 2
        control.patch_rule("reader", enabled=True)
        assert ask(proxy.url) == 200
        assert seen[-1] == "identity"  # the rule reads the reply now: asked for it plain
        control.patch_rule("reader", enabled=False)
        assert ask(proxy.url) == 200
        assert seen[-1] == "gzip, br"
    finally:
        server_loop.run(server.stop())
