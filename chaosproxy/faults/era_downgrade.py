from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from chaosproxy.engine.actions import Reply
from chaosproxy.engine.message import Phase
from chaosproxy.faults._input_required import params_of
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.protocols.mcp import PROTOCOL_VERSION_META, error_reply

METHOD_NOT_FOUND = -32601
UNSUPPORTED_PROTOCOL_VERSION = -32022
HANDSHAKE_ERA = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
Version = Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]


@register
class EraDowngrade(Fault):
    """The server answers as a handshake-era one: server/discover is unknown, or 2026-07-28 unsupported."""

    type: Literal["era_downgrade"] = "era_downgrade"
    answer: Literal["method_not_found", "unsupported_version"] = Field("method_not_found", description=(
        "method_not_found: server/discover gets -32601, as from a server that predates it (a dual-era client "
        "falls back to initialize); unsupported_version: every 2026-era request gets -32022 listing "
        "`supported` (a client pinned to 2026-07-28 fails; a dual-era one falls back)"))
    supported: list[Version] = Field(default_factory=lambda: list(HANDSHAKE_ERA), min_length=1, max_length=16,
                                     description="the versions an unsupported_version error lists")

    component = Component.TRANSITION
    level = Level.JSONRPC
    phase = Phase.REQUEST

    def act(self, ctx: FaultContext) -> Reply | None:
        msg = ctx.message
        rpc = msg.rpc or {}
        if "method" not in rpc or "id" not in rpc:
            return None
        meta = params_of(rpc).get("_meta")
        version = meta.get(PROTOCOL_VERSION_META) if isinstance(meta, dict) else None
        if self.answer == "method_not_found":
            return Reply(error_reply(msg, METHOD_NOT_FOUND, "Method not found")) \
                if msg.method == "server/discover" else None
        if not isinstance(version, str) or version in self.supported:
            return None  # a handshake-era request (its version was negotiated by initialize), or one it accepts
        return Reply(error_reply(msg, UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
                                 {"supported": self.supported, "requested": version[:32]}))
