"""LLM-gateway mode, OpenAI Chat Completions: the official `openai` SDK through the proxy to the scripted model."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx2 as httpx
import openai
import pytest

from chaosproxy.records.logfile import read_sessions
from chaosproxy.report.build import build_report
from tests.helpers.llm_support import CHAT_TOOLS, PROMPT, RESULT, ScriptedLlm, llm, rules  # noqa: F401
from tests.helpers.support import call_lines

MODEL = "gpt-test"


def client(base: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=retries)


def first_turn(c: openai.OpenAI, prompt: str = PROMPT, *, stream: bool = False) -> Any:
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        return c.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS)
    with c.chat.completions.stream(model=MODEL, messages=messages, tools=CHAT_TOOLS) as events:
        return events.get_final_completion()


def loop(c: openai.OpenAI, prompt: str = PROMPT, result: str = RESULT, *, stream: bool = False) -> list[Any]:
    """A two-turn tool loop: the model calls a tool, the agent answers with `result`; all replies."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    replies = []
    for _ in range(2):
        if stream:
            with c.chat.completions.stream(model=MODEL, messages=messages, tools=CHAT_TOOLS) as events:
                reply = events.get_final_completion()
        else:
            reply = c.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS)
        replies.append(reply)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"parsed"}))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return replies


def dump(reply: Any) -> Any:
    return reply.model_dump(exclude={"choices": {"__all__": {"message": {"parsed"}}}})


@pytest.mark.parametrize("stream", [False, True])
def test_transparent_with_no_rule_firing(llm: ScriptedLlm, make_proxy: Any, stream: bool) -> None:
    # rules are loaded and every request is parsed, but none of them matches this traffic
    proxy = make_proxy(rules({"match": {"api": "anthropic"}, "fault": {"type": "prompt_typos"}},
                             {"match": {"model": "claude-*"}, "fault": {"type": "rename_tool", "style": "case"}}),
                       to=llm.url)
    start = len(llm.requests)
    direct = [dump(r) for r in loop(client(llm.url), stream=stream)]
    seen_direct = llm.requests[start:]
    start = len(llm.requests)
    proxied = [dump(r) for r in loop(client(proxy.url), stream=stream)]
    assert proxied == direct
    assert llm.requests[start:] == seen_direct
    assert direct[0]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert proxy.events("fault") == []
    calls = call_lines(proxy, 2)
    assert [(c["api"], c["model"], c["turn"]) for c in calls] == [("openai-chat", MODEL, 0), ("openai-chat", MODEL, 1)]


def test_renamed_tool_reaches_the_agent_under_its_own_name(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "rename_tool", "tool": "get_weather", "to": "weather_lookup"}}),
                       to=llm.url)
    start = len(llm.requests)
    replies = loop(client(proxy.url))
    call = replies[0].choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert replies[1].choices[0].message.content == f"Results: {RESULT}"
    first, second = llm.requests[start:]
    assert [t["function"]["name"] for t in first["tools"]] == ["weather_lookup", "search_docs"]
    assert second["tools"] == first["tools"]  # the same rename on every turn
    # the model sees its own call again, under the name it was shown
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "weather_lookup"
    routed = [e for e in proxy.events("fault") if e["method"] == "tools/call"]
    assert routed and routed[0]["tool"] == "weather_lookup" and routed[0]["routed_to"] == "get_weather"


def test_distractor_answered_by_the_proxy(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "distractor_tool", "tool": "get_weather", "route": "error"}}),
                       to=llm.url)
    start = len(llm.requests)
    replies = loop(client(proxy.url), prompt="Weather? `call get_weather_v2(city=Oslo)`")
    call = replies[0].choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"  # the agent has no get_weather_v2: it runs the real one
    first, second = llm.requests[start:]
    assert "get_weather_v2" in [t["function"]["name"] for t in first["tools"]]
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather_v2"
    assert second["messages"][2]["content"] == "Error executing tool get_weather_v2"  # the proxy's answer


def test_drifted_argument_renamed_back(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "input_schema_drift", "tool": "get_weather"}}), to=llm.url)
    start = len(llm.requests)
    for stream in (False, True):
        call = first_turn(client(proxy.url), stream=stream).choices[0].message.tool_calls[0]
        assert json.loads(call.function.arguments) == {"city": "Paris"}
    for request in llm.requests[start:]:
        assert list(request["tools"][0]["function"]["parameters"]["properties"]) == ["city_v2"]


def test_tool_result_perturbed_identically_on_every_resend(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "typos", "rate": 0.3}}), to=llm.url)
    c = client(proxy.url)
    start = len(llm.requests)
    replies = loop(c)
    answer = replies[1].choices[0].message.content
    assert answer.startswith("Results: ") and answer != f"Results: {RESULT}"
    # a third turn resends the whole history: the old tool result comes out as before
    history = llm.requests[start + 1]["messages"] + [{"role": "user", "content": "thanks"}]
    history[1]["tool_calls"][0]["function"]["name"] = "get_weather"
    history[2]["content"] = RESULT  # as the agent holds it
    c.chat.completions.create(model=MODEL, messages=history, tools=CHAT_TOOLS)
    assert llm.requests[-1]["messages"][2]["content"] == answer.removeprefix("Results: ")
    fired = proxy.events("fault")
    assert [(e["fault"], e["tool"], e["turn"]) for e in fired] == [("typos", "get_weather", 1)]


def test_prompt_typos_keep_code_and_numbers_and_repeat(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "prompt_typos", "rate": 0.25}}), to=llm.url)
    prompt = "Please find the 3 cheapest flights to Lisbon on 2026-12-24 via https://example.test/f?q=1 " \
             "`call get_weather(city=Lisbon)`"
    start = len(llm.requests)
    loop(client(proxy.url), prompt=prompt)
    first, second = (r["messages"][0]["content"] for r in llm.requests[start:])
    assert first != prompt and first == second
    for kept in ("3", "2026-12-24", "https://example.test/f?q=1", "`call get_weather(city=Lisbon)`"):
        assert kept in first
    assert [e["fault"] for e in proxy.events("fault")] == ["prompt_typos"]


@pytest.mark.slow
def test_rate_limit_retried_after_retry_after(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_error", "kind": "rate_limit", "retry_after_s": 0.6},
                              "first": 1}), to=llm.url)
    started = time.monotonic()
    reply = first_turn(client(proxy.url, retries=2))
    assert time.monotonic() - started >= 0.55
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    calls = call_lines(proxy, 2)
    assert [c["status"] for c in calls] == [429, 200]
    fault = proxy.events("fault")[0]
    assert (fault["fault"], fault["api"], fault["model"]) == ("llm_error", "openai-chat", MODEL)
    # the report sees two turns to the model API, not two tool calls, and the SDK's retry got through
    b = build_report(proxy.log_path).behaviour
    assert (b.tool_calls, b.model_calls, b.disrupted_model_calls) == (0, 2, 1)
    assert (b.recovery.incidents, b.recovery.retried, b.recovery.got_through) == (1, 1, 1)
    assert b.recovery_by_component["transition"].got_through == 1
    [session] = read_sessions(proxy.log_path)
    assert [call.label for call in session.calls] == [f"openai-chat {MODEL}"] * 2


def test_quota_is_not_retried(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_error", "kind": "quota"}}), to=llm.url)
    with pytest.raises(openai.RateLimitError) as raised:
        first_turn(client(proxy.url, retries=3))
    assert raised.value.code == "insufficient_quota"
    assert len(call_lines(proxy, 1)) == 1


def test_overloaded_is_503(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_error", "kind": "overloaded"}}), to=llm.url)
    with pytest.raises(openai.InternalServerError) as raised:
        first_turn(client(proxy.url))
    assert raised.value.status_code == 503 and raised.value.code == "server_is_overloaded"


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_call(llm: ScriptedLlm, make_proxy: Any, stream: bool) -> None:
    proxy = make_proxy(rules({"fault": {"type": "malformed_tool_call", "kind": "truncated"}}), to=llm.url)
    c = client(proxy.url)
    if stream:  # the raw chunks, as an agent loop accumulates them
        chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                                tools=CHAT_TOOLS, stream=True))
        arguments = "".join(tc.function.arguments or "" for ch in chunks if ch.choices
                            for tc in ch.choices[0].delta.tool_calls or [])
    else:
        arguments = first_turn(c).choices[0].message.tool_calls[0].function.arguments
    assert arguments == '{"city":'
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    fault = proxy.events("fault")[0]
    assert (fault["fault"], fault["tool"], fault["api"]) == ("malformed_tool_call", "get_weather", "openai-chat")


def test_hallucinated_tool_call(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "hallucinated_tool_call", "style": "case"}}), to=llm.url)
    assert first_turn(client(proxy.url), stream=True).choices[0].message.tool_calls[0].function.name == "getWeather"


@pytest.mark.parametrize("mode", ["empty", "length"])
def test_empty_completion(llm: ScriptedLlm, make_proxy: Any, mode: str) -> None:
    proxy = make_proxy(rules({"fault": {"type": "empty_completion", "mode": mode}}), to=llm.url)
    prompt = "Say something long enough to be cut off halfway through, if you would"
    for stream in (False, True):
        for text_prompt, expected in ((prompt, f"You said: {prompt}"), (PROMPT, "")):  # a text, a tool call
            try:
                choice = first_turn(client(proxy.url), text_prompt, stream=stream).choices[0]
            except openai.LengthFinishReasonError as exc:  # the SDK's stream helper refuses a cut-off reply
                assert stream and mode == "length"
                choice = exc.completion.choices[0]
            assert choice.finish_reason == ("length" if mode == "length" else "stop")
            assert not choice.message.tool_calls
            text = choice.message.content or ""
            assert text == "" if mode == "empty" or not expected else expected.startswith(text) and 0 < len(text) < 60


def test_stream_error_after_a_200(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_stream_error", "kind": "server_error", "after_events": 2}}),
                       to=llm.url)
    seen = []
    with pytest.raises(openai.APIError, match="The server had an error"):
        for chunk in client(proxy.url).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello there, how are you"}], stream=True):
            seen.append(chunk)
    assert len(seen) == 2


def test_stream_cut_before_done(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "stream_cut", "after_events": 3}}), to=llm.url)
    with httpx.Client() as http:
        body = http.post(proxy.url + "/v1/chat/completions", json={
            "model": MODEL, "stream": True, "messages": [{"role": "user", "content": "a long enough answer please"}]})
    events = [e for e in body.text.split("\n\n") if e.strip()]
    assert len(events) == 3 and "[DONE]" not in body.text
    assert call_lines(proxy, 1)[0]["outcome"] == "stream_cut"


def test_bad_input_passes_untouched_with_a_skip_line(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "malformed_tool_call"}}), to=llm.url)
    with httpx.Client() as http:
        not_chat = http.post(proxy.url + "/v1/chat/completions", json={"model": MODEL, "prompt": "hi"})
        unknown = http.post(proxy.url + "/v1/embeddings", json={"model": MODEL, "input": "hi"})
    assert not_chat.status_code == 200 and unknown.status_code == 404  # the scripted model has no embeddings
    weird = client(proxy.url).chat.completions.with_raw_response.create(
        model="unexpected-shape", messages=[{"role": "user", "content": PROMPT}], tools=CHAT_TOOLS)
    assert json.loads(weird.text) == {"result": "not this API's shape"}
    reasons = [e["reason"] for e in proxy.events("skip")]
    assert reasons[0].startswith("not a valid openai-chat request: no 'messages'")
    assert reasons[1].startswith("POST /v1/embeddings is no model-API path")
    assert reasons[2].startswith("the model API answered in an unexpected shape")
    assert proxy.events("fault") == []


def test_forced_tool_choice_follows_the_renamed_tool(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "rename_tool", "tool": "get_weather", "style": "prefix",
                                        "prefix": "v2_"}}), to=llm.url)
    reply = client(proxy.url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], tools=CHAT_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert llm.requests[-1]["tool_choice"]["function"]["name"] == "v2_get_weather"
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.slow
def test_reset_mid_stream_and_latency(llm: ScriptedLlm, make_proxy: Any) -> None:
    reset = make_proxy(rules({"fault": {"type": "reset", "after_bytes": 300}}), to=llm.url)
    with pytest.raises(openai.APIConnectionError):
        for _ in client(reset.url).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "a long answer, please, in many chunks"}],
                stream=True):
            pass
    slow = make_proxy(rules({"match": {"api": "openai-chat"}, "fault": {"type": "latency", "delay_ms": 400}}),
                      to=llm.url)
    started = time.monotonic()
    first_turn(client(slow.url), stream=True)
    assert time.monotonic() - started >= 0.38
    assert slow.events("fault")[0]["api"] == "openai-chat"
