from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import short
from chaosproxy.faults._input_required import params_of
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register

HEADERS = {"name": "mcp-name", "method": "mcp-method"}
NAMED_BY = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}  # what Mcp-Name mirrors


@register
class HeaderMismatch(Fault):
    """Mcp-Name or Mcp-Method says something else than the body (a 2026-era server answers 400, -32020)."""

    type: Literal["header_mismatch"] = "header_mismatch"
    header: Literal["name", "method"] = Field("name", description="which mirrored header disagrees: "
                                                                   "Mcp-Name (tools/call, prompts/get, "
                                                                   "resources/read) or Mcp-Method (any request)")
    side: Literal["header", "body"] = Field("header", description=(
        "which side is changed: the header (the body goes as the agent sent it: a gateway routing on the "
        "header sends the call elsewhere) or the body (the header goes as sent: the server would run "
        "something other than what was routed)"))
    value: str = Field("chaosproxy-mismatch", pattern=r"^[\x21-\x7e]{1,128}$",
                       description="what the changed side says (printable ASCII, no spaces)")

    component = Component.TRANSITION
    level = Level.MCP
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> Rewrite | None:
        msg = ctx.message
        rpc = msg.rpc
        name = HEADERS[self.header]
        sent = msg.headers.get(name)
        if rpc is None or "method" not in rpc or sent is None:
            return None  # no mirrored header to disagree with (stdio, the handshake era, a notification)
        params = params_of(rpc)
        field = NAMED_BY.get(str(rpc["method"])) if self.header == "name" else "method"
        if field is None:
            return None
        body_says = rpc["method"] if field == "method" else params.get(field)
        effect: dict[str, Any] = {"header": "Mcp-Name" if self.header == "name" else "Mcp-Method", "changed": self.side}
        if self.side == "header":
            if sent == self.value:
                return None
            return Rewrite(rpc, headers={name: self.value},
                           effect=effect | {"header_says": short(self.value), "body_says": short(body_says)})
        if body_says == self.value:
            return None
        changed = {**rpc, "method": self.value} if field == "method" \
            else {**rpc, "params": {**params, field: self.value}}
        return Rewrite(changed, headers={name: sent},
                       effect=effect | {"header_says": short(sent), "body_says": short(self.value)})
