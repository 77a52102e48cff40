"""Prometheus metrics for a run, counted from the perturbation log's lines.

Fed by a log listener rather than by the adapters, so the proxy's hot path stays as it is: a run
without a control API pays nothing, and every number here agrees with the log file.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ACTIVE_WINDOW_S = 300.0
# From sub-millisecond passthrough to the multi-second hangs and timeouts that faults ask for.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class LogMetrics:
    """Faults, calls, call latency and active sessions, in a registry of their own.

    A registry per instance (not prometheus_client's global one) lets several proxies live in one
    process, as they do under the pytest plugin, each with numbers of its own.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.faults = Counter("chaosproxy_faults", "Faults fired, by fault type, POMDP component and rule",
                              ["fault", "component", "rule"], registry=self.registry)
        self.calls = Counter("chaosproxy_calls", "Calls relayed (or answered by a fault), by outcome",
                             ["transport", "status", "outcome"], registry=self.registry)
        self.latency = Histogram("chaosproxy_call_duration_seconds",
                                 "Time from request to the end of the reply", ["transport"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter("chaosproxy_fault_errors", "Faults that raised (the message passed through)",
                              ["fault", "rule"], registry=self.registry)
        sessions = Gauge("chaosproxy_active_sessions",
                         f"Sessions with a call in the last {ACTIVE_WINDOW_S:.0f} seconds",
                         registry=self.registry)
        sessions.set_function(self._active_sessions)
        self._last_call: dict[str, float] = {}
        self._pruned = time.monotonic()

    def observe(self, fields: dict[str, Any]) -> None:
        """A log listener: count one line."""
        match fields.get("event"):
            case "fault":
                self.faults.labels(fields.get("fault"), fields.get("component"), fields.get("rule")).inc()
            case "call":
                transport = fields.get("transport") or ""
                status = fields.get("status")
                status_label = "" if status is None else str(status)
                self.calls.labels(transport, status_label, fields.get("outcome")).inc()
                if (duration_ms := fields.get("duration_ms")) is not None:
                    self.latency.labels(transport).observe(duration_ms / 1000)
                now = time.monotonic()
                self._last_call[str(fields.get("session"))] = now
                if now - self._pruned > ACTIVE_WINDOW_S:
                    self._prune(now)
            case "error":
                self.errors.labels(fields.get("fault"), fields.get("rule")).inc()

    def _active_sessions(self) -> int:
        self._prune(time.monotonic())
        return len(self._last_call)

    def _prune(self, now: float) -> None:
        self._pruned = now
        for session, seen in list(self._last_call.items()):
            if now - seen > ACTIVE_WINDOW_S:
                del self._last_call[session]
