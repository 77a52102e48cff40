"""Support for the LLM-gateway tests: the scripted model server and real SDK clients through a proxy."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from chaosproxy.demo import llm_server
from tests.helpers.support import ServerLoop

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "description": "The city to return the current weather for."}}, "required": ["city"]}
SEARCH_PARAMS = {"type": "object", "properties": {
    "query": {"type": "string", "description": "What to find in the documentation."}}, "required": ["query"]}
CHAT_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "search_docs", "description": "Search the documentation.",
                                      "parameters": SEARCH_PARAMS}},
]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in CHAT_TOOLS]
RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"]} for t in CHAT_TOOLS]
PROMPT = "What is the weather like in Paris today? Please check it `call get_weather(city=Paris)`"
RESULT = "14 degrees and sunny in Paris, light wind from the west"


@dataclass
class ScriptedLlm:
    url: str
    model: llm_server.ScriptedModel

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.model.requests


@pytest.fixture(scope="session")
def llm(server_loop: ServerLoop) -> Iterator[ScriptedLlm]:
    runner, port, model = server_loop.run(llm_server.start())
    yield ScriptedLlm(f"http://127.0.0.1:{port}", model)
    server_loop.run(runner.cleanup())


def rules(*entries: dict[str, Any]) -> dict[str, Any]:
    """A scenario of rules given as {name, fault, ...} dicts (names default to r0, r1, ...)."""
    return {"rules": [{"name": f"r{i}", **entry} for i, entry in enumerate(entries)]}

