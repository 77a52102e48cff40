"""The model-API formats against their written contract (protocols/llm/format.ModelFormat), and the one
ToolShape their requests' tools go through: a changed tools list goes back in each format's own shape,
its built-in tools and the keys chaosproxy does not know kept."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chaosproxy.protocols.llm import APIS, anthropic, openai_chat, openai_responses
from chaosproxy.protocols.llm.format import FORMATS
from chaosproxy.protocols.llm.stream import Editor

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
NEW = {"name": "made_up", "description": "a tool a fault made up", "inputSchema": {"type": "object"}}
BODIES: dict[str, tuple[dict[str, Any], list[Any]]] = {  # a request; its tools array once `weather` is renamed
    "anthropic": (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
            {"name": "weather", "description": "w", "input_schema": SCHEMA, "cache_control": {"type": "ephemeral"}},
            {"type": "web_search_20250305", "name": "web_search"}]},
        [{"name": "forecast", "description": "w", "input_schema": SCHEMA, "cache_control": {"type": "ephemeral"}},
         {"type": "web_search_20250305", "name": "web_search"},
         {"name": "made_up", "description": "a tool a fault made up", "input_schema": {"type": "object"}}]),
    "openai-chat": (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
            {"type": "function", "function": {"name": "weather", "description": "w", "parameters": SCHEMA,
                                              "strict": True}},
            {"type": "custom", "custom": {"name": "grammar"}}]},
        [{"type": "function", "function": {"name": "forecast", "description": "w", "parameters": SCHEMA,
                                           "strict": True}},
         {"type": "custom", "custom": {"name": "grammar"}},
         {"type": "function", "function": {"name": "made_up", "description": "a tool a fault made up",
                                           "parameters": {"type": "object"}}}]),
    "openai-responses": (
        {"model": "m", "input": "hi", "tools": [
            {"type": "function", "name": "weather", "description": "w", "parameters": SCHEMA, "strict": True},
            {"type": "web_search"}]},
        [{"type": "function", "name": "forecast", "description": "w", "parameters": SCHEMA, "strict": True},
         {"type": "web_search"},
         {"type": "function", "name": "made_up", "description": "a tool a fault made up",
          "parameters": {"type": "object"}}]),
}


def test_every_api_has_a_format_that_names_it() -> None:
    assert sorted(FORMATS) == sorted(APIS) == sorted(BODIES)
    for api, fmt in FORMATS.items():
        assert api == fmt.API and issubclass(fmt.Editor, Editor)
    assert {id(fmt) for fmt in FORMATS.values()} == {id(anthropic), id(openai_chat), id(openai_responses)}


@pytest.mark.parametrize("api", sorted(BODIES))
def test_a_changed_tools_list_goes_back_in_the_format_s_own_shape(api: str) -> None:
    fmt = FORMATS[api]
    body, expected = copy.deepcopy(BODIES[api][0]), BODIES[api][1]
    request = fmt.parse_request(body)
    assert request.tools is not None and [tool["name"] for tool in request.tools] == ["weather"]  # built-ins left out
    assert request.tools[0]["inputSchema"] == SCHEMA and request.tools[0]["description"] == "w"
    request.put_tools([{**request.tools[0], "name": "forecast"}, NEW])
    assert body["tools"] == expected
    assert [fmt.TOOLS.name_of(entry) for entry in expected if fmt.TOOLS.is_function(entry)] == ["forecast", "made_up"]


@pytest.mark.parametrize("api", sorted(BODIES))
def test_an_untouched_tools_list_is_the_same_objects(api: str) -> None:
    body = copy.deepcopy(BODIES[api][0])
    original = list(body["tools"])
    request = FORMATS[api].parse_request(body)
    assert request.tools is not None
    request.put_tools(request.tools)
    assert all(new is old for new, old in zip(body["tools"], original, strict=True))
