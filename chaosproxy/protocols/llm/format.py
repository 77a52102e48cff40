"""What a model-API format provides, written down as a Protocol, and the formats by API name.

A format is a module (anthropic, openai_chat, openai_responses): mypy checks each against `ModelFormat`
where `FORMATS` names it, so a format that drops or retypes a piece fails the type check, not a request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from chaosproxy.protocols.llm import (
    ANTHROPIC,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    anthropic,
    openai_chat,
    openai_responses,
)
from chaosproxy.protocols.llm.stream import Decisions, Editor
from chaosproxy.protocols.llm.view import Reply, Request, ToolShape


class ModelFormat(Protocol):
    """One model API's request and reply shapes, as the relay reads and writes them."""

    @property
    def API(self) -> str:
        """The API's name (a match's `api`, a call line's `api`)."""

    @property
    def TOOLS(self) -> ToolShape:
        """How its requests write function tools."""

    def parse_request(self, body: dict[str, Any]) -> Request:
        """The engine's view of a request body (raises FormatError when it is not one)."""

    def parse_reply(self, body: dict[str, Any]) -> Reply:
        """The engine's view of a whole reply (raises FormatError when it is not one)."""

    @property
    def Editor(self) -> Callable[[Decisions], Editor]:
        """The editor a streamed reply goes through, event by event."""


FORMATS: dict[str, ModelFormat] = {OPENAI_CHAT: openai_chat, ANTHROPIC: anthropic, OPENAI_RESPONSES: openai_responses}
