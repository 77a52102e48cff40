"""A shared model-API gateway gives each agent its own rules by `match.header` on X-Chaosproxy-Agent (the
Inspect integration puts each sample-epoch's rules in force that way). A rule on the tool calls in the
model's reply must see the agent's request headers: before the fix it saw only the synthetic
Content-Type of the call's view and never fired."""

from __future__ import annotations

import json
import urllib.request

from chaosproxy.embedded import EmbeddedProxy
from tests.helpers.llm_support import CHAT_TOOLS, PROMPT, llm  # noqa: F401  (the fixture)


def _chat(url: str, agent: str) -> dict:
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": PROMPT}],
                       "tools": CHAT_TOOLS}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "X-Chaosproxy-Agent": agent})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_reply_tool_call_rule_matches_the_agent_header_of_its_request(llm, tmp_path):  # noqa: F811
    rule = {"name": "planner-only", "match": {"header": {"x-chaosproxy-agent": "planner"}},
            "fault": {"type": "malformed_tool_call", "kind": "truncated"}}
    with EmbeddedProxy(llm.url, {"rules": [rule]}, seed=1, log_path=tmp_path / "log.jsonl") as proxy:
        planner = _chat(proxy.url, "planner")["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        coder = _chat(proxy.url, "coder")["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        faults = proxy.log_lines("fault")
    assert json.loads(coder) == {"city": "Paris"}
    assert planner != coder  # cut off half-way
    assert [(line["rule"], line["session"]) for line in faults] == [("planner-only", "planner")]
