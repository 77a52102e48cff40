"""Invariant 1: with no rule firing, the proxy is byte-for-byte transparent (hypothesis, real sockets)."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosproxy.adapters.http.heads import HOP_BY_HOP

# A rule that never fires keeps the engine's matching path hot while staying transparent.
IDLE = {"rules": [{"name": "never", "match": {"path": "/nowhere"}, "fault": {"type": "http_error"}}]}

methods = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PURGE", "REPORT"])
path_chars = st.sampled_from("abcXYZ019-._~!$&'()*+,;=:@%/")
segments = st.text(path_chars, min_size=0, max_size=30).map(lambda s: s.replace("%", "%25"))
queries = st.one_of(st.just(""), st.just("?"),
                    st.text(st.sampled_from("abc=&%20+-/?"), min_size=1, max_size=20).map(lambda q: "?" + q))
header_names = st.from_regex(r"\AX-[A-Za-z0-9-]{1,20}\Z").filter(lambda n: n.lower() not in HOP_BY_HOP)
header_values = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)
headers = st.dictionaries(header_names, header_values, max_size=5)
statuses = st.sampled_from([200, 201, 202, 204, 301, 400, 404, 409, 429, 500, 503])


@pytest.fixture
def idle_proxy(make_proxy):
    return make_proxy(IDLE)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=methods, segment=segments, query=queries, sent_headers=headers,
       body=st.binary(max_size=4096), status=statuses)
def test_idle_proxy_is_byte_transparent(idle_proxy, upstream, method, segment, query, sent_headers, body, status):
    path = "/echo/" + segment + query
    if status == 204:
        body = b""

    def call(base: str) -> tuple[int, bytes, dict[str, str], list[list[str]]]:
        conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=10)
        try:
            conn.request(method, path, body=body, headers={**sent_headers, "X-Echo-Status": str(status)})
            response = conn.getresponse()
            payload = response.read()
            echoed = json.loads(response.getheader("X-Echo-Headers", "[]"))
            return response.status, payload, {k.lower(): v for k, v in response.getheaders()}, echoed
        finally:
            conn.close()

    direct, proxied = call(upstream), call(idle_proxy.url)
    assert proxied[0] == direct[0] == status
    assert proxied[1] == direct[1] == (body if status not in (204,) else b"")
    assert proxied[2]["x-echo-method"] == method and proxied[2]["x-echo-path"] == path
    # The agent's headers reach upstream unchanged (names compare case-insensitively, as HTTP says),
    # repeated names included; only Host names the upstream instead of the proxy.
    def received(echoed: list[list[str]]) -> list[tuple[str, str]]:
        return sorted((name.lower(), value) for name, value in echoed if name.lower() != "host")
    assert received(proxied[3]) == received(direct[3])
    for name, value in sent_headers.items():
        assert (name.lower(), value) in received(proxied[3])
    # The reply's headers come back unchanged, but for the per-connection ones (and the echo of the
    # request headers, which differ in Host and Connection by design).
    per_connection = {"date", "connection", "keep-alive", "x-echo-headers"}
    assert {k: v for k, v in proxied[2].items() if k not in per_connection} == \
        {k: v for k, v in direct[2].items() if k not in per_connection}


def test_large_streamed_bodies_pass_unchanged(idle_proxy, upstream):
    body = bytes(range(256)) * 12000  # ~3 MiB, above the read-whole threshold
    for base in (upstream, idle_proxy.url):
        conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=20)
        conn.request("PUT", "/echo/big", body=body)
        response = conn.getresponse()
        assert response.status == 200 and response.read() == body
        conn.close()


# Raw requests: repeated header names in odd casings, %2F and a bare "?" in the target, and bodies sent
# chunked with extensions and trailers, as http.client would never write them.
raw_names = st.sampled_from(["X-Rep", "x-rep", "X-REP", "x-MiXeD-case", "X-Other", "Accept", "accept"])
raw_headers = st.lists(st.tuples(raw_names, header_values), max_size=8)
raw_targets = st.tuples(segments, st.sampled_from(["", "%2F", "a%2Fb", "%2f%2F"]),
                        st.sampled_from(["", "?", "?a=%2F", "?x&y=", "??"])).map(lambda t: "/echo/" + "".join(t))
chunk_splits = st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=6)
extensions = st.sampled_from(["", ";ext", ";name=value", ';q="quoted"'])
trailers = st.lists(st.tuples(st.sampled_from(["X-Checksum", "x-trailer"]), header_values), max_size=2)
# what httpx and undici write about their connection: hop-by-hop, so never sent on; the rest as written
keep_alive_lines = st.sampled_from(["", "Connection: keep-alive\r\n",
                                    "keep-alive: timeout=5\r\nConnection: Keep-Alive\r\n"])


def _chunked(body: bytes, splits: list[int], extension: str, trailer: list[tuple[str, str]]) -> bytes:
    out, at = b"", 0
    for size in splits:
        piece = body[at:at + size]
        if not piece:
            break
        out += b"%x%b\r\n%b\r\n" % (len(piece), extension.encode(), piece)
        at += size
    if at < len(body):
        out += b"%x\r\n%b\r\n" % (len(body) - at, body[at:])
    return out + b"0\r\n" + b"".join(f"{n}: {v}\r\n".encode() for n, v in trailer) + b"\r\n"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]), target=raw_targets, sent=raw_headers,
       body=st.binary(max_size=2048), chunked=st.booleans(), splits=chunk_splits, extension=extensions,
       trailer=trailers, keep_alive=keep_alive_lines)
def test_raw_requests_pass_byte_transparent(idle_proxy, upstream, method, target, sent, body, chunked, splits,
                                            extension, trailer, keep_alive):
    from tests.helpers.framing_support import RawClient

    head = f"{method} {target} HTTP/1.1\r\nHost: agent\r\n{keep_alive}" + "".join(f"{n}: {v}\r\n" for n, v in sent)
    if chunked:
        request = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + _chunked(body, splits, extension, trailer)
    else:
        request = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    def call(base: str) -> tuple[int, bytes, dict[str, str], list[list[str]]]:
        with RawClient(base) as client:
            client.send(request)
            status, headers, payload = client.response(method)
        return status, payload, {k.lower(): v for k, v in headers.items()}, json.loads(headers["X-Echo-Headers"])

    direct, proxied = call(upstream), call(idle_proxy.url)
    assert proxied[0] == direct[0] == 200 and proxied[1] == direct[1] == body
    assert proxied[2]["x-echo-path"] == direct[2]["x-echo-path"] == target  # not one byte of the target lost
    # every header reaches upstream with its spelling, repeats and order; only Host names the upstream,
    # and the keep-alive lines (about the agent's connection) stay behind
    assert [h for h in proxied[3] if h[0].lower() != "host"] == \
        [h for h in direct[3] if h[0].lower() not in ("host", "connection", "keep-alive")]
