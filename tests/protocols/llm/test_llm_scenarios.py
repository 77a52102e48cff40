"""The LLM-gateway scenario library (scenarios/llm/) and the RobustBench-TC suite in this mode: each fires
through the proxy on a function-calling conversation of the official `openai` SDK with the scripted model."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from chaosproxy.drill.suite import draw, load_suite
from chaosproxy.engine.scenario import load_scenario
from chaosproxy.faults import REGISTRY
from tests.helpers.llm_support import CHAT_TOOLS, ScriptedLlm, llm  # noqa: F401

ROOT = Path(__file__).resolve().parents[3]
LLM_SCENARIOS = sorted((ROOT / "scenarios" / "llm").glob("*.yaml"))
SUITE = ROOT / "scenarios" / "suites" / "robustbench-tc-llm.yaml"
BENCHMARK_TYPES = {"same_name_A", "same_name_B", "same_name_C", "same_name_D", "same_name_E", "redundant",
                   "CD", "TD", "CD_NT", "TD_NT", "CD_AB", "TD_AB", "paraphrase_tool_description",
                   "paraphrase_parameter_description", "timeout", "rate_limit", "auth_error", "server_error",
                   "malformed_response", "schema_drift", "realistic_typos", "query_paraphrase"}
PROMPT = ("Find out whether I need an umbrella in Paris today `call get_weather(city=Paris)` and what the "
          "docs say about rain gear `call search_docs(query=rain gear)`, then tell me.")
BUDGET_S = 20.0
MAX_CONVERSATIONS = 16


def converse(base: str, *, stream: bool) -> None:
    """A three-turn tool loop as a plain agent writes it; a model-API error ends it, as it would end a task."""
    c = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    try:
        for _ in range(3):
            if stream:
                with c.chat.completions.stream(model="gpt-test", messages=messages, tools=CHAT_TOOLS) as events:
                    message = events.get_final_completion().choices[0].message
            else:
                message = c.chat.completions.create(model="gpt-test", messages=messages,
                                                    tools=CHAT_TOOLS).choices[0].message
            messages.append(message.model_dump(exclude_none=True, exclude={"parsed"}))
            if not message.tool_calls:
                return
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": json.dumps({"tool": call.function.name, "arguments": arguments,
                                                        "answer": "light rain expected after 15:00"})})
    except (openai.APIError, openai.LengthFinishReasonError, json.JSONDecodeError):
        return


def fire(make_proxy: Any, llm_url: str, scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """Conversations through a proxy with `scenario` until one of its faults fires (bounded); the fault lines."""
    proxy = make_proxy(scenario, to=llm_url)
    deadline = time.monotonic() + BUDGET_S
    for i in range(MAX_CONVERSATIONS):
        converse(proxy.url, stream=i % 2 == 1)
        if (fired := proxy.events("fault")) or time.monotonic() > deadline:
            break
    assert not proxy.events("error"), proxy.events("error")
    return fired


@pytest.mark.parametrize("path", LLM_SCENARIOS, ids=lambda path: path.stem)
def test_each_llm_scenario_says_what_it_is_and_fires_with_its_component(path: Path, llm: ScriptedLlm,
                                                                        make_proxy: Any) -> None:
    header = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#"))
    assert header.startswith("# Component: ") and "Reproduces:" in header and "Grounding:" in header
    component = header.removeprefix("# Component: ").split(".", 1)[0]
    scenario = load_scenario(path)
    assert scenario.description and all(rule.fault.component == component for rule in scenario.rules)
    stream_only = any(rule.fault.type == "llm_stream_error" for rule in scenario.rules)
    data = scenario.model_dump(mode="json", exclude_none=True)
    for rule in data["rules"]:  # fire sooner: the gates are about when, not what
        rule.update(probability=1.0, after=0)
    fired = fire(make_proxy, llm.url, data)
    assert fired, f"{path.stem} never fired"
    assert {line["component"] for line in fired} == {component}
    assert all(line["api"] == "openai-chat" and line["model"] == "gpt-test" for line in fired)
    if stream_only:
        assert fired[0]["fault"] == "llm_stream_error"


def test_the_suite_covers_the_22_benchmark_types() -> None:
    suite = load_suite(SUITE)
    assert suite.pick == 1
    assert {rule["name"] for rule in suite.rules} == BENCHMARK_TYPES


@pytest.mark.parametrize("name", sorted(BENCHMARK_TYPES))
def test_each_benchmark_type_fires_in_llm_mode(name: str, llm: ScriptedLlm, make_proxy: Any) -> None:
    template = next(rule for rule in load_suite(SUITE).rules if rule["name"] == name)
    rule = draw(template, random.Random(name))
    rule.update(probability=1.0, after=0)
    fired = fire(make_proxy, llm.url, {"rules": [rule]})
    assert fired, f"{name} never fired"
    fault = REGISTRY[rule["fault"]["type"]]
    assert {line["component"] for line in fired} == {fault.component}
    assert all(line["api"] == "openai-chat" for line in fired)
