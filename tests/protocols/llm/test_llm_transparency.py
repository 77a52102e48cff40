"""The gateway's transparency oracle: a recorded corpus of provider replies (tests/helpers/llm_corpus.py), every
format, streamed and not, relayed under no rules, under rules that cannot match, and under rules that match
but whose fault does not fire. In each case the agent gets the upstream's bytes, and the log has no fault."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.llm_corpus import CORPUS, CorpusUpstream, Entry, corpus_upstream, request_for  # noqa: F401
from tests.helpers.llm_support import rules
from tests.helpers.support import call_lines

MODEL_FAULTS = [{"type": "malformed_tool_call"}, {"type": "malformed_tool_call", "kind": "wrong_types"},
                {"type": "hallucinated_tool_call"}, {"type": "empty_completion"},
                {"type": "empty_completion", "mode": "length"}, {"type": "llm_stream_error", "after_events": 0},
                {"type": "prompt_typos"}, {"type": "llm_error"}, {"type": "rename_tool", "tool": "get_weather",
                                                                   "to": "weather_now"}]
RULE_SETS: dict[str, dict[str, Any]] = {
    "no rules": {"rules": []},
    "rules that cannot match": rules(
        *[{"match": {"model": "other-model"}, "fault": fault} for fault in MODEL_FAULTS],
        {"match": {"api": "openai-chat", "model": "claude-*"}, "fault": {"type": "empty_completion"}},
        {"match": {"tool": "no_such_tool"}, "fault": {"type": "malformed_tool_call", "kind": "wrong_types"}},
        {"match": {"header": {"x-env": "staging"}}, "fault": {"type": "llm_stream_error", "after_events": 1}}),
    "rules that match but do not fire": rules(
        {"fault": {"type": "malformed_tool_call"}, "after": 1000},
        {"match": {"tool": "get_weather"}, "fault": {"type": "malformed_tool_call", "kind": "wrong_types"},
         "probability": 0.0},
        {"fault": {"type": "hallucinated_tool_call", "style": "case"}, "every": 1000, "after": 1},
        {"fault": {"type": "empty_completion"}, "after": 1000},
        {"fault": {"type": "llm_stream_error", "after_events": 100_000}},
        {"fault": {"type": "prompt_typos"}, "probability": 0.0},
        {"fault": {"type": "rename_tool", "tool": "get_weather", "to": "weather_now"}, "probability": 0.0}),
}


def relay(url: str, entry: Entry, *, split: int = 0) -> tuple[int, dict[str, str], bytes]:
    """The entry's request through `url`: status, headers and the body exactly as it arrived."""
    headers = {"x-corpus": entry.name, **({"x-corpus-split": str(split)} if split else {})}
    with httpx.Client(timeout=10) as client, client.stream(
            "POST", url + entry.path, json=request_for(entry), headers=headers) as response:
        return response.status_code, dict(response.headers), b"".join(response.iter_raw())


def assert_untouched(proxy: Any, count: int) -> None:
    calls = call_lines(proxy, count)
    assert len(calls) == count and all(call["faults"] == [] for call in calls)
    assert proxy.events("fault") == [] and proxy.events("error") == []


@pytest.mark.parametrize("rule_set", RULE_SETS)
@pytest.mark.parametrize("name", CORPUS)
def test_the_agent_gets_the_upstreams_bytes(corpus_upstream: CorpusUpstream, make_proxy: Any, name: str,
                                            rule_set: str) -> None:
    entry = CORPUS[name]
    proxy = make_proxy(RULE_SETS[rule_set], to=corpus_upstream.url)
    start = len(corpus_upstream.requests)
    status, headers, body = relay(proxy.url, entry)
    assert status == 200 and body == entry.body
    assert headers["content-type"].startswith("text/event-stream" if entry.stream else "application/json")
    assert corpus_upstream.requests[start:] == [request_for(entry)]  # the request went as the agent sent it
    assert_untouched(proxy, 1)


STREAMS = [name for name, entry in CORPUS.items() if entry.stream]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(STREAMS), split=st.integers(1, 97))
def test_streams_cut_anywhere_still_pass_untouched(corpus_upstream: CorpusUpstream, make_proxy: Any, name: str,
                                                   split: int) -> None:
    # the upstream writes its stream in pieces of `split` bytes: events, and lines, straddle reads
    proxy = make_proxy(RULE_SETS["rules that match but do not fire"], to=corpus_upstream.url)
    status, _, body = relay(proxy.url, CORPUS[name], split=split)
    assert status == 200 and body == CORPUS[name].body
    assert_untouched(proxy, 1)
