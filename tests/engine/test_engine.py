"""Gates, counters and seeded decisions, straight against the engine (no sockets needed here)."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
import yaml

from chaosproxy.engine.core import Engine
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.faults.base import Fault
from chaosproxy.telemetry.log import PerturbationLog


def engine_for(rules: list[dict[str, Any]], seed: int = 1) -> tuple[Engine, io.BytesIO]:
    sink = io.BytesIO()
    log = PerturbationLog(sink, run_id="t", seed=seed)
    return Engine(parse_scenario(yaml.safe_dump({"rules": rules})), seed=seed, log=log), sink


def pattern(engine: Engine, count: int, session: str = "s", **fields: Any) -> str:
    """'x' where a fault fired on the i-th message, '.' where it did not."""
    return "".join(
        "x" if engine.decide(Message("http", Phase.REQUEST, session=session, **fields)) else "."
        for _ in range(count)
    )


ERROR = {"type": "http_error", "status": 500}


@pytest.mark.parametrize("gates,expected", [
    ({}, "xxxxxxxx"),
    ({"after": 2}, "..xxxxxx"),
    ({"first": 3}, "xxx....."),
    ({"every": 3}, "..x..x.."),
    ({"after": 2, "first": 3}, "..xxx..."),
    ({"after": 1, "every": 2, "first": 2}, "..x.x..."),
])
def test_gates_give_exact_sequences(gates, expected):
    engine, _ = engine_for([{"name": "r", "fault": ERROR, **gates}])
    assert pattern(engine, 8) == expected


def test_counters_are_per_session_by_default_and_global_on_request():
    engine, _ = engine_for([{"name": "r", "fault": ERROR, "first": 1}])
    assert pattern(engine, 2, session="a") + pattern(engine, 2, session="b") == "x.x."
    engine, _ = engine_for([{"name": "r", "fault": ERROR, "first": 1, "scope": "global"}])
    assert pattern(engine, 2, session="a") + pattern(engine, 2, session="b") == "x..."


def test_probability_lands_within_statistical_bounds():
    engine, _ = engine_for([{"name": "r", "fault": ERROR, "probability": 0.3}])
    fired = pattern(engine, 2000).count("x")
    sigma = math.sqrt(2000 * 0.3 * 0.7)  # ~20.5
    assert abs(fired - 600) < 4 * sigma


def test_same_seed_same_decisions_other_seed_others():
    rules = [{"name": "r", "fault": {"type": "latency", "delay_ms": 100, "jitter_ms": 50}, "probability": 0.5}]

    def run(seed: int) -> list[tuple[int, float]]:
        engine, _ = engine_for(rules, seed)
        out = []
        for i in range(200):
            for fired in engine.decide(Message("http", Phase.REQUEST, session="s")):
                out.append((i, fired.action.seconds))
        return out

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_decisions_do_not_depend_on_interleaving_of_sessions():
    rules = [{"name": "r", "fault": ERROR, "probability": 0.5}]
    one, _ = engine_for(rules)
    two, _ = engine_for(rules)
    a_then_b = pattern(one, 50, session="a") + pattern(one, 50, session="b")
    interleaved = {"a": "", "b": ""}
    for _ in range(50):  # sessions start in the same order (a, then b), then interleave
        for session in ("a", "b"):
            interleaved[session] += pattern(two, 1, session=session)
    assert a_then_b == interleaved["a"] + interleaved["b"]


def test_decisions_do_not_depend_on_random_session_ids():
    """Mcp-Session-Id values differ from run to run; sessions are told apart by order of appearance."""
    rules = [{"name": "r", "fault": ERROR, "probability": 0.5}]
    one, _ = engine_for(rules)
    two, _ = engine_for(rules)
    assert pattern(one, 50, session="3f2a-run-one") == pattern(two, 50, session="91cc-run-two")


def test_window_limits_firing_to_a_time_span():
    engine, _ = engine_for([{"name": "r", "fault": ERROR, "window": {"start_s": 60}}])
    assert pattern(engine, 3) == "..."
    engine.started -= 61
    assert pattern(engine, 3) == "xxx"
    engine, _ = engine_for([{"name": "r", "fault": ERROR, "window": {"start_s": 0, "duration_s": 5}}])
    assert pattern(engine, 1) == "x"
    engine.started -= 6
    assert pattern(engine, 1) == "."


def test_match_keys_must_all_match():
    engine, _ = engine_for([{"name": "r", "fault": ERROR,
                             "match": {"http_method": "post", "path": "/api/*", "header": {"x-env": "stag*"}}}])
    hit = {"http_method": "POST", "path": "/api/search", "headers": {"x-env": "staging"}}
    assert pattern(engine, 1, **hit) == "x"
    assert pattern(engine, 1, **(hit | {"http_method": "GET"})) == "."
    assert pattern(engine, 1, **(hit | {"path": "/health"})) == "."
    assert pattern(engine, 1, **(hit | {"headers": {"x-env": "prod"}})) == "."


def test_json_rpc_method_and_tool_are_matched_from_the_body():
    engine, _ = engine_for([{"name": "r", "fault": ERROR, "match": {"method": "tools/call", "tool": "search*"}}])
    assert engine.interest.request_bodies
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "search_web", "arguments": {}}}
    assert pattern(engine, 1, body=json.dumps(call).encode()) == "x"
    call["params"]["name"] = "weather"
    assert pattern(engine, 1, body=json.dumps(call).encode()) == "."
    assert pattern(engine, 1, body=b"not json") == "."


def test_a_final_action_stops_later_rules():
    engine, sink = engine_for([{"name": "first", "fault": ERROR}, {"name": "second", "fault": ERROR}])
    fired = engine.decide(Message("http", Phase.REQUEST))
    assert [f.rule.name for f in fired] == ["first"]
    assert sink.getvalue().count(b'"event":"fault"') == 1


def test_a_broken_fault_fails_open(monkeypatch):
    engine, sink = engine_for([{"name": "broken", "fault": ERROR},
                               {"name": "ok", "fault": {"type": "latency", "delay_ms": 1}}])

    def explode(self: Fault, ctx: Any) -> None:
        raise RuntimeError("bug in a fault")

    monkeypatch.setattr(type(engine.scenario.rules[0].fault), "act", explode)
    fired = engine.decide(Message("http", Phase.REQUEST))
    assert [f.rule.name for f in fired] == ["ok"]
    assert b'"event":"error"' in sink.getvalue() and b"bug in a fault" in sink.getvalue()


def test_every_fired_fault_is_logged_once_with_its_fields():
    engine, sink = engine_for([{"name": "slow", "fault": {"type": "latency", "delay_ms": 5}, "every": 2}])
    pattern(engine, 6, http_method="GET", path="/x")
    lines = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert {"ts", "run_id", "seed", "rule", "fault", "component", "level", "transport", "session",
                "http_method", "path", "method", "tool", "rpc_id", "params"} <= line.keys()
        assert (line["event"], line["rule"], line["component"], line["level"]) == \
            ("fault", "slow", "transition", "transport")
    assert [line["match_index"] for line in lines] == [2, 4, 6]


def _request(body: bytes | None) -> Message:
    return Message("http", Phase.REQUEST, session="s", http_method="POST", path="/mcp", body=body)


CALL = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","arguments":{}}}'
LIST = b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}'
READ = b'{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"file:///a"}}'


@pytest.mark.parametrize("fault,body,could", [
    ({"type": "latency", "delay_ms": 1}, CALL, False),  # no rule on responses
    ({"type": "rename_tool", "tool": "add", "to": "plus"}, CALL, False),  # it changes tool lists only
    ({"type": "rename_tool", "tool": "add", "to": "plus"}, LIST, True),
    ({"type": "rename_tool", "tool": "add", "to": "plus"}, b'{"query": "rest"}', True),  # not JSON-RPC
    ({"type": "error_in_success"}, CALL, True),  # it changes tool results
    ({"type": "typos"}, READ, True),  # a content fault: also a reply that is not JSON-RPC
    ({"type": "latency", "delay_ms": 1, "phase": "response"}, CALL, True),  # a rule on the whole response
])
def test_a_reply_is_read_only_where_a_rule_could_act_on_it(fault, body, could):
    engine, _ = engine_for([{"name": "r", "fault": fault}])
    assert engine.interest.could_act_on_reply(_request(body)) is could
