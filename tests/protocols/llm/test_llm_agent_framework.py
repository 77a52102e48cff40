"""A real agent framework (the OpenAI Agents SDK) running a multi-turn loop of local function tools,
its model API pointed at the proxy in front of the scripted model."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # before the SDK loads: it would export traces to the provider

import agents  # noqa: E402
import pytest  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from tests.helpers.llm_support import ScriptedLlm, llm, rules  # noqa: F401
from tests.helpers.support import call_lines

agents.set_tracing_disabled(True)

PROMPT = ("Plan my afternoon in Paris: check the weather first `call get_weather(city=Paris)` and then look "
          "for museum opening hours `call search_docs(query=museums)`, and summarize.")


def run_agent(base: str, ran: list[tuple[str, dict[str, Any]]], *, stream: bool = False) -> str:
    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        ran.append(("get_weather", {"city": city}))
        return f"14 degrees and sunny in {city}"

    @agents.function_tool
    def search_docs(query: str) -> str:
        """Search the documentation."""
        ran.append(("search_docs", {"query": query}))
        return f"The {query} open from 10:00 to 18:00"

    model = agents.OpenAIChatCompletionsModel(
        model="gpt-test", openai_client=AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=2))
    agent = agents.Agent(name="planner", instructions="You plan afternoons.", model=model,
                         tools=[get_weather, search_docs])
    if not stream:
        return str(agents.Runner.run_sync(agent, PROMPT, max_turns=6).final_output)

    async def streamed() -> str:
        result = agents.Runner.run_streamed(agent, PROMPT, max_turns=6)
        async for _ in result.stream_events():
            pass
        return str(result.final_output)

    return asyncio.run(streamed())


def test_direct_loop_runs_both_tools(llm: ScriptedLlm) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    output = run_agent(llm.url, ran)
    assert ran == [("get_weather", {"city": "Paris"}), ("search_docs", {"query": "museums"})]
    assert output == "Results: The museums open from 10:00 to 18:00"


@pytest.mark.parametrize("stream", [False, True])
def test_renamed_tool_runs_the_agents_own_function(llm: ScriptedLlm, make_proxy: Any, stream: bool) -> None:
    proxy = make_proxy(rules({"fault": {"type": "rename_tool", "tool": "get_weather", "to": "weather_now"}},
                             {"fault": {"type": "input_schema_drift", "tool": "search_docs"}}), to=llm.url)
    ran: list[tuple[str, dict[str, Any]]] = []
    start = len(llm.requests)
    output = run_agent(proxy.url, ran, stream=stream)
    assert ran == [("get_weather", {"city": "Paris"}), ("search_docs", {"query": "museums"})]
    assert output == "Results: The museums open from 10:00 to 18:00"
    shown = [[t["function"]["name"] for t in request["tools"]] for request in llm.requests[start:]]
    assert shown == [["weather_now", "search_docs"]] * 3
    routed = [e for e in proxy.events("fault") if e["method"] == "tools/call"]
    assert [(e["tool"], e["routed_to"], e["turn"]) for e in routed] == [
        ("weather_now", "get_weather", 0), ("search_docs", "search_docs", 1)]


def test_prompt_typos_identical_on_each_resend(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "prompt_typos", "rate": 0.15}}), to=llm.url)
    ran: list[tuple[str, dict[str, Any]]] = []
    start = len(llm.requests)
    run_agent(proxy.url, ran)
    prompts = [next(m["content"] for m in request["messages"] if m["role"] == "user")
               for request in llm.requests[start:]]
    assert len(prompts) == 3 and len(set(prompts)) == 1 and prompts[0] != PROMPT
    assert ran == [("get_weather", {"city": "Paris"}), ("search_docs", {"query": "museums"})]  # code spans kept
    fired = proxy.events("fault")
    assert [(e["fault"], e["api"], e["model"], e["turn"]) for e in fired] == [
        ("prompt_typos", "openai-chat", "gpt-test", 0)]


@pytest.mark.slow
def test_rate_limit_retried_by_the_sdk_after_retry_after(llm: ScriptedLlm, make_proxy: Any) -> None:
    proxy = make_proxy(rules({"fault": {"type": "llm_error", "kind": "rate_limit", "retry_after_s": 0.8},
                              "after": 1, "first": 1}), to=llm.url)
    ran: list[tuple[str, dict[str, Any]]] = []
    started = time.monotonic()
    output = run_agent(proxy.url, ran)
    assert time.monotonic() - started >= 0.75
    assert output == "Results: The museums open from 10:00 to 18:00"
    calls = call_lines(proxy, 4)
    assert [(c["status"], c["turn"]) for c in calls] == [(200, 0), (429, 1), (200, 1), (200, 2)]
    fault = proxy.events("fault")[0]
    assert (fault["fault"], fault["effect"]["status"], fault["turn"]) == ("llm_error", 429, 1)
