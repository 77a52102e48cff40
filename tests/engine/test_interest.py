"""The one answer to "could anything act here?" (`Engine.interest`): made anew for each scenario, its
cache of answers bounded and its own, and what every adapter and protocol relay asks."""

from __future__ import annotations

import io
from typing import Any

import orjson
import yaml

from chaosproxy.adapters.a2a_relay import A2aRelay
from chaosproxy.adapters.llm_relay import LlmRelay
from chaosproxy.engine.core import Engine
from chaosproxy.engine.interest import MAX_VERDICTS, Interest
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.log import PerturbationLog
from tests.helpers.framing_support import RawClient, read_request

DOWN = {"name": "down", "match": {"path": "/down"}, "fault": {"type": "http_error", "status": 503}}
TYPOS = {"name": "typos", "fault": {"type": "prompt_typos"}}


def scenario(*rules: dict[str, Any]):
    return parse_scenario(yaml.safe_dump({"rules": list(rules)}))


def engine_with(*rules: dict[str, Any]) -> Engine:
    return Engine(scenario(*rules), seed=1, log=PerturbationLog(io.BytesIO(), run_id="t", seed=1))


def get(path: str) -> Message:
    return Message("http", Phase.REQUEST, http_method="GET", path=path)


def test_a_kept_answer_is_given_again_for_heads_alike_and_an_unkeyed_one_is_not_kept():
    interest = engine_with(DOWN).interest
    assert interest.head_verdict("down") is None
    assert interest.could_act(get("/down"), "down") is True
    assert interest.could_act(get("/up"), "up") is False
    assert (interest.head_verdict("down"), interest.head_verdict("up")) == (True, False)
    interest.could_act(get("/other"))
    assert interest.head_verdict("/other") is None


def test_a_new_scenario_starts_with_no_kept_answers_and_its_own_derived_views():
    engine = engine_with()
    before = engine.interest
    assert before.idle and before.could_act(get("/down"), "down") is False
    engine.load(scenario(DOWN))
    assert engine.interest is not before and not engine.interest.idle
    assert engine.interest.head_verdict("down") is None  # the old scenario's "no" is not kept
    assert engine.interest.could_act(get("/down"), "down") is True
    assert before.head_verdict("down") is False  # (the old object is left as it was: no adapter wrote into it)


def test_the_kept_answers_are_bounded():
    interest = engine_with(DOWN).interest
    keys = [f"/path-{i}" for i in range(MAX_VERDICTS + 1)]
    for key in keys:
        interest.could_act(get(key), key)
    kept = [key for key in keys if interest.head_verdict(key) is not None]
    assert 0 < len(kept) <= MAX_VERDICTS and kept[-1] == keys[-1]


def test_a_protocols_derived_view_is_worked_out_once_per_scenario():
    engine = engine_with()
    relay, calls = LlmRelay(engine), []

    def build(interest: Interest) -> bool:
        calls.append(interest)
        return any(rule.fault.type == "prompt_typos" for rule in interest.rules)

    assert not relay.interest.prompt
    assert (engine.interest.derived(build), engine.interest.derived(build)) == (False, False)
    engine.load(scenario(TYPOS))
    assert relay.interest.prompt and engine.interest.derived(build) is True
    assert calls == [calls[0], engine.interest] and calls[0] is not engine.interest


def test_the_model_api_and_a2a_relays_judge_by_the_engines_interest():
    """An engine with no rule: neither relay opens an exchange (no body parsed); once a rule is in, both do."""
    from yarl import URL

    engine = engine_with()
    llm, a2a = LlmRelay(engine), A2aRelay(engine, "", URL("http://agent.invalid"))
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    send = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "message/send",
                         "params": {"message": {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}}})

    def request(path: str, payload: bytes) -> Message:
        return Message("http", Phase.REQUEST, http_method="POST", path=path, body=payload,
                       headers={"Content-Type": "application/json", "A2A-Version": "0.3"})

    assert llm.open(request("/v1/chat/completions", body)) is None
    assert a2a.open(request("/", send)) is None
    engine.load(scenario(TYPOS))
    assert llm.open(request("/v1/chat/completions", body)) is not None
    assert a2a.open(request("/", send)) is not None


def test_a_rule_on_replies_swapped_in_is_honoured_on_the_next_request_of_a_connection(make_proxy, scripted,
                                                                                      server_loop):
    """Through real sockets: a connection's requests take the plain path with no rule; once a rule on
    JSON-RPC replies is in force, the next reply on the same connection is read and changed."""
    reply = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "ok"}]}})

    async def script(reader, writer):
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                         % (len(reply), reply))
            await writer.drain()

    proxy = make_proxy(to=scripted(script).url)
    call = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {}}})
    post = b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(call), call)
    with RawClient(proxy.url) as client:
        for _ in range(2):
            client.send(post)
            assert client.response("POST")[2] == reply

        async def swap() -> None:
            proxy.engine.load(scenario({"name": "err", "fault": {"type": "error_in_success"}}))

        server_loop.run(swap())
        client.send(post)
        changed = orjson.loads(client.response("POST")[2])
    assert changed != orjson.loads(reply) and changed["id"] == 1
    assert [call["faults"] for call in proxy.events("call")] == [[], [], ["err"]]
