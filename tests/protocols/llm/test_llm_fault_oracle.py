"""The gateway's fault oracle: for each model-API fault and each recorded reply (tests/helpers/llm_corpus.py), what
the SDK accumulates through the proxy differs from what it accumulates with no fault exactly as the fault
documents, and the log has a fault line exactly when it did (one per tool call a call fault changed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import jiter
import openai
import orjson
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.helpers.llm_corpus import CORPUS, CorpusUpstream, Entry, corpus_upstream, request_for  # noqa: F401
from tests.helpers.llm_support import rules

type Outcome = dict[str, Any]
ANTHROPIC_RAW = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                 "message_delta", "message_stop"}
TOOLS = [name for name, entry in CORPUS.items() if entry.tools]


def outcome(base: str, entry: Entry) -> Outcome:
    """What the SDK makes of the entry's reply: `result` (the final message, completion or response) and
    how many events it read, or the error it raised (`error`, and after how many events)."""
    kwargs = {key: value for key, value in request_for(entry).items() if key != "stream"}
    headers = {"x-corpus": entry.name}
    seen = 0
    try:
        if entry.api == "anthropic":
            client = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0, default_headers=headers)
            if not entry.stream:
                return {"result": client.messages.create(**kwargs).model_dump()}
            with client.messages.stream(**kwargs) as stream:
                for event in stream:
                    seen += event.type in ANTHROPIC_RAW
                return {"result": stream.get_final_message().model_dump(), "events": seen}
        client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, default_headers=headers)
        if entry.api == "openai-chat":
            if not entry.stream:
                return {"result": client.chat.completions.create(**kwargs).model_dump()}
            state = ChatCompletionStreamState(input_tools=kwargs["tools"])  # the stream helper's accumulator
            for chunk in client.chat.completions.create(**kwargs, stream=True):
                state.handle_chunk(chunk)
                seen += 1
            try:
                final = state.get_final_completion()
            except openai.LengthFinishReasonError as cut:  # the helper refuses a cut-off reply, but has it
                final = cut.completion
            return {"result": final.model_dump(exclude={"choices": {"__all__": {"message": {"parsed"}}}}),
                    "events": seen}
        if not entry.stream:
            return {"result": client.responses.create(**kwargs).model_dump()}
        with client.responses.stream(**kwargs) as stream:
            events = list(stream)
        errors = [i for i, event in enumerate(events) if event.type == "error"]
        if errors:  # the Responses API reports a stream error as an event, then response.failed
            return {"error": events[errors[0]].code, "after": errors[0], "then": events[-1].type}
        return {"result": events[-1].response.model_dump(exclude={"output_text"}), "events": len(events)}
    except (openai.APIError, anthropic.APIError) as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        return {"error": type(exc).__name__, "status": getattr(exc, "status_code", None), "after": seen,
                "code": error.get("code") or error.get("type")}
    except ValueError as exc:  # the SDK could not read what the model sent (broken tool input)
        return {"error": "ValueError", "after": seen, "message": str(exc)[:60]}


# --- what each fault documents, as a change of the clean outcome -----------------------------------------

def on_calls(change: Callable[[str, str], tuple[str, str]]) -> Callable[[Outcome, Entry], Outcome]:
    """Each tool call's (name, arguments as JSON text) changed by `change`, all else as it was."""
    def expect(clean: Outcome, entry: Entry) -> Outcome:
        result = json.loads(json.dumps(clean["result"]))
        if entry.api == "openai-chat":
            for call in result["choices"][0]["message"]["tool_calls"]:
                function = call["function"]
                function["name"], function["arguments"] = change(function["name"], function["arguments"])
        elif entry.api == "openai-responses":
            for item in result["output"]:
                if item["type"] == "function_call":
                    item["name"], item["arguments"] = change(item["name"], item["arguments"])
        else:
            added = 0  # a stream with no input_json_delta gets one for a call whose input changed
            for block in result["content"]:
                if block["type"] == "tool_use":
                    before = orjson.dumps(block["input"]).decode()
                    block["name"], text = change(block["name"], before)
                    block["input"] = jiter.from_json(text.encode(), partial_mode=True)  # as the SDK reads input
                    added += text != before and entry.stream and b"input_json_delta" not in entry.body
            if added:
                return {**clean, "result": result, "events": clean["events"] + added}
        return {**clean, "result": result}
    return expect


def retyped(name: str, arguments: str) -> tuple[str, str]:
    kinds = {str: lambda v: [v], int: str, bool: lambda v: "true" if v else "false"}
    return name, orjson.dumps({k: kinds[type(v)](v) for k, v in json.loads(arguments).items()}).decode()


def truncated(name: str, arguments: str) -> tuple[str, str]:
    text = orjson.dumps(json.loads(arguments)).decode()
    return name, text[:len(text) // 2]


def camel(name: str, arguments: str) -> tuple[str, str]:
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest), arguments


def emptied(mode: str) -> Callable[[Outcome, Entry], Outcome]:
    """No tool calls, no reasoning, no text (or its first characters: a half of a whole reply, the first
    40 of a stream), and the provider's stop reason for it."""
    def expect(clean: Outcome, entry: Entry) -> Outcome:
        result = json.loads(json.dumps(clean["result"]))
        cut = (lambda text: text[:len(text) // 2] if not entry.stream else text[:40]) if mode == "length" \
            else (lambda text: "")
        if entry.api == "openai-chat":
            choice = result["choices"][0]
            message = choice["message"]
            message["tool_calls"] = None
            message["content"] = cut(message["content"] or "") if message["content"] or not entry.stream else None
            choice["finish_reason"] = "length" if mode == "length" else "stop"
        elif entry.api == "anthropic":
            text = "".join(block["text"] for block in result["content"] if block["type"] == "text")
            result["content"] = [{"type": "text", "text": cut(text), "citations": None}] \
                if mode == "length" and text else []
            result["stop_reason"] = "max_tokens" if mode == "length" else "end_turn"
        else:
            result["output"] = []
            if mode == "length":
                result["status"], result["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        return {**clean, "result": result}
    return expect


AFTER = 3


def stream_error(clean: Outcome, entry: Entry) -> Outcome:
    """The provider's error event in place of the stream's fourth event: the SDK has read the first three
    (but pings, which the Anthropic SDK hides)."""
    if entry.api == "openai-responses":
        return {"error": "server_is_overloaded", "after": AFTER, "then": "response.failed"}
    relayed = [event for event in entry.events if b"data:" in event][:AFTER]
    shown = [event for event in relayed if not event.startswith(b"event: ping")]
    return {"error": "APIStatusError" if entry.api == "anthropic" else "APIError", "status": 200 if
            entry.api == "anthropic" else None, "after": len(shown),
            "code": "overloaded_error" if entry.api == "anthropic" else "server_is_overloaded"}


def provider_error(kind: str) -> Callable[[Outcome, Entry], Outcome]:
    """The provider's own error instead of a reply: the SDK's typed exception, status and error code."""
    openai_errors = {"rate_limit": ("RateLimitError", 429, "rate_limit_exceeded"),
                     "overloaded": ("InternalServerError", 503, "server_is_overloaded"),
                     "quota": ("RateLimitError", 429, "insufficient_quota"),
                     "context_length": ("BadRequestError", 400, "context_length_exceeded")}
    anthropic_errors = {"rate_limit": ("RateLimitError", 429, "rate_limit_error"),
                        "overloaded": ("OverloadedError", 529, "overloaded_error"),
                        "quota": ("BadRequestError", 400, "invalid_request_error"),
                        "context_length": ("BadRequestError", 400, "invalid_request_error")}

    def expect(clean: Outcome, entry: Entry) -> Outcome:
        error, status, code = (anthropic_errors if entry.api == "anthropic" else openai_errors)[kind]
        return {"error": error, "status": status, "after": 0, "code": code}
    return expect


def whole_anthropic_input(entry: Entry) -> bool:
    """A whole Anthropic reply carries tool input as a JSON object: only wrong_types can break it."""
    return entry.api == "anthropic" and not entry.stream


def has_output(entry: Entry) -> bool:
    """A Chat Completions refusal is no output empty_completion takes away (its whole reply keeps it)."""
    return entry.name != "chat_refusal"


def longer_than(after: int) -> Callable[[Entry], bool]:
    return lambda entry: entry.stream and sum(b"data:" in event for event in entry.events) > after


CASES: dict[str, tuple[dict[str, Any], Callable[[Entry], bool], Callable[[Outcome, Entry], Outcome],
                       Callable[[Entry], int]]] = {
    # case -> (the fault, whether it applies to a reply, the outcome it documents, how many lines it writes)
    "malformed_tool_call wrong_types": ({"type": "malformed_tool_call", "kind": "wrong_types"},
                                        lambda e: bool(e.tools), on_calls(retyped), lambda e: len(e.tools)),
    "malformed_tool_call truncated": ({"type": "malformed_tool_call", "kind": "truncated"},
                                      lambda e: bool(e.tools) and not whole_anthropic_input(e), on_calls(truncated),
                                      lambda e: len(e.tools)),
    "hallucinated_tool_call case": ({"type": "hallucinated_tool_call", "style": "case"}, lambda e: bool(e.tools),
                                    on_calls(camel), lambda e: len(e.tools)),
    "empty_completion empty": ({"type": "empty_completion"}, has_output, emptied("empty"), lambda e: 1),
    "empty_completion length": ({"type": "empty_completion", "mode": "length"}, has_output, emptied("length"),
                                lambda e: 1),
    "llm_stream_error": ({"type": "llm_stream_error", "after_events": AFTER}, longer_than(AFTER), stream_error,
                         lambda e: 1),
    **{f"llm_error {kind}": ({"type": "llm_error", "kind": kind, "retry_after_s": 0}, lambda e: True,
                             provider_error(kind), lambda e: 1)
       for kind in ("rate_limit", "overloaded", "quota", "context_length")},
}


@pytest.mark.parametrize("name", CORPUS)
@pytest.mark.parametrize("case", CASES)
def test_each_fault_changes_what_it_documents_and_logs_exactly_that(
        corpus_upstream: CorpusUpstream, make_proxy: Any, case: str, name: str) -> None:
    entry = CORPUS[name]
    fault, applies, documented, lines = CASES[case]
    clean = outcome(make_proxy("rules: []", to=corpus_upstream.url).url, entry)
    proxy = make_proxy(rules({"fault": fault}), to=corpus_upstream.url)
    faulted = outcome(proxy.url, entry)
    expected, count = (documented(clean, entry), lines(entry)) if applies(entry) else (clean, 0)
    if fault["type"] == "empty_completion" and "events" in faulted:
        expected["events"] = faulted["events"]  # which events a stream's format leaves out is its own affair
    if case == "malformed_tool_call truncated" and entry.api == "anthropic" and faulted.get("error") == "ValueError":
        expected = {"error": "ValueError", "after": faulted["after"], "message": "Unable to parse tool parameter JSON"}
        faulted["message"] = faulted["message"][:len(expected["message"])]  # the SDK refused the broken input
    assert faulted == expected
    fired = proxy.events("fault")
    assert len(fired) == count and all(line["fault"] == fault["type"] for line in fired)
    assert (faulted != clean) == bool(count)
    assert all(0 < len(orjson.dumps(line["effect"])) <= MAX_EFFECT for line in fired)  # each says what it did


MAX_EFFECT = 400  # bytes of a fault line's `effect`: what the fault did, not what it did it to


@pytest.mark.parametrize("name", ["chat_whole_parallel", "anthropic_thinking_tools", "responses_reasoning_tools"])
@pytest.mark.parametrize("fault", [{"type": "prompt_typos", "rate": 0.2}, {"type": "prompt_paraphrase"}])
def test_prompt_faults_change_the_newest_user_turn_alone(corpus_upstream: CorpusUpstream, make_proxy: Any,
                                                         fault: dict[str, Any], name: str) -> None:
    entry = CORPUS[name]
    proxy = make_proxy(rules({"fault": fault}), to=corpus_upstream.url)
    start = len(corpus_upstream.requests)
    assert outcome(proxy.url, entry) == outcome(corpus_upstream.url, entry)  # the reply is the model's own
    sent, _ = corpus_upstream.requests[start:]
    asked = request_for(entry)
    prompt = (lambda body: body["input"]) if entry.api == "openai-responses" else (
        lambda body: body["messages"][-1]["content"])
    assert prompt(sent) != prompt(asked)
    assert {**sent, **{key: None for key in ("input", "messages")}} == {**asked, **{key: None for key in (
        "input", "messages")}}
    [line] = proxy.events("fault")
    assert line["effect"]["length"] == [len(prompt(asked)), len(prompt(sent))] and line["effect"]["chars"] > 0
    first = next(i for i, (a, b) in enumerate(zip(prompt(asked), prompt(sent), strict=False)) if a != b)
    assert line["effect"]["at"][0] == first  # where the prompt first changed


EFFECTS = {  # fault -> the effect its line has on chat_parallel_tools (get_weather first, search_docs second)
    "malformed_tool_call wrong_types": {"kind": "wrong_types", "changed": {
        "arguments.city": "replaced (string to array)", "arguments.unit": "replaced (string to array)"}},
    "malformed_tool_call truncated": {"kind": "truncated", "arguments": {"chars": 17, "at": [16],
                                                                        "length": [33, 16]}},
    "hallucinated_tool_call case": {"tool": {"called": "get_weather", "sent_as": "getWeather"}},
    "empty_completion empty": {"mode": "empty", "stop": "stop"},
    "empty_completion length": {"mode": "length", "stop": "length"},
    "llm_stream_error": {"after_events": AFTER, "event": "", "error": "server_is_overloaded"},
    "llm_error rate_limit": {"status": 429, "error": "rate_limit_exceeded", "retry_after_s": 0},
}


@pytest.mark.parametrize("case", EFFECTS)
def test_each_fault_line_says_what_the_fault_did(corpus_upstream: CorpusUpstream, make_proxy: Any, case: str) -> None:
    proxy = make_proxy(rules({"fault": CASES[case][0]}), to=corpus_upstream.url)
    outcome(proxy.url, CORPUS["chat_parallel_tools"])
    assert proxy.events("fault")[0]["effect"] == EFFECTS[case]
