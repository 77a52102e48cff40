"""Issue 24, one test per defect, with the real SDKs (openai, anthropic, the OpenAI Agents SDK; sync and
async; `create(stream=True)` and the stream helpers) against the recorded provider corpus or the scripted
model, through the proxy."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import anthropic
import openai
import pytest

from tests.helpers.llm_corpus import CORPUS, SIGNATURE, CorpusUpstream, corpus_upstream, request_for  # noqa: F401
from tests.helpers.llm_support import ANTHROPIC_TOOLS, PROMPT, ScriptedLlm, llm, rules  # noqa: F401
from tests.helpers.support import call_lines

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # before the SDK loads: it would export traces to the provider
import agents  # noqa: E402

agents.set_tracing_disabled(True)

CANNOT_MATCH = rules(
    {"match": {"model": "other-model"}, "fault": {"type": "malformed_tool_call", "kind": "wrong_types"}},
    {"match": {"model": "other-model"}, "fault": {"type": "llm_stream_error", "after_events": 1}},
    {"match": {"api": "anthropic", "model": "gpt-*"}, "fault": {"type": "empty_completion"}})


def openai_client(base: str, entry: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, default_headers={"x-corpus": entry})


def async_openai(base: str, entry: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0,
                              default_headers={"x-corpus": entry})


def anthropic_client(base: str, entry: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0, default_headers={"x-corpus": entry})


def async_anthropic(base: str, entry: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0,
                                    default_headers={"x-corpus": entry})


def kwargs(entry: str) -> dict[str, Any]:
    """The SDK call's arguments for the entry's request (the SDK adds `stream` itself)."""
    return {key: value for key, value in request_for(CORPUS[entry]).items() if key != "stream"}


def events_of(entry: str) -> int:
    """How many SSE events (comments aside) the recorded stream has."""
    return sum(b"data:" in event for event in CORPUS[entry].events)


def faults(proxy: Any) -> list[str]:
    return [line["fault"] for line in proxy.events("fault")]


# 1. A rule that cannot match a request does not rewrite its streamed replies ------------------------------

def test_1_a_rule_that_cannot_match_leaves_a_chat_stream_as_it_came(corpus_upstream: CorpusUpstream,
                                                                   make_proxy: Any) -> None:
    proxy = make_proxy(CANNOT_MATCH, to=corpus_upstream.url)
    entry = "chat_parallel_tools"
    direct = [c.model_dump() for c in openai_client(corpus_upstream.url, entry).chat.completions.create(
        **kwargs(entry), stream=True)]
    proxied = [c.model_dump() for c in openai_client(proxy.url, entry).chat.completions.create(
        **kwargs(entry), stream=True)]
    assert proxied == direct and len(proxied) == events_of(entry) - 1  # every chunk but [DONE]
    assert all(c["usage"] is None for c in proxied[:-1]) and proxied[3]["choices"][0]["logprobs"] is None
    assert faults(proxy) == []


def test_1_a_rule_that_cannot_match_leaves_anthropic_and_responses_streams_as_they_came(
        corpus_upstream: CorpusUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(CANNOT_MATCH, to=corpus_upstream.url)

    async def anthropic_events(base: str) -> list[Any]:
        entry = "anthropic_thinking_tools"
        async with async_anthropic(base, entry) as client:
            return [event.model_dump() async for event in await client.messages.create(**kwargs(entry), stream=True)]

    direct, proxied = (asyncio.run(anthropic_events(base)) for base in (corpus_upstream.url, proxy.url))
    assert proxied == direct and len(proxied) == events_of("anthropic_thinking_tools") - 1  # the SDK drops pings
    pieces = [e for e in proxied if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]
    assert len(pieces) > 4  # the input as it came, in pieces
    entry = "responses_reasoning_tools"
    direct, proxied = ([e.model_dump() for e in openai_client(base, entry).responses.create(
        **kwargs(entry), stream=True)] for base in (corpus_upstream.url, proxy.url))
    assert proxied == direct and [e["sequence_number"] for e in proxied] == list(range(events_of(entry)))
    assert faults(proxy) == []


# 2. Streamed tool calls keep the fields the proxy does not know -------------------------------------------

def test_2_a_rewritten_gemini_tool_call_keeps_its_thought_signature(corpus_upstream: CorpusUpstream,
                                                                    make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "malformed_tool_call", "kind": "wrong_types"}}), to=corpus_upstream.url)
    entry = "chat_gemini"

    async def final() -> Any:
        async with async_openai(proxy.url, entry) as client, client.chat.completions.stream(**kwargs(entry)) as stream:
            return await stream.get_final_completion()

    call = asyncio.run(final()).choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"city": ["Paris"], "unit": ["celsius"]}  # the fault fired
    assert call.model_extra["extra_content"] == {"google": {"thought_signature": SIGNATURE}}
    assert (call.id, call.type) == ("function-call-5317", "function")
    assert faults(proxy) == ["malformed_tool_call"]


# 3. llm_stream_error is counted only when it sent its error -----------------------------------------------

def test_3_a_stream_error_past_the_end_of_the_reply_is_neither_sent_nor_logged(corpus_upstream: CorpusUpstream,
                                                                               make_proxy: Any) -> None:
    entry = "anthropic_text"
    proxy = make_proxy(rules({"fault": {"type": "llm_stream_error", "after_events": events_of(entry)}},
                             {"fault": {"type": "llm_stream_error", "after_events": events_of(entry) + 5}}),
                       to=corpus_upstream.url)

    async def final() -> Any:
        async with async_anthropic(proxy.url, entry) as client, client.messages.stream(**kwargs(entry)) as stream:
            return await stream.get_final_message()

    message = asyncio.run(final())
    assert message.stop_reason == "end_turn" and message.content[0].text.startswith("Paris is 14 degrees")
    assert faults(proxy) == [] and call_lines(proxy, 1)[0]["faults"] == []
    chat = "chat_gemini"  # two events: its one chunk and [DONE]
    chunks = list(openai_client(proxy.url, chat).chat.completions.create(**kwargs(chat), stream=True))
    assert len(chunks) == 1 and faults(proxy) == []


# 4. after_events counts the events the agent gets ----------------------------------------------------------

@pytest.mark.parametrize("after", [0, 3])
def test_4_after_events_counts_what_the_agent_got(corpus_upstream: CorpusUpstream, make_proxy: Any,
                                                  after: int) -> None:
    # a rule that holds the tool calls (it matches them, and does not fire) must not change the count
    proxy = make_proxy(rules({"match": {"tool": "get_weather"}, "fault": {"type": "malformed_tool_call"},
                              "probability": 0.0},
                             {"fault": {"type": "llm_stream_error", "kind": "server_error", "after_events": after}}),
                       to=corpus_upstream.url)
    entry = "chat_parallel_tools"
    seen = []
    with pytest.raises(openai.APIError, match="The server had an error"):
        for chunk in openai_client(proxy.url, entry).chat.completions.create(**kwargs(entry), stream=True):
            seen.append(chunk)
    assert len(seen) == after
    [line] = proxy.events("fault")
    assert (line["fault"], line["effect"]["after_events"], line["effect"]["error"]) == (
        "llm_stream_error", after, "server_error")
    assert call_lines(proxy, 1)[0]["faults"] == ["r1"]


def test_4_an_error_right_after_the_200_on_the_responses_api(corpus_upstream: CorpusUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_stream_error", "kind": "rate_limit", "after_events": 0}}),
                       to=corpus_upstream.url)
    entry = "responses_reasoning_tools"
    events = list(openai_client(proxy.url, entry).responses.create(**kwargs(entry), stream=True))
    assert [e.type for e in events] == ["error", "response.failed"]
    assert (events[0].code, events[0].sequence_number, events[1].sequence_number) == ("rate_limit_exceeded", 0, 1)


# 5. empty_completion on a stream with reasoning matches its non-streamed twin -----------------------------

@pytest.mark.parametrize("mode", ["empty", "length"])
def test_5_anthropic_thinking_is_emptied_as_in_the_whole_reply(corpus_upstream: CorpusUpstream, make_proxy: Any,
                                                               mode: str) -> None:
    proxy = make_proxy(rules({"fault": {"type": "empty_completion", "mode": mode}}), to=corpus_upstream.url)
    whole = anthropic_client(proxy.url, "anthropic_whole_thinking_tools").messages.create(
        **kwargs("anthropic_whole_thinking_tools"))
    entry = "anthropic_thinking_tools"
    with anthropic_client(proxy.url, entry).messages.stream(**kwargs(entry)) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert [block.type for block in message.content] == (["text"] if mode == "length" else [])
        assert message.stop_reason == ("max_tokens" if mode == "length" else "end_turn")
    if mode == "length":
        assert "Let me check both for you.".startswith(streamed.content[0].text)
    assert faults(proxy) == ["empty_completion", "empty_completion"]


@pytest.mark.parametrize("mode", ["empty", "length"])
def test_5_responses_reasoning_is_emptied_as_in_the_whole_reply(corpus_upstream: CorpusUpstream, make_proxy: Any,
                                                                mode: str) -> None:
    proxy = make_proxy(rules({"fault": {"type": "empty_completion", "mode": mode}}), to=corpus_upstream.url)
    whole = openai_client(proxy.url, "responses_whole_reasoning_tools").responses.create(
        **kwargs("responses_whole_reasoning_tools"))
    entry = "responses_reasoning_tools"
    events = list(openai_client(proxy.url, entry).responses.create(**kwargs(entry), stream=True))
    final = events[-1].response
    assert [e.type for e in events] == ["response.created", "response.in_progress",
                                        "response.incomplete" if mode == "length" else "response.completed"]
    assert [e.sequence_number for e in events] == [0, 1, 2]
    for response in (whole, final):
        assert response.output == [] and response.status == ("incomplete" if mode == "length" else "completed")
        assert response.usage is not None
    if mode == "empty":
        with openai_client(proxy.url, entry).responses.stream(**kwargs(entry)) as stream:
            assert stream.get_final_response().output == []


# 6. Undoing a rename does not erase another fault's change -------------------------------------------------

def test_6_the_model_sees_the_broken_call_whether_or_not_its_tool_was_renamed(llm: ScriptedLlm,
                                                                              make_proxy: Any) -> None:
    malformed = {"fault": {"type": "malformed_tool_call", "kind": "wrong_types"}}
    rename = {"fault": {"type": "rename_tool", "tool": "get_weather", "to": "weather_now"}}
    shown = {}
    for label, scenario in (("alone", rules(malformed)), ("renamed", rules(rename, malformed))):
        proxy = make_proxy(scenario, to=llm.url)
        ran: list[Any] = []
        start = len(llm.requests)
        run_agent(proxy.url, ran)
        assert ran == []  # the agent's function refused the broken arguments
        second = llm.requests[start + 1]
        call = next(m for m in second["messages"] if m["role"] == "assistant")["tool_calls"][0]["function"]
        shown[label] = (call["name"], json.loads(call["arguments"]))
    assert shown == {"alone": ("get_weather", {"city": ["Paris"]}), "renamed": ("weather_now", {"city": ["Paris"]})}


def test_6_with_drifted_arguments_too_on_the_anthropic_sdk(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "rename_tool", "tool": "get_weather", "to": "weather_now"}},
                             {"fault": {"type": "input_schema_drift", "tool": "weather_now", "suffix": "_name"}},
                             {"fault": {"type": "malformed_tool_call", "kind": "wrong_types"}}), to=llm.url)
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    start = len(llm.requests)
    with client.messages.stream(model="claude-test", max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS) as s:
        reply = s.get_final_message()
    call = reply.content[0]
    assert (call.name, call.input) == ("get_weather", {"city": ["Paris"]})  # the agent's names, broken arguments
    messages += [{"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "is_error": True,
                                               "content": "city must be a string"}]}]
    client.messages.create(model="claude-test", max_tokens=256, messages=messages, tools=ANTHROPIC_TOOLS)
    said = llm.requests[start + 1]["messages"][1]["content"][0]
    assert (said["name"], said["input"]) == ("weather_now", {"city_name": ["Paris"]})  # the model's names


def run_agent(base: str, ran: list[Any]) -> str:
    """The OpenAI Agents SDK, streamed, on a multi-turn loop with a local function tool."""
    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        ran.append(city)
        return f"14 degrees and sunny in {city}"

    model = agents.OpenAIChatCompletionsModel(
        model="gpt-test", openai_client=openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0))
    agent = agents.Agent(name="weather", instructions="You report the weather.", model=model, tools=[get_weather])

    async def streamed() -> str:
        result = agents.Runner.run_streamed(agent, "Weather in Paris? `call get_weather(city=Paris)`", max_turns=4)
        async for _ in result.stream_events():
            pass
        return str(result.final_output)

    return asyncio.run(streamed())


# 7. A re-emitted Azure tool call goes in the envelope of the chunk it came in ------------------------------

def test_7_azure_tool_call_keeps_its_own_chunks_envelope(corpus_upstream: CorpusUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "malformed_tool_call", "kind": "wrong_types"}}), to=corpus_upstream.url)
    entry = "chat_azure"
    chunks = list(openai_client(proxy.url, entry).chat.completions.create(**kwargs(entry), stream=True))
    first, *rest = chunks
    assert first.choices == [] and first.model_extra["prompt_filter_results"]
    for chunk in rest:
        assert (chunk.id, chunk.model, chunk.object) == ("chatcmpl-AzR4azure", "gpt-4o-2024-11-20",
                                                         "chat.completion.chunk")
        assert "prompt_filter_results" not in chunk.model_extra
        assert chunk.choices[0].model_extra["content_filter_results"] == {}
    arguments = "".join(tc.function.arguments or "" for c in rest for tc in c.choices[0].delta.tool_calls or [])
    assert json.loads(arguments) == {"city": ["Paris"], "unit": ["celsius"]}


# 8. context_length on the Responses API names its own parameter -------------------------------------------

def test_8_context_length_names_the_parameter_of_each_api(corpus_upstream: CorpusUpstream, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_error", "kind": "context_length"}}), to=corpus_upstream.url)
    entry = "responses_reasoning_tools"
    async def create() -> Any:
        async with async_openai(proxy.url, entry) as client:
            return await client.responses.create(**kwargs(entry))

    with pytest.raises(openai.BadRequestError) as raised:
        asyncio.run(create())
    assert (raised.value.code, raised.value.param) == ("context_length_exceeded", "input")
    assert "exceeds the context window" in raised.value.message
    entry = "chat_parallel_tools"
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(proxy.url, entry).chat.completions.create(**kwargs(entry))
    assert (raised.value.code, raised.value.param) == ("context_length_exceeded", "messages")
    streamed = make_proxy(rules({"fault": {"type": "llm_stream_error", "kind": "context_length", "after_events": 2}}),
                          to=corpus_upstream.url)
    entry = "responses_text"
    error = list(openai_client(streamed.url, entry).responses.create(**kwargs(entry), stream=True))[-2]
    assert (error.type, error.code, error.param) == ("error", "context_length_exceeded", "input")
    fault = proxy.events("fault")[0]
    assert fault["effect"] == {"status": 400, "error": "context_length_exceeded"}


# 9. A gzip-encoded whole reply is not corrupted when a model-API rule is loaded ----------------------------

@pytest.mark.parametrize("fires", [False, True])
def test_9_a_gzip_reply_reaches_the_sdk_whole(corpus_upstream: CorpusUpstream, make_proxy: Any, fires: bool) -> None:
    rule = {"fault": {"type": "malformed_tool_call", "kind": "wrong_types"}, **({} if fires else {"after": 1000})}
    proxy = make_proxy(rules(rule), to=corpus_upstream.url)
    entry = "chat_whole_parallel"
    gzipped = {"x-corpus-gzip": "1"}
    direct = openai_client(corpus_upstream.url, entry).chat.completions.create(**kwargs(entry), extra_headers=gzipped)

    async def proxied() -> Any:
        async with async_openai(proxy.url, entry) as client:
            return await client.chat.completions.create(**kwargs(entry), extra_headers=gzipped)

    reply = asyncio.run(proxied())
    arguments = [json.loads(call.function.arguments) for call in reply.choices[0].message.tool_calls]
    if fires:
        assert arguments == [{"city": ["Paris"], "unit": ["celsius"]}, {"query": ["museum opening hours"],
                                                                       "limit": "3"}]
    else:
        assert reply.model_dump() == direct.model_dump()
    assert faults(proxy) == (["malformed_tool_call"] * 2 if fires else [])
