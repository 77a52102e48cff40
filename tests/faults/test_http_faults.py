"""Every transport/HTTP fault, observed from a real HTTP client through a real proxy."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.helpers.support import call_lines, rule

TIMEOUT = aiohttp.ClientTimeout(total=10)


async def fetch(url: str, method: str = "GET", **kwargs) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client, client.request(method, url, **kwargs) as response:
        return response.status, dict(response.headers), await response.read()


async def elapsed(url: str) -> float:
    started = time.perf_counter()
    status, _, _ = await fetch(url)
    assert status == 200
    return time.perf_counter() - started


async def test_latency_delays_the_request(make_proxy):
    proxy = make_proxy(rule("slow", {"type": "latency", "delay_ms": 300}, match={"path": "/api/weather"}))
    assert await elapsed(proxy.url + "/api/weather") >= 0.29
    assert await elapsed(proxy.url + "/health") < 0.25  # other paths are not delayed
    [fault] = proxy.events("fault")
    assert fault["effect"]["seconds"] == pytest.approx(0.3)


@pytest.mark.parametrize("distribution,extra", [
    ("uniform", {"max_ms": 400}), ("normal", {"jitter_ms": 50}), ("lognormal", {}), ("pareto", {"max_ms": 5000}),
])
@pytest.mark.slow
async def test_latency_distributions_stay_in_range(make_proxy, distribution, extra):
    proxy = make_proxy(rule("slow", {"type": "latency", "delay_ms": 200, "distribution": distribution, **extra}))
    took = [await elapsed(proxy.url + "/health") for _ in range(3)]
    drawn = [e["effect"]["seconds"] for e in proxy.events("fault")]
    assert len(drawn) == 3 and len(set(drawn)) == 3  # a fresh draw per request
    for seconds, delay in zip(took, drawn, strict=True):
        assert seconds >= delay - 0.01
    if distribution in ("uniform", "pareto"):
        assert all(0.2 <= d <= extra["max_ms"] / 1000 for d in drawn)


async def test_latency_on_response(make_proxy):
    proxy = make_proxy(rule("slow-reply", {"type": "latency", "delay_ms": 250, "phase": "response"}))
    assert await elapsed(proxy.url + "/health") >= 0.24
    assert proxy.events("fault")[0]["phase"] == "response"


@pytest.mark.slow
async def test_hang_is_seen_as_a_client_timeout(make_proxy):
    proxy = make_proxy(rule("stuck", {"type": "hang"}, match={"path": "/api/*"}))
    async with aiohttp.ClientSession() as client:
        with pytest.raises(asyncio.TimeoutError):
            async with client.get(proxy.url + "/api/weather", timeout=aiohttp.ClientTimeout(total=0.5)):
                pass
        async with client.get(proxy.url + "/health") as response:  # the proxy keeps serving
            assert response.status == 200
    assert [e["fault"] for e in proxy.events("fault")] == ["hang"]


async def test_hang_with_release_forwards_late(make_proxy):
    proxy = make_proxy(rule("stall", {"type": "hang", "release_after_ms": 300}))
    assert await elapsed(proxy.url + "/api/weather?city=oslo") >= 0.29


async def test_http_error_answers_without_calling_upstream(make_proxy):
    proxy = make_proxy(rule("down", {"type": "http_error", "status": 503, "body": "maintenance",
                                     "headers": {"X-Reason": "drill"}}, match={"http_method": "post"}))
    status, headers, body = await fetch(proxy.url + "/echo/x", "POST", data=b"hi")
    assert (status, body, headers["X-Reason"]) == (503, b"maintenance", "drill")
    assert "X-Echo-Method" not in headers  # upstream never saw it
    status, _, _ = await fetch(proxy.url + "/echo/x")
    assert status == 200


async def test_http_error_default_body_is_json(make_proxy):
    proxy = make_proxy(rule("boom", {"type": "http_error", "status": 502}))
    status, headers, body = await fetch(proxy.url + "/health")
    assert status == 502 and headers["Content-Type"] == "application/json"
    assert b"Bad Gateway" in body


async def test_rate_limit_always(make_proxy):
    proxy = make_proxy(rule("throttled", {"type": "rate_limit", "retry_after_s": 7}))
    status, headers, _ = await fetch(proxy.url + "/health")
    assert (status, headers["Retry-After"]) == (429, "7")


@pytest.mark.slow
async def test_rate_limit_token_bucket_lets_the_rate_through(make_proxy):
    proxy = make_proxy(rule("bucket", {"type": "rate_limit", "rate_per_s": 2, "burst": 2}))
    statuses = [(await fetch(proxy.url + "/health"))[0] for _ in range(4)]
    assert statuses[:2] == [200, 200] and statuses[2:] == [429, 429]
    await asyncio.sleep(0.6)  # one token back at 2/s
    assert (await fetch(proxy.url + "/health"))[0] == 200
    assert len(proxy.events("fault")) == 2  # a request the bucket let through is no fault


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_error(make_proxy, status):
    proxy = make_proxy(rule("expired", {"type": "auth_error", "status": status}))
    got, headers, _ = await fetch(proxy.url + "/health")
    assert got == status
    assert headers["WWW-Authenticate"].startswith('Bearer error="invalid_token"')


async def test_reset_before_response(make_proxy):
    proxy = make_proxy(rule("crash", {"type": "reset"}, match={"path": "/api/*"}))
    with pytest.raises(aiohttp.ClientError):
        await fetch(proxy.url + "/api/weather")
    assert (await fetch(proxy.url + "/health"))[0] == 200


async def test_reset_mid_body(make_proxy):
    proxy = make_proxy(rule("crash-late", {"type": "reset", "after_bytes": 5000}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(proxy.url + "/big?bytes=200000") as response:
            assert response.status == 200
            received = 0
            with pytest.raises(aiohttp.ClientError):
                async for chunk in response.content.iter_any():
                    received += len(chunk)
    assert received <= 5000


@pytest.mark.parametrize("params,expected", [({"bytes": 1000}, 1000), ({"fraction": 0.25}, 25000)])
async def test_truncate_closes_after_the_limit(make_proxy, params, expected):
    proxy = make_proxy(rule("cut", {"type": "truncate", **params}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(proxy.url + "/big?bytes=100000") as response:
            assert response.headers["Content-Length"] == "100000"  # the promise the body then breaks
            body = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in response.content.iter_any():
                    body += chunk
    assert len(body) == expected


@pytest.mark.parametrize("params", [{"bytes": 11}, {"bytes": 500}, {"fraction": 0.0}], ids=["at-end", "past", "none"])
async def test_a_truncate_that_would_cut_nothing_does_not_fire(make_proxy, params):
    """A body of known length no longer than the cut reaches the agent whole: no fault line, outcome ok
    (a fraction of 0 of an empty body too); a cut within it fires and says so."""
    proxy = make_proxy(rule("cut", {"type": "truncate", **params}, match={"path": "/echo"}))
    body = b"" if "fraction" in params else b"hello world"
    status, _, got = await fetch(proxy.url + "/echo", "POST", data=body)
    assert (status, got) == (200, body)
    [call] = call_lines(proxy, 1)
    assert (call["outcome"], call.get("faults", [])) == ("ok", []) and proxy.events("fault") == []


async def test_truncate_fraction_of_a_chunked_body(make_proxy):
    proxy = make_proxy(rule("cut", {"type": "truncate", "fraction": 0.5}, match={"path": "/sse"}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        async with client.get(proxy.url + "/sse?n=4&interval_ms=1") as response:
            body = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in response.content.iter_any():
                    body += chunk
    direct_length = 4 * len(b'id: 0\nevent: tick\ndata: {"n": 0}\n\n')
    assert len(body) == direct_length // 2


async def test_slow_body_drips(make_proxy):
    proxy = make_proxy(rule("drip", {"type": "slow_body", "chunk_bytes": 10, "delay_ms": 40}))
    started = time.perf_counter()
    status, _, body = await fetch(proxy.url + "/api/weather?city=oslo")
    took = time.perf_counter() - started
    assert status == 200 and body.startswith(b'{"city": "oslo"')
    assert took >= (len(body) // 10 - 1) * 0.04 * 0.9


async def test_stream_cut_after_events(make_proxy):
    proxy = make_proxy(rule("cut", {"type": "stream_cut", "after_events": 2}, match={"path": "/sse"}))
    status, _, body = await fetch(proxy.url + "/sse?n=6&interval_ms=10")
    assert status == 200
    assert body.count(b"event: tick") == 2 and body.endswith(b"\n\n")


@pytest.mark.slow
async def test_stream_cut_idle_starves_the_client(make_proxy):
    proxy = make_proxy(rule("starve", {"type": "stream_cut", "after_events": 1, "then": "idle"}))
    events = []
    async with aiohttp.ClientSession() as client:
        with pytest.raises(asyncio.TimeoutError):
            async with client.get(proxy.url + "/sse?n=5&interval_ms=10",
                                  timeout=aiohttp.ClientTimeout(total=None, sock_read=2)) as response:
                async for line in response.content:
                    events.append(line)
    assert b"event: tick\n" in events and events.count(b"event: tick\n") == 1


@pytest.mark.parametrize("then", ["close", "idle"])
async def test_a_stream_shorter_than_its_cut_ends_as_upstream_ends_it(make_proxy, then):
    """A cut after more events than the stream has changes nothing: the agent gets the whole stream, ended
    as upstream ends it (not held open), and the call line says ok."""
    proxy = make_proxy(rule("late", {"type": "stream_cut", "after_events": 50, "then": then}), log_batch_s=0)
    direct_events = 5
    async with aiohttp.ClientSession() as client:
        async with client.get(proxy.url + f"/sse?n={direct_events}&interval_ms=5",
                              timeout=aiohttp.ClientTimeout(total=10)) as response:
            body = await response.read()
    assert body.count(b"event: tick\n") == direct_events
    [call] = call_lines(proxy, 1)
    assert call["outcome"] == "ok"


async def test_stream_cut_ignores_plain_responses(make_proxy):
    proxy = make_proxy(rule("cut", {"type": "stream_cut", "after_events": 0}))
    status, _, body = await fetch(proxy.url + "/health")
    assert (status, body) == (200, b"ok")
    assert proxy.events("fault") == []


async def test_a_tool_rule_in_front_of_a_rest_api_says_once_that_it_cannot_match(make_proxy):
    proxy = make_proxy(rule("mcp-only", {"type": "http_error", "status": 503}, match={"tool": "search"}))
    for _ in range(3):
        status, _, _ = await fetch(proxy.url + "/api/search", "POST", json={"query": "x"})
        assert status == 200  # never fires on REST
    [skip] = proxy.events("skip")
    assert skip["rule"] == "mcp-only" and "JSON-RPC" in skip["reason"] and skip["path"] == "/api/search"
    assert proxy.events("fault") == []
