"""Every registered fault, socket-free (tests/helpers/faults.py): acted on generated messages of the
kinds the engine hands it, a fault returns an action of the one vocabulary, a Skip or None, never
raises, and decides the same way for the same seed (a draw is a function of the seed and the message).

The parameters are each fault's own in the scenario library, so what is checked is what users run."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosproxy.engine.actions import Action, Skip
from chaosproxy.engine.message import Message, Phase
from chaosproxy.engine.session_state import SessionState
from chaosproxy.faults import REGISTRY
from tests.helpers.faults import (
    acted,
    fault_of,
    mcp_reply,
    rest_reply,
    rpc_reply,
    rpc_request,
    tool_call,
    tools_list_reply,
)

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"
ACTIONS = typing.get_args(Action)


def library_specs() -> dict[str, dict[str, Any]]:
    """Each fault type's parameters, from the first library scenario that uses it."""
    specs: dict[str, dict[str, Any]] = {}
    for path in sorted(path for path in LIBRARY.rglob("*.yaml") if "suites" not in path.parts):
        for rule in (yaml.safe_load(path.read_text()) or {}).get("rules") or []:
            fault = rule.get("fault") or {}
            specs.setdefault(fault.get("type"), fault)
    return specs


SPECS = library_specs()

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | text,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                           max_leaves=8)
tool_names = st.sampled_from(["search", "weather", "add", "render"])
tools = st.lists(st.builds(lambda name, description: {"name": name, "description": description,
                                                      "inputSchema": {"type": "object", "properties": {
                                                          "q": {"type": "string", "description": description}},
                                                          "required": ["q"]}},
                           tool_names, text), max_size=4, unique_by=lambda tool: tool["name"])
results = st.builds(lambda parts, structured, error: {
    "content": [{"type": "text", "text": part} for part in parts],
    **({"structuredContent": structured} if structured is not None else {}), **({"isError": True} if error else {})},
    st.lists(text, min_size=1, max_size=3), st.none() | st.dictionaries(text, json_values, max_size=3), st.booleans())
messages = st.one_of(
    st.builds(tool_call, tool_names, st.dictionaries(st.sampled_from(["q", "a", "city"]), json_values, max_size=3)),
    st.builds(lambda method: rpc_request(method, {}), st.sampled_from(["initialize", "tools/list", "ping"])),
    st.builds(mcp_reply, results, tool_names),
    st.builds(tools_list_reply, tools),
    st.builds(lambda name, code: rpc_reply(tool_call(name), error={"code": code, "message": "failed"}),
              tool_names, st.integers(-32768, -32000)),
    st.builds(lambda body: rest_reply(body.encode()), text),
    st.builds(lambda value: rest_reply(yaml.safe_dump(value).encode(), "text/plain"), json_values),
)


def engine_would_ask(fault: Any, msg: Message) -> bool:
    """Whether a rule with this fault could reach `act` on `msg`: its phase, and its methods (`Fault.methods`)."""
    return fault.phase is msg.phase and (fault.methods is None or msg.method in fault.methods)


def same_message(msg: Message) -> Message:
    """A fresh copy of `msg` (a fault may rewrite the one it is given)."""
    request = same_message(msg.request) if msg.request is not None else None
    return Message(msg.transport, msg.phase, http_method=msg.http_method, path=msg.path,
                   headers=dict(msg.headers), status=msg.status, body=msg.body, request=request)


def test_every_fault_has_library_parameters():
    assert set(REGISTRY) <= set(SPECS), f"no library scenario uses {sorted(set(REGISTRY) - set(SPECS))}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGISTRY))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=messages, seed=st.integers(0, 2**32 - 1))
def test_a_fault_returns_one_of_the_actions_and_draws_by_its_seed(name: str, msg: Message, seed: int) -> None:
    fault = fault_of(SPECS[name])
    if not engine_would_ask(fault, msg):
        return
    first = acted(fault, same_message(msg), SessionState(), seed=seed)
    assert first.action is None or isinstance(first.action, (*ACTIONS, Skip)), first.action
    again = acted(fault, same_message(msg), SessionState(), seed=seed)
    assert again == first


def test_the_harness_sees_what_a_fault_declines_and_what_it_skips() -> None:
    """A check of the harness itself: a request is never a result fault's, and a binary body is skipped."""
    assert acted({"type": "typos", "rate": 1}, tool_call("search", {"q": "hello"})).action is None
    skipped = acted({"type": "typos", "rate": 1}, rest_reply(b"\x89PNG\r\n\x1a\n", "image/png"))
    assert skipped.action == Skip("body is image/png, not text or JSON")
    assert Phase.REQUEST is tool_call("search").phase


# The faults that act on plain MCP and HTTP traffic with their library parameters alone; the others need
# what this corpus has not, and are observed acting where they have it (tests named beside each).
CORPUS = [
    tool_call("search", {"q": "umbrella reviews"}),
    mcp_reply({"content": [{"type": "text", "text": "Sunny in Lima, 21 degrees, light wind from the west."}],
               "structuredContent": {"city": "Lima", "temp_c": 21}}, "weather"),
    tools_list_reply([{"name": name, "description": f"{name} things for the user, by name",
                       "inputSchema": {"type": "object", "properties": {
                           "q": {"type": "string", "description": "the words to find; returns matching items"},
                           "city": {"type": "string", "description": "the city the user asked about"},
                           "a": {"type": "number"}}, "required": ["q"]}}
                      for name in ("search", "weather", "add", "render")]),
    rpc_reply(tool_call("fail"), {"content": [{"type": "text", "text": "upstream said no"}], "isError": True}),
    rest_reply(b'{"items": [{"name": "alpha widget", "price": 3}, {"name": "beta widget", "price": 4}]}'),
]
ELSEWHERE = {
    "noise": "no character of this corpus is one it swaps (tests/faults/test_content_faults.py)",
    "wrong_data": "needs an earlier result or arrays to swap (tests/faults/test_content_faults.py)",
    "rate_limit": "a token bucket: declines while it has tokens (tests/faults/test_http_faults.py)",
    "stream_cut": "needs an event stream (tests/faults/test_http_faults.py)",
    "remove_tool": "acts from the second listing on (tests/faults/test_mcp_action_faults.py)",
    "session_expire": "needs a session id (tests/faults/test_mcp_transition_faults.py)",
    "llm_error": "a model API's request (tests/protocols/llm/)",
    **dict.fromkeys(["cache_scope_flip", "era_downgrade", "header_mismatch", "input_required_loop",
                     "input_required_stale", "stale_cache", "subscription_drop", "task_lost"],
                    "needs 2026-era MCP messages (tests/faults/test_mcp_modern_faults.py)"),
}


def test_every_fault_that_acts_on_plain_traffic_is_seen_acting() -> None:
    """A check that the property above is not vacuous: each such fault returns an action on the corpus."""
    plain = {name for name, fault in REGISTRY.items() if fault.level.value in
             ("transport", "http", "jsonrpc", "mcp", "content") and name not in ELSEWHERE}
    silent = sorted(name for name in plain if not any(
        (action := acted(fault_of(SPECS[name]), same_message(msg), SessionState(), seed=seed).action) is not None
        and not isinstance(action, Skip)
        for msg in CORPUS if engine_would_ask(fault_of(SPECS[name]), msg) for seed in range(8)))
    assert silent == []
