"""What adapters and the engine hold and call: the tracer (`Tracing`), the span of one call
(`CallTrace`) and of a drill run (`RunSpan`). As they are here they do nothing: `NO_TRACING` is the tracer
while export is off, and costs an adapter one attribute check (`tracing.on`) per call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from chaosproxy.engine.actions import Action
from chaosproxy.telemetry.log_schema import Outcome

if TYPE_CHECKING:
    from chaosproxy.engine.message import Message


class CallTrace:
    """The span of one proxied call. The switched-off tracer never makes one."""

    __slots__ = ()

    def fault(self, fields: Mapping[str, Any], action: Action) -> None:
        """A fault fired on this call; `fields` are its log line's."""

    def end(self, outcome: str = Outcome.OK, *, status: int | None = None,
            reply: Mapping[str, Any] | None = None) -> None:
        """The call is over: `outcome` as in the call log, the HTTP `status`, the JSON-RPC `reply`."""

    def task(self, task_id: str | None, state: str | None) -> None:
        """The A2A task the call is about (`a2a.task.id`), and its state as the agent got it (`a2a.task.state`)."""


class Tracing:
    """No tracing: what the proxy holds unless export is on. Adapters check `on` and go no further."""

    on = False

    def start(self, msg: Message, *, network: str, url: str | None = None,
              session_id: str | None = None, root: int = 0) -> dict[str, str]:
        """Open the span of the call `msg` starts and put the proxy's context into its `_meta`.

        Returns the HTTP headers to forward in place of the agent's `traceparent`/`tracestate`.
        `network` is `tcp` or `pipe`; `url` the upstream URL of an HTTP call (the real server's
        address); `session_id` the MCP session (the `Mcp-Session-Id`, or a legacy `sessionId`);
        `root` what `root_draw` drew for it, if it was asked.
        """
        return {}

    def root_draw(self, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> int | None:
        """The sampler's decision for an HTTP call, taken before a Message is made for it, when the
        call cannot name a parent: 0 when it is left out, else the random bits of its ids (for
        `start(root=...)`). None when it may name a parent or every call is kept: `start` decides."""
        return None

    def run_span(self, name: str, attributes: Mapping[str, Any]) -> RunSpan:
        """A root span for a drill run (see `RunSpan`)."""
        return RunSpan()

    def shutdown(self) -> None:
        """Export what is left; called once when the proxy stops."""


class RunSpan:
    """A drill run's root span; `environment()` gives its agent TRACEPARENT and BAGGAGE."""

    trace_id: str | None = None

    def environment(self, baggage: Mapping[str, Any]) -> dict[str, str]:
        return {}

    def end(self, status: str) -> None:
        """The run is over with `status` (passed, failed, timeout, error)."""


NO_TRACING = Tracing()
