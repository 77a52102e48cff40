"""`prompt_paraphrase` with `by: model`: a real OpenAI-compatible paraphrasing endpoint on loopback, the
official `openai` SDK as the agent, the scripted model behind the proxy; the cache makes reruns offline."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from chaosproxy.demo.serving import serve
from chaosproxy.engine.named_files import ScenarioFiles
from chaosproxy.engine.scenario import ScenarioError, parse_scenario
from chaosproxy.faults import _model_paraphrase
from tests.helpers.llm_support import PROMPT, ScriptedLlm, llm, rules  # noqa: F401
from tests.helpers.support import ServerLoop, free_port
from tests.protocols.llm.test_llm_openai_chat import client, first_turn


@dataclass
class Paraphraser:
    """An OpenAI-compatible endpoint that paraphrases by answering `answer(text)`, and what it was asked."""

    url: str
    asked: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)
    answer: Any = staticmethod(lambda text: f"Kindly help me with this: {text}")


@pytest.fixture
def paraphraser(server_loop: ServerLoop) -> Iterator[Paraphraser]:
    holder: list[Paraphraser] = []

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        endpoint = holder[0]
        endpoint.asked.append((body, request.headers.get("Authorization")))
        text = endpoint.answer(body["messages"][-1]["content"])
        return web.json_response({"id": "p", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    runner, port = server_loop.run(serve(app))
    holder.append(Paraphraser(f"http://127.0.0.1:{port}/v1"))
    yield holder[0]
    server_loop.run(runner.cleanup())


def by_model(cache: Path) -> dict[str, Any]:
    return rules({"fault": {"type": "prompt_paraphrase", "by": "model", "model": "para-1", "cache": str(cache)}})


def prompt_the_model_got(llm: ScriptedLlm, start: int) -> str:
    [request] = llm.requests[start:]
    return request["messages"][0]["content"]


def test_the_model_s_paraphrase_reaches_the_model_and_a_rerun_reads_it_offline(
        llm: ScriptedLlm, make_proxy: Any, paraphraser: Paraphraser, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "paraphrases.jsonl"
    monkeypatch.setenv(_model_paraphrase.ENDPOINT_ENV, paraphraser.url)
    monkeypatch.setenv(_model_paraphrase.API_KEY_ENV, "sk-para")
    proxy = make_proxy(by_model(cache), to=llm.url)
    start = len(llm.requests)
    first_turn(client(proxy.url))
    assert prompt_the_model_got(llm, start) == f"Kindly help me with this: {PROMPT}"
    [(asked, authorization)] = paraphraser.asked
    assert (asked["model"], asked["messages"][-1]["content"], authorization) == ("para-1", PROMPT, "Bearer sk-para")
    assert "exactly as written" in asked["messages"][0]["content"]
    [entry] = [json.loads(line) for line in cache.read_text().splitlines()]
    assert (entry["model"], entry["paraphrase"]) == ("para-1", f"Kindly help me with this: {PROMPT}")
    [fault] = proxy.events("fault")
    assert (fault["fault"], fault["component"]) == ("prompt_paraphrase", "observation")

    # a rerun, in a fresh process's state, with no endpoint reachable: the cache file answers
    monkeypatch.setattr(_model_paraphrase, "_CACHES", {})
    monkeypatch.setenv(_model_paraphrase.ENDPOINT_ENV, f"http://127.0.0.1:{free_port()}/v1")
    rerun = make_proxy(by_model(cache), to=llm.url)
    start = len(llm.requests)
    first_turn(client(rerun.url))
    assert prompt_the_model_got(llm, start) == f"Kindly help me with this: {PROMPT}"
    assert len(paraphraser.asked) == 1


def test_an_unfaithful_or_missing_paraphrase_gives_the_template_one(
        llm: ScriptedLlm, make_proxy: Any, paraphraser: Paraphraser, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "paraphrases.jsonl"
    monkeypatch.setenv(_model_paraphrase.ENDPOINT_ENV, paraphraser.url)
    paraphraser.answer = lambda text: "What is the weather like in Paris?"  # drops the code span
    with caplog.at_level(logging.WARNING, logger="chaosproxy"):
        proxy = make_proxy(by_model(cache), to=llm.url)
        start = len(llm.requests)
        first_turn(client(proxy.url))
    got = prompt_the_model_got(llm, start)
    assert got != PROMPT and "`call get_weather(city=Paris)`" in got  # reworded by the templates, code kept
    assert len(paraphraser.asked) == 1 and not cache.exists()
    assert "keeps the prompt's numbers, names and code" in caplog.text
    [fault] = proxy.events("fault")
    assert fault["fault"] == "prompt_paraphrase"


def test_by_model_is_checked_and_its_cache_lies_with_the_scenario(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="needs `model`"):
        parse_scenario("rules:\n  - name: p\n    fault: {type: prompt_paraphrase, by: model}\n")
    text = "rules:\n  - name: p\n    fault: {type: prompt_paraphrase, by: model, model: m, cache: ../elsewhere.jsonl}\n"
    with pytest.raises(ScenarioError, match="outside the folders"):
        parse_scenario(text, files=ScenarioFiles.under([tmp_path]))
    relative = parse_scenario(text.replace("../elsewhere", "cache"), files=ScenarioFiles.under([tmp_path]))
    assert relative.rules[0].fault.cache == tmp_path.resolve() / "cache.jsonl"
    # the templates need no file, so a scenario sent over the control API may use them
    parse_scenario("rules:\n  - name: p\n    fault: {type: prompt_paraphrase}\n", files=ScenarioFiles.under([]))
