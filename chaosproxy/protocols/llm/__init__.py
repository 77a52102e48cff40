"""LLM-gateway mode: the agent's model API (Chat Completions, Messages, Responses) as a fault surface.

Each format module maps its requests and replies onto the view the engine already has (a tool list,
tool calls, tool results, plus the newest user turn as the prompt), so every existing fault applies
to function-calling agents unchanged; the model-API relay (`chaosproxy.adapters.llm_relay`) asks the
engine and writes the outcome back.
"""

from __future__ import annotations

OPENAI_CHAT = "openai-chat"
OPENAI_RESPONSES = "openai-responses"
ANTHROPIC = "anthropic"
APIS = (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC)

_ENDPOINTS = (("/chat/completions", OPENAI_CHAT), ("/responses", OPENAI_RESPONSES), ("/messages", ANTHROPIC))


def api_for_path(path: str) -> str | None:
    """The model API a POST path speaks (by its last segments, whatever prefix a gateway adds), or None."""
    path = path.rstrip("/")
    return next((api for suffix, api in _ENDPOINTS if path.endswith(suffix)), None)
