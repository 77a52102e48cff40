"""LLM-gateway mode through `chaosproxy mitm`: the `openai` SDK reaching an HTTPS model API (the scripted
model behind TLS on loopback) through the intercepting proxy, as an agent behind HTTPS_PROXY would."""

from __future__ import annotations

import io
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

from chaosproxy.adapters.mitm import CA_CERT, HostPatterns, MitmProxy
from chaosproxy.demo import llm_server
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.telemetry.log import PerturbationLog
from tests.adapters.test_mitm import confdir, tls_files  # noqa: F401
from tests.helpers.llm_support import CHAT_TOOLS, PROMPT, rules
from tests.helpers.support import ServerLoop, call_lines, log_events


@pytest.fixture(scope="module")
def https_model(server_loop: ServerLoop, tls_files: dict[str, Path]) -> Iterator[tuple[int, llm_server.ScriptedModel]]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls_files["cert"], tls_files["key"])
    model = llm_server.ScriptedModel()

    async def start() -> tuple[web.AppRunner, int]:
        runner = web.AppRunner(model.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    runner, port = server_loop.run(start())
    yield port, model
    server_loop.run(runner.cleanup())


class Mitm:
    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def events(self, kind: str) -> list[dict[str, Any]]:
        return log_events(self.log_path, kind)


@pytest.mark.parametrize("stream", [False, True])
def test_model_api_through_mitm(server_loop: ServerLoop, https_model: tuple[int, llm_server.ScriptedModel],
                                confdir: Path, tls_files: dict[str, Path], tmp_path: Path, stream: bool) -> None:
    port, model = https_model
    scenario = rules({"fault": {"type": "rename_tool", "tool": "get_weather", "to": "weather_now"}},
                     {"fault": {"type": "prompt_typos", "rate": 0.2}})
    log = PerturbationLog(io.FileIO(tmp_path / "log.jsonl", "w"), run_id="test", seed=3)
    engine = Engine(parse_scenario(json.dumps(scenario)), seed=3, log=log)
    proxy = MitmProxy(engine, HostPatterns.parse("localhost"), confdir=confdir, upstream_ca=tls_files["ca"])
    proxy_port = server_loop.run(proxy.start("127.0.0.1", 0))
    try:
        http_client = openai.DefaultHttpxClient(proxy=f"http://127.0.0.1:{proxy_port}",
                                                verify=ssl.create_default_context(cafile=confdir / CA_CERT))
        client = openai.OpenAI(base_url=f"https://localhost:{port}/v1", api_key="sk-test", max_retries=0,
                               http_client=http_client)
        messages = [{"role": "user", "content": PROMPT}]
        if stream:
            with client.chat.completions.stream(model="gpt-test", messages=messages, tools=CHAT_TOOLS) as events:
                reply = events.get_final_completion()
        else:
            reply = client.chat.completions.create(model="gpt-test", messages=messages, tools=CHAT_TOOLS)
        call = reply.choices[0].message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        seen = model.requests[-1]
        assert [t["function"]["name"] for t in seen["tools"]] == ["weather_now", "search_docs"]
        assert seen["messages"][0]["content"] != PROMPT
        mitm = Mitm(tmp_path / "log.jsonl")
        assert {(e["fault"], e["api"]) for e in mitm.events("fault")} == {
            ("rename_tool", "openai-chat"), ("prompt_typos", "openai-chat")}
        assert call_lines(mitm, 1)[0]["api"] == "openai-chat"
    finally:
        server_loop.run(proxy.stop())
        log.close()
