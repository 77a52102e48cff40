"""Record and replay over real sockets: the proxy records what its upstream (the bundled REST tool server)
receives and sends, secrets out; the replay server answers the same requests with the same bytes, keeps
or drops the recorded timing, and names the closest recorded request for one it does not hold."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from chaosproxy.cassette.format import CASSETTE_FILE, CassetteError, read_folder
from chaosproxy.cassette.match import Index, request_key
from chaosproxy.cassette.redact import Redactor
from chaosproxy.cassette.vcr import read_vcr, write_vcr
from tests.helpers.cassette_support import proxy_to, replaying

SECRET_TOKEN = "Bearer sk-live-4f9a8b7c6d5e"
SECRET_KEY = "key-0123456789abcdef"


def session(base: str) -> list[tuple[int, bytes]]:
    """What the agent does against the tool server: a search carrying credentials, a GET, an echo."""
    with httpx.Client(base_url=base, timeout=10) as client:
        answers = [client.post("/api/search", json={"query": "paris", "api_key": SECRET_KEY},
                               headers={"Authorization": SECRET_TOKEN, "Cookie": "sid=s3cr3t"}),
                   client.get("/api/weather", params={"city": "Tokyo", "api_key": SECRET_KEY}),
                   client.put("/echo/notes", content=b"some \xff bytes", headers={"X-Api-Key": SECRET_KEY})]
    return [(answer.status_code, answer.content) for answer in answers]


@pytest.fixture
def recorded(server_loop, upstream, tmp_path) -> tuple[Path, list[tuple[int, bytes]]]:
    folder = tmp_path / "cassette"
    with proxy_to(server_loop, upstream, tmp_path / "log.jsonl", record=folder) as proxy:
        answers = session(proxy.url)
    return folder, answers


def test_recording_keeps_every_exchange_as_the_upstream_saw_it_and_no_secret(recorded):
    folder, answers = recorded
    text = (folder / CASSETTE_FILE).read_text()
    for secret in (SECRET_TOKEN, "sk-live", SECRET_KEY, "s3cr3t"):
        assert secret not in text
    cassette = read_folder(folder)
    assert [(e.request.method, e.request.target.split("?")[0], e.response.status) for e in cassette.exchanges] == \
        [("POST", "/api/search", 200), ("GET", "/api/weather", 200), ("PUT", "/echo/notes", 200)]
    search, weather, echo = cassette.exchanges
    assert search.request.header("authorization") == "REDACTED" and search.request.header("cookie") == "REDACTED"
    assert json.loads(search.request.body) == {"query": "paris", "api_key": "REDACTED"}
    assert weather.request.target == "/api/weather?city=Tokyo&api_key=REDACTED"
    assert echo.request.body == b"some \xff bytes" and echo.request.header("x-api-key") == "REDACTED"
    assert [e.response.body for e in cassette.exchanges] == [body for _, body in answers]
    assert set(search.redacted) == {"request.header:authorization", "request.header:cookie", "request.body:api_key"}
    assert cassette.header["redacted"]["request.body:api_key"] == 1
    assert cassette.header["exchanges"] == 3 and cassette.header["unanswered"] == 0
    assert search.request.header("host") and 0 < search.response.t_head <= search.response.t_end


def test_recording_changes_nothing_the_agent_receives(server_loop, upstream, tmp_path):
    with proxy_to(server_loop, upstream, tmp_path / "a.jsonl") as plain:
        unrecorded = session(plain.url)
    with proxy_to(server_loop, upstream, tmp_path / "b.jsonl", record=tmp_path / "c") as recording:
        assert session(recording.url) == unrecorded


def test_replay_answers_the_same_requests_with_the_same_bytes(server_loop, recorded):
    folder, answers = recorded
    with replaying(server_loop, folder) as server:
        assert session(server.url) == answers
        assert server.replay.unmatched == []


def test_a_request_the_cassette_lacks_gets_an_error_naming_the_closest_recorded(server_loop, recorded):
    folder, _ = recorded
    with replaying(server_loop, folder) as server:
        answer = httpx.post(server.url + "/api/search", json={"query": "pariss", "api_key": "other"}, timeout=10)
        rpc = httpx.post(server.url + "/api/search", json={"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                                                           "params": {"name": "nope"}}, timeout=10)
    assert answer.status_code == 404 and answer.headers["x-chaosproxy-error"] == "replay-no-match"
    message = answer.json()["error"]["message"]
    assert 'POST /api/search {"api_key":"REDACTED","query":"pariss"}' in message
    assert 'the closest recorded: POST /api/search {"api_key":"REDACTED","query":"paris"}' in message
    assert rpc.status_code == 200 and rpc.json()["id"] == 9 and "tools/call" in rpc.json()["error"]["message"]
    assert len(server.replay.unmatched) == 2


@pytest.mark.slow
def test_streams_keep_the_recorded_timing_or_drop_it(server_loop, upstream, tmp_path):
    folder = tmp_path / "stream"
    with proxy_to(server_loop, upstream, tmp_path / "log.jsonl", record=folder) as proxy:
        live = httpx.get(proxy.url + "/sse?n=5&interval_ms=60", timeout=10).content
    events = read_folder(folder).exchanges[0].response.events
    assert [e.data for e in events] == [e + b"\n\n" for e in live.split(b"\n\n") if e]
    assert events[-1].t - events[0].t >= 0.2  # four intervals of 60 ms, as recorded

    def timed(speed):
        with replaying(server_loop, folder, speed=speed) as server:
            started = time.monotonic()
            body = httpx.get(server.url + "/sse?n=5&interval_ms=60", timeout=10).content
            return body, time.monotonic() - started

    (slow, slow_s), (fast, fast_s) = timed(0.5), timed(None)
    assert slow == fast == live
    assert slow_s >= 0.4  # the recorded 0.24 s, at half speed
    assert fast_s < slow_s / 2


def test_a_bad_cassette_is_refused_with_its_file_line_and_reason(recorded):
    folder, _ = recorded
    path = folder / CASSETTE_FILE
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1], "{not json", *lines[2:]]) + "\n")
    with pytest.raises(CassetteError, match=rf"{path}:3: not JSON"):
        read_folder(folder)
    record = orjson.loads(lines[1])
    del record["request"]["method"]
    path.write_text("\n".join([lines[0], orjson.dumps(record).decode()]) + "\n")
    with pytest.raises(CassetteError, match=rf"{path}:2: missing 'method'"):
        read_folder(folder)
    path.write_text('{"chaosproxy_cassette": 99, "kind": "http"}\n')
    with pytest.raises(CassetteError, match=r":1: cassette format 99"):
        read_folder(folder)


def test_the_command_line_refuses_a_folder_that_holds_a_cassette_already(recorded, upstream):
    folder, _ = recorded
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream, "--listen",
                           "127.0.0.1:0", "--record", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "a cassette is there already" in done.stderr


def test_volatile_parts_do_not_count_in_matching():
    redactor = Redactor()

    def key(body, target="/mcp"):
        return request_key("POST", target, orjson.dumps(body), redactor)

    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "convert", "arguments": {"at": "2026-12-01T10:00:00Z"},
                       "_meta": {"progressToken": 3, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}}}
    again = {**call, "id": 41, "params": {**call["params"], "arguments": {"at": "2027-01-05T08:30:00+02:00"},
                                          "_meta": {"progressToken": 41}}}
    assert key(call) == key(again)
    assert key(call) != key({**call, "params": {**call["params"], "name": "other"}})
    assert key(call, "/messages?sessionId=abc") == key(again, "/messages?sessionId=def")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2, "user": "u1"}
    assert key(chat, "/v1/chat/completions") == key({**chat, "temperature": 0.9, "user": "u2"}, "/v1/chat/completions")
    assert key(chat, "/v1/chat/completions") != key({**chat, "messages": []}, "/v1/chat/completions")


def test_a_key_recorded_twice_is_answered_in_order_per_session_then_repeats():
    redactor = Redactor()
    key = request_key("GET", "/time", b"", redactor)
    index = Index([(key, "first"), (key, "second")])
    assert [index.take(key, "a") for _ in range(3)] == ["first", "second", "second"]
    assert index.take(key, "b") == "first"


def test_vcr_cassettes_are_read_and_written(recorded, tmp_path):
    folder, answers = recorded
    path = tmp_path / "exported.yaml"
    lost = write_vcr(read_folder(folder), path)
    assert any("timing" in what for what in lost) and any("redacted" in what for what in lost)
    imported = read_vcr(path)
    assert [e.response.body for e in imported.exchanges] == [body for _, body in answers]
    assert imported.exchanges[1].request.target == "/api/weather?city=Tokyo&api_key=REDACTED"


def test_a_body_over_the_limit_is_kept_up_to_it_and_the_replay_cuts_there(server_loop, upstream, tmp_path,
                                                                          monkeypatch):
    from chaosproxy.cassette import recorder

    monkeypatch.setattr(recorder, "MAX_BODY", 100_000)
    folder = tmp_path / "big"
    with proxy_to(server_loop, upstream, tmp_path / "log.jsonl", record=folder) as proxy:
        whole = httpx.get(proxy.url + "/big?bytes=300000", timeout=10).content
    assert len(whole) == 300_000  # the agent got it all; the cassette keeps what it may
    (exchange,) = read_folder(folder).exchanges
    assert exchange.response.body == whole[:100_000] and exchange.response.end == "cut"
    assert (folder / "bodies").is_dir()
    with replaying(server_loop, folder) as server, pytest.raises(httpx.HTTPError):
        httpx.get(server.url + "/big?bytes=300000", timeout=10).read()
