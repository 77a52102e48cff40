"""Prometheus metrics for a run, counted from the perturbation log's lines.

Fed by a log listener rather than by the adapters, so the proxy's hot path stays as it is: a run
without a control API pays nothing, and every number here agrees with the log file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from chaosproxy.telemetry.log_schema import Event, Key

# From sub-millisecond passthrough to the multi-second hangs and timeouts that faults ask for.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class LogMetrics:
    """Faults, calls, call latency and active sessions, in a registry of their own.

    A registry per instance (not prometheus_client's global one) lets several proxies live in one
    process, as they do under the pytest plugin, each with numbers of its own. `sessions` counts the
    sessions the engine holds state for. Series of a rule taken out of the scenario go with it, so a
    run that adds and removes rules (ControlClient.fault) does not grow /metrics without end.
    """

    def __init__(self, sessions: Callable[[], int], refused: Callable[[], Mapping[str, int]] = dict) -> None:
        """`refused`: the agents' connections the proxy's listeners refused or closed, by reason."""
        self.registry = CollectorRegistry()
        self.faults = Counter("chaosproxy_faults", "Faults fired, by fault type, POMDP component and rule",
                              [Key.FAULT, Key.COMPONENT, Key.RULE], registry=self.registry)
        self.calls = Counter("chaosproxy_calls", "Calls relayed (or answered by a fault), by outcome",
                             [Key.TRANSPORT, Key.STATUS, Key.OUTCOME], registry=self.registry)
        self.latency = Histogram("chaosproxy_call_duration_seconds",
                                 "Time from request to the end of the reply", [Key.TRANSPORT],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter("chaosproxy_fault_errors", "Faults that raised (the message passed through)",
                              [Key.FAULT, Key.RULE], registry=self.registry)
        active = Gauge("chaosproxy_active_sessions", "Sessions the proxy holds state for (see --session-ttl)",
                       registry=self.registry)
        active.set_function(sessions)
        self.registry.register(_Refused(refused))
        self._series: dict[str, set[tuple[str, ...]]] = {}  # rule -> its fault label values in use

    def observe(self, fields: dict[str, Any]) -> None:
        """A log listener: count one line."""
        match fields.get(Key.EVENT):
            case Event.FAULT:
                labels = (str(fields.get(Key.FAULT)), str(fields.get(Key.COMPONENT)), str(fields.get(Key.RULE)))
                self.faults.labels(*labels).inc()
                self._series.setdefault(labels[2], set()).add(labels)
            case Event.CALL:
                transport = fields.get(Key.TRANSPORT) or ""
                status = fields.get(Key.STATUS)
                status_label = "" if status is None else str(status)
                self.calls.labels(transport, status_label, fields.get(Key.OUTCOME)).inc()
                if (duration_ms := fields.get(Key.DURATION_MS)) is not None:
                    self.latency.labels(transport).observe(duration_ms / 1000)
            case Event.ERROR:
                error_labels = (str(fields.get(Key.FAULT)), str(fields.get(Key.RULE)))
                self.errors.labels(*error_labels).inc()
                self._series.setdefault(error_labels[1], set()).add(error_labels)
            case Event.CONTROL if isinstance(rules := fields.get("rules"), list):
                self._forget_rules_but(set(rules))

    def _forget_rules_but(self, kept: set[str]) -> None:
        """Drop the series of every rule no longer in the scenario (a swap or reload names those that are)."""
        for rule in [rule for rule in self._series if rule not in kept]:
            for labels in self._series.pop(rule):
                metric = self.faults if len(labels) == 3 else self.errors
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)


class _Refused(Collector):
    """`chaosproxy_client_connections_refused_total{reason}`: heads over their limits (431), heads sent too
    slowly (408), idle keep-alive connections closed, and pauses in accepting for want of open files,
    read from the listeners' own counts when scraped (the hot path counts, /metrics reads)."""

    def __init__(self, refused: Callable[[], Mapping[str, int]]) -> None:
        self.refused = refused

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("chaosproxy_client_connections_refused",
                                     "Agents' connections refused or closed by the proxy, by reason", labels=["reason"])
        for reason, count in sorted(self.refused().items()):
            family.add_metric([reason], count)
        yield family
