"""Provider-shaped errors: what OpenAI and Anthropic really answer when they fail, status, headers and body.

The SDKs decide on these whether to retry (status, `retry-after-ms`, `retry-after`, `x-should-retry`)
and which exception to raise (by status, and Anthropic's 529 `overloaded_error`), so the shapes
follow the providers' own, message texts included.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import orjson

from chaosproxy.engine.actions import Respond
from chaosproxy.protocols.llm import ANTHROPIC, OPENAI_RESPONSES

type Kind = Literal["rate_limit", "overloaded", "server_error", "quota", "context_length"]

# kind -> status, error code, error type, message
_OPENAI: dict[str, tuple[int, str | None, str, str]] = {
    "rate_limit": (429, "rate_limit_exceeded", "requests",
                   "Rate limit reached for {model} in organization org-chaosproxy on requests per min (RPM): "
                   "Limit 60, Used 60, Requested 1. Please try again in {retry}s."),
    "overloaded": (503, "server_is_overloaded", "server_error",
                   "The server is overloaded or not ready yet."),
    "server_error": (500, None, "server_error",
                     "The server had an error while processing your request. Sorry about that!"),
    "quota": (429, "insufficient_quota", "insufficient_quota",
              "You exceeded your current quota, please check your plan and billing details."),
    "context_length": (400, "context_length_exceeded", "invalid_request_error",
                       "This model's maximum context length is 128000 tokens. However, your messages resulted "
                       "in 131072 tokens. Please reduce the length of the messages."),
}
_RESPONSES_CONTEXT_LENGTH = ("Your input exceeds the context window of this model. "
                             "Please adjust your input and try again.")
# kind -> status, error type, message
_ANTHROPIC: dict[str, tuple[int, str, str]] = {
    "rate_limit": (429, "rate_limit_error",
                   "This request would exceed the rate limit for your organization of 50 requests per minute."),
    "overloaded": (529, "overloaded_error", "Overloaded"),
    "server_error": (500, "api_error", "Internal server error"),
    "quota": (400, "invalid_request_error", "Your credit balance is too low to access the Anthropic API. "
                                            "Please go to Plans & Billing to upgrade or purchase credits."),
    "context_length": (400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
}


def _openai_error(api: str, kind: str, model: str | None, retry_after_s: float | None) -> dict[str, Any]:
    _, code, kind_type, message = _OPENAI[kind]
    param = None
    if kind == "context_length":  # the parameter that is too long: the Responses API has `input`, not `messages`
        message, param = (_RESPONSES_CONTEXT_LENGTH, "input") if api == OPENAI_RESPONSES else (message, "messages")
    text = message.format(model=model or "the model", retry=f"{retry_after_s or 1:g}")
    return {"message": text, "type": kind_type, "param": param, "code": code}


def _anthropic_error(kind: str) -> dict[str, Any]:
    _, kind_type, message = _ANTHROPIC[kind]
    return {"type": "error", "error": {"type": kind_type, "message": message}}


def error_response(api: str, kind: str, *, model: str | None, retry_after_s: float | None,
                   should_retry: bool | None) -> Respond:
    """The HTTP error a provider answers with, instead of calling upstream."""
    headers = {"Content-Type": "application/json"}
    if api == ANTHROPIC:
        status = _ANTHROPIC[kind][0]
        body: dict[str, Any] = _anthropic_error(kind)
        headers["request-id"] = "req_chaosproxy"
    else:
        status = _OPENAI[kind][0]
        body = {"error": _openai_error(api, kind, model, retry_after_s)}
        headers["x-request-id"] = "req_chaosproxy"
    if retry_after_s is not None:
        headers["retry-after"] = str(math.ceil(retry_after_s))
        headers["retry-after-ms"] = str(round(retry_after_s * 1000))
    if should_retry is not None:
        headers["x-should-retry"] = "true" if should_retry else "false"
    effect = {"error": error_name(api, kind), "retry_after_s": retry_after_s, "should_retry": should_retry}
    return Respond(status, orjson.dumps(body), headers,
                   effect={key: value for key, value in effect.items() if value is not None})


def error_name(api: str, kind: str) -> str:
    """The error's code (OpenAI) or type (Anthropic): what the agent's SDK reports, and the log line says."""
    if api == ANTHROPIC:
        return _ANTHROPIC[kind][1]
    _, code, kind_type, _ = _OPENAI[kind]
    return code or kind_type


def stream_error(api: str, kind: str, model: str | None) -> tuple[str, bytes]:
    """The error event a provider sends mid-stream after a 200: its event name ("" for none) and data."""
    if api == ANTHROPIC:
        return "error", orjson.dumps(_anthropic_error(kind))
    error = _openai_error(api, kind, model, None)
    if api == OPENAI_RESPONSES:
        return "error", orjson.dumps({"type": "error", "code": error["code"] or error["type"],
                                      "message": error["message"], "param": error["param"]})
    return "", orjson.dumps({"error": error})
