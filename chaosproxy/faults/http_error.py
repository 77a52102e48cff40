from __future__ import annotations

from http import HTTPStatus
from typing import Literal

import orjson
from pydantic import Field

from chaosproxy.engine.actions import Respond
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register


def error_body(status: int, message: str | None = None) -> tuple[bytes, dict[str, str]]:
    """A small JSON error body of the kind API gateways send, and its content type."""
    text = message if message is not None else HTTPStatus(status).phrase
    return orjson.dumps({"error": {"code": status, "message": text}}), {"Content-Type": "application/json"}


@register
class HttpErrorFault(Fault):
    """Answer with an HTTP error status and body instead of calling upstream."""

    type: Literal["http_error"] = "http_error"
    status: int = Field(500, ge=400, le=599)
    body: str | None = Field(None, description="response body; default: a JSON error object")
    headers: dict[str, str] = Field(default_factory=dict)

    component = Component.TRANSITION
    level = Level.HTTP
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> Respond:
        if self.body is None:
            body, headers = error_body(self.status)
        else:
            body, headers = self.body.encode(), {"Content-Type": "text/plain; charset=utf-8"}
        return Respond(self.status, body, headers | self.headers)
