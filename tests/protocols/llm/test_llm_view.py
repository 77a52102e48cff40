"""The LLM-gateway view without sockets: which paths speak which API, the match keys, bounded memory."""

from __future__ import annotations

import pytest

from chaosproxy.adapters import llm_relay
from chaosproxy.engine.scenario import ScenarioError, parse_scenario
from chaosproxy.protocols.llm import api_for_path


@pytest.mark.parametrize("path,api", [
    ("/v1/chat/completions", "openai-chat"), ("/openai/deployments/x/chat/completions", "openai-chat"),
    ("/v1/messages", "anthropic"), ("/v1/responses", "openai-responses"), ("/v1/responses/", "openai-responses"),
    ("/v1/embeddings", None), ("/v1/messages/count_tokens", None), ("/mcp", None)])
def test_api_by_path(path: str, api: str | None) -> None:
    assert api_for_path(path) == api


def test_match_keys_api_and_model() -> None:
    scenario = parse_scenario("rules:\n  - name: r\n    match: {api: 'openai-*', model: 'gpt-4*'}\n"
                              "    fault: {type: prompt_typos}\n")
    assert (scenario.rules[0].match.api, scenario.rules[0].match.model) == ("openai-*", "gpt-4*")
    with pytest.raises(ScenarioError, match=r"<scenario>:3: rules\[0\].match.api: api 'gemini' matches none of"):
        parse_scenario("rules:\n  - name: r\n    match: {api: gemini}\n    fault: {type: prompt_typos}\n")


def test_llm_fault_parameters_are_validated() -> None:
    with pytest.raises(ScenarioError, match="kind quota is an error no retry can fix"):
        parse_scenario("rules:\n  - name: r\n    fault: {type: llm_error, kind: quota, should_retry: true}\n")
    with pytest.raises(ScenarioError, match="rate"):
        parse_scenario("rules:\n  - name: r\n    fault: {type: prompt_typos, rate: 2}\n")


def test_memory_is_bounded() -> None:
    memory = llm_relay.Memory()
    for i in range(llm_relay.MAX_REMEMBERED + 10):
        memory.said.remember(f"call_{i}", ("tool", "{}"))
    assert len(memory.said) == llm_relay.MAX_REMEMBERED and "call_0" not in memory.said


def test_a_relay_bug_fails_open(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from chaosproxy.engine.core import Engine
    from chaosproxy.engine.message import Message, Phase
    from chaosproxy.protocols.llm import openai_chat
    from chaosproxy.telemetry.log import PerturbationLog

    stream = io.BytesIO()
    engine = Engine(parse_scenario("rules:\n  - name: r\n    fault: {type: prompt_typos}\n"), seed=1,
                    log=PerturbationLog(stream, run_id="t", seed=1))
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hello there"}]}'

    def broken(_: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(openai_chat, "parse_request", broken)
    msg = Message("http", Phase.REQUEST, http_method="POST", path="/v1/chat/completions", body=body)
    assert llm_relay.LlmRelay(engine).open(msg) is None and msg.body == body
    assert b'"event":"error"' in stream.getvalue() and b"a bug" in stream.getvalue()
