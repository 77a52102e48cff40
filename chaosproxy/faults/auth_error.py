from __future__ import annotations

from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Respond
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.faults.http_error import error_body


@register
class AuthErrorFault(Fault):
    """Reject the call as unauthenticated (401 + WWW-Authenticate) or forbidden (403)."""

    type: Literal["auth_error"] = "auth_error"
    status: Literal[401, 403] = 401
    error: str = Field("invalid_token", pattern=r"^[\x21\x23-\x5b\x5d-\x7e]+$",
                       description="the Bearer error code (RFC 6750)")
    description: str = Field("The access token expired", description="error_description")

    component = Component.TRANSITION
    level = Level.HTTP
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> Respond:
        body, headers = error_body(self.status, self.description)
        challenge = self.description.replace("\\", "\\\\").replace('"', '\\"')
        headers["WWW-Authenticate"] = f'Bearer error="{self.error}", error_description="{challenge}"'
        return Respond(self.status, body, headers)
