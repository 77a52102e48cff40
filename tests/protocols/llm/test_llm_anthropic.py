"""LLM-gateway mode, Anthropic Messages: the official `anthropic` SDK through the proxy to the scripted model."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.helpers.llm_support import ANTHROPIC_TOOLS, PROMPT, RESULT, ScriptedLlm, llm, rules  # noqa: F401
from tests.helpers.support import call_lines

MODEL = "claude-test"


def client(base: str, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=retries)


def ask(c: anthropic.Anthropic, messages: list[dict[str, Any]], *, stream: bool) -> anthropic.types.Message:
    if not stream:
        return c.messages.create(model=MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS)
    with c.messages.stream(model=MODEL, max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS) as events:
        return events.get_final_message()


def loop(c: anthropic.Anthropic, prompt: str = PROMPT, *, stream: bool = False,
         is_error: bool = False) -> list[anthropic.types.Message]:
    """A two-turn tool loop: the model calls a tool, the agent answers with RESULT; both replies."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    replies = []
    for _ in range(2):
        reply = ask(c, messages, stream=stream)
        replies.append(reply)
        messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True)
                                                          for block in reply.content]})
        results = [{"type": "tool_result", "tool_use_id": block.id, "content": RESULT, "is_error": is_error}
                   for block in reply.content if block.type == "tool_use"]
        if results:
            messages.append({"role": "user", "content": results})
    return replies


@pytest.mark.parametrize("stream", [False, True])
def test_transparent_with_no_rule_firing(llm: ScriptedLlm, make_proxy: Any, stream: bool) -> None:
    proxy = make_proxy(rules({"match": {"api": "openai-*"}, "fault": {"type": "prompt_typos"}},
                             {"match": {"model": "gpt-*"}, "fault": {"type": "typos"}}), to=llm.url)
    start = len(llm.requests)
    direct = [r.model_dump() for r in loop(client(llm.url), stream=stream)]
    seen_direct = llm.requests[start:]
    start = len(llm.requests)
    proxied = [r.model_dump() for r in loop(client(proxy.url), stream=stream)]
    assert proxied == direct and llm.requests[start:] == seen_direct
    assert direct[0]["content"][0]["name"] == "get_weather" and direct[0]["stop_reason"] == "tool_use"
    assert proxy.events("fault") == []
    assert [(c["api"], c["turn"]) for c in call_lines(proxy, 2)] == [("anthropic", 0), ("anthropic", 1)]


@pytest.mark.parametrize("stream", [False, True])
def test_renamed_tool_and_drifted_argument_undone(llm: ScriptedLlm, make_proxy: Any, stream: bool) -> None:
    proxy = make_proxy(rules({"fault": {"type": "rename_tool", "tool": "get_weather", "style": "abbreviate"}},
                             {"fault": {"type": "input_schema_drift", "tool": "get_*", "suffix": "_name"}}),
                       to=llm.url)
    start = len(llm.requests)
    replies = loop(client(proxy.url), stream=stream)
    call = replies[0].content[0]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    assert replies[1].content[0].text == f"Results: {RESULT}"
    first, second = llm.requests[start:]
    assert first["tools"][0]["name"] == "get_wthr"
    assert list(first["tools"][0]["input_schema"]["properties"]) == ["city_name"]
    tool_use = second["messages"][1]["content"][0]
    assert (tool_use["name"], tool_use["input"]) == ("get_wthr", {"city_name": "Paris"})  # as the model said it


def test_tool_result_typos_and_flipped_is_error(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "truncate_text", "chars": 14}},
                             {"fault": {"type": "flip_is_error", "direction": "to_error"}}), to=llm.url)
    start = len(llm.requests)
    replies = loop(client(proxy.url))
    assert replies[1].content[0].text == f"Results: {RESULT[:14]}"
    block = llm.requests[start + 1]["messages"][2]["content"][0]
    assert block["is_error"] is True and block["content"] == RESULT[:14]
    assert {(e["fault"], e["tool"], e["api"]) for e in proxy.events("fault")} == {
        ("truncate_text", "get_weather", "anthropic"), ("flip_is_error", "get_weather", "anthropic")}


@pytest.mark.parametrize("stream", [False, True])
def test_overloaded_529(llm: ScriptedLlm, make_proxy: Any, stream: bool) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_error", "kind": "overloaded"}}), to=llm.url)
    with pytest.raises(anthropic.OverloadedError) as raised:
        ask(client(proxy.url), [{"role": "user", "content": PROMPT}], stream=stream)
    assert raised.value.status_code == 529
    assert raised.value.body["error"]["type"] == "overloaded_error"


@pytest.mark.slow
def test_overloaded_retried_by_the_sdk(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_error", "kind": "overloaded", "retry_after_s": 0.2},
                              "first": 2}), to=llm.url)
    reply = ask(client(proxy.url, retries=2), [{"role": "user", "content": PROMPT}], stream=False)
    assert reply.content[0].name == "get_weather"
    assert [c["status"] for c in call_lines(proxy, 3)] == [529, 529, 200]


def test_stream_error_event_after_a_200(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_stream_error", "after_events": 3}}), to=llm.url)
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        ask(client(proxy.url), [{"role": "user", "content": "tell me a story"}], stream=True)
    assert proxy.events("fault")[0]["fault"] == "llm_stream_error"


def test_malformed_tool_input(llm: ScriptedLlm, make_proxy: Any) -> None:
    wrong = make_proxy(rules({"fault": {"type": "malformed_tool_call", "kind": "wrong_types"}}), to=llm.url)
    call = ask(client(wrong.url), [{"role": "user", "content": PROMPT}], stream=False).content[0]
    assert call.input == {"city": ["Paris"]}
    broken = make_proxy(rules({"fault": {"type": "malformed_tool_call", "kind": "invalid_json"}}), to=llm.url)
    with pytest.raises(ValueError):  # the SDK's stream accumulator cannot parse the input
        ask(client(broken.url), [{"role": "user", "content": PROMPT}], stream=True)
    whole = ask(client(broken.url), [{"role": "user", "content": PROMPT}], stream=False)
    assert whole.content[0].input == {"city": "Paris"}  # a whole reply cannot carry broken JSON: skipped
    assert "wrong_types" in broken.events("skip")[0]["reason"]


@pytest.mark.parametrize("stream", [False, True])
def test_cut_off_at_max_tokens(llm: ScriptedLlm, make_proxy: Any, stream: bool) -> None:
    proxy = make_proxy(rules({"fault": {"type": "empty_completion", "mode": "length"}}), to=llm.url)
    prompt = "Tell me everything about the history of the city of Paris, in detail"
    reply = ask(client(proxy.url), [{"role": "user", "content": prompt}], stream=stream)
    assert reply.stop_reason == "max_tokens"
    text = "".join(block.text for block in reply.content if block.type == "text")
    assert 0 < len(text) < len(prompt) and f"You said: {prompt}".startswith(text)


def test_stream_cut_before_message_stop(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "stream_cut", "after_events": 4}}), to=llm.url)
    events = []
    with client(proxy.url).messages.stream(model=MODEL, max_tokens=64,
                                           messages=[{"role": "user", "content": "a fairly long answer"}]) as s:
        events = [event.type for event in s]
    assert "message_stop" not in events and len(events) >= 3
