"""A fault on a model-API exchange is logged if and only if the model got other bytes than the agent sent
(DESIGN invariant 10), in each of the three formats: a tool result's fault whose outcome the format cannot
carry (Chat Completions and Responses have no error flag on a tool result; no format carries a JSON-RPC
error) does not fire, so it writes no fault line. Real SDK clients, through the proxy, to the scripted model."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.llm_support import ANTHROPIC_TOOLS, CHAT_TOOLS, RESPONSES_TOOLS, ScriptedLlm, llm, rules  # noqa: F401

ASKED = "How is the weather in Paris?"  # no `call` directive: the scripted model answers in text
ARGUMENTS = '{"city":"Paris"}'
RESULT_FAULTS: list[dict[str, Any]] = [
    {"type": "flip_is_error"}, {"type": "flip_is_error", "direction": "to_success"}, {"type": "error_in_success"},
    {"type": "truncate_text", "chars": 4}, {"type": "typos", "rate": 0.5}, {"type": "malformed"},
    {"type": "rpc_error", "phase": "response"}, {"type": "wrong_data", "mode": "empty"},
]


def ask(base: str, api: str, text: str, is_error: bool | None) -> None:
    """One turn whose newest item is get_weather's result `text` (an error, when the format says so)."""
    if api == "anthropic":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "toolu_1", "content": text}
        if is_error is not None:
            result["is_error"] = is_error
        anthropic.Anthropic(base_url=base, api_key="k", max_retries=0).messages.create(
            model="claude-test", max_tokens=64, tools=ANTHROPIC_TOOLS, messages=[  # type: ignore[arg-type]
                {"role": "user", "content": ASKED},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [result]}])
        return
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    if api == "openai-chat":
        client.chat.completions.create(model="gpt-test", tools=CHAT_TOOLS, messages=[  # type: ignore[arg-type]
            {"role": "user", "content": ASKED},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": text}])
        return
    client.responses.create(model="gpt-test", tools=RESPONSES_TOOLS, input=[  # type: ignore[arg-type]
        {"role": "user", "content": ASKED},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": ARGUMENTS},
        {"type": "function_call_output", "call_id": "call_1", "output": text}])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(api=st.sampled_from(["openai-chat", "openai-responses", "anthropic"]), fault=st.sampled_from(RESULT_FAULTS),
       text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
       is_error=st.sampled_from([None, False, True]), seed=st.integers(0, 3))
@pytest.mark.slow
def test_a_tool_result_fault_is_logged_iff_the_model_got_other_bytes(
        llm: ScriptedLlm, make_proxy: Any, api: str, fault: dict[str, Any], text: str, is_error: bool | None,
        seed: int) -> None:
    flag = is_error if api == "anthropic" else None  # the OpenAI formats have no flag to send
    ask(llm.url, api, text, flag)
    sent = llm.requests[-1]
    proxy = make_proxy(rules({"match": {"tool": "get_weather"}, "fault": fault}), seed=seed, to=llm.url)
    ask(proxy.url, api, text, flag)
    got = llm.requests[-1]
    fired = proxy.events("fault")
    assert bool(fired) == (got != sent), (fired, got, sent)
    assert proxy.events("error") == []


# faults on the model's tool calls and its completion; not those that answer a call (timeout, rpc_error): the
# agent gets the call as the model made it, and the model the proxy's answer in place of the agent's next turn
CALL_FAULTS: list[dict[str, Any]] = [
    {"type": "malformed_tool_call"}, {"type": "malformed_tool_call", "kind": "wrong_types"},
    {"type": "hallucinated_tool_call", "style": "case"}, {"type": "header_mismatch"}, {"type": "era_downgrade"},
    {"type": "input_required_stale"}, {"type": "empty_completion"}, {"type": "llm_stream_error", "after_events": 2},
]


def reply(base: str, api: str, stream: bool) -> Any:
    """What the SDK makes of the model's reply to a prompt asking for one get_weather call (or the error
    it raised)."""
    try:
        return _reply(base, api, stream)
    except (openai.APIError, anthropic.APIError) as exc:
        return {"error": type(exc).__name__, "message": exc.message}


def _reply(base: str, api: str, stream: bool) -> Any:
    asked = "Look it up: call get_weather(city=Paris)"
    if api == "anthropic":
        client = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)
        kwargs: dict[str, Any] = {"model": "claude-test", "max_tokens": 64, "tools": ANTHROPIC_TOOLS,
                                  "messages": [{"role": "user", "content": asked}]}
        if not stream:
            return client.messages.create(**kwargs).model_dump()
        with client.messages.stream(**kwargs) as events:
            return events.get_final_message().model_dump()
    openai_client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    if api == "openai-chat":
        chunks = openai_client.chat.completions.create(model="gpt-test", tools=CHAT_TOOLS, stream=stream,
                                                       messages=[{"role": "user", "content": asked}])
        return [chunk.model_dump() for chunk in chunks] if stream else chunks.model_dump()  # type: ignore[union-attr]
    answer = openai_client.responses.create(model="gpt-test", tools=RESPONSES_TOOLS, input=asked, stream=stream)
    return [event.model_dump() for event in answer] if stream else answer.model_dump()  # type: ignore[union-attr]


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(api=st.sampled_from(["openai-chat", "openai-responses", "anthropic"]), fault=st.sampled_from(CALL_FAULTS),
       stream=st.booleans(), seed=st.integers(0, 3))
def test_a_reply_fault_is_logged_iff_the_agent_got_other_bytes(
        llm: ScriptedLlm, make_proxy: Any, api: str, fault: dict[str, Any], stream: bool, seed: int) -> None:
    clean = reply(llm.url, api, stream)
    proxy = make_proxy(rules({"fault": fault}), seed=seed, to=llm.url)
    got = reply(proxy.url, api, stream)
    fired = proxy.events("fault")
    assert bool(fired) == (got != clean), (fired, got, clean)
    assert proxy.events("error") == []
