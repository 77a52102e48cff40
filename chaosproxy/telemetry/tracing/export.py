"""Whether spans are exported (`--otel`, the OTEL_* variables) and the tracer a run or a drill uses
accordingly; chaosproxy.telemetry.otlp is not even imported when they are not."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from chaosproxy.telemetry.tracing.spans import OtlpTracing
from chaosproxy.telemetry.tracing.tracer import NO_TRACING, Tracing

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def export_requested(flag: bool = False, environ: Mapping[str, str] = os.environ) -> bool:
    """True with `--otel`, or when an OTLP endpoint for traces is set (and the SDK is not disabled)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return flag or any(environ.get(name) for name in ENDPOINT_VARIABLES)


def from_environment(flag: bool, *, run_id: str, seed: int) -> Tracing:
    """The tracer a run uses: OTLP export when asked for, else NO_TRACING (chaosproxy.telemetry.otlp not
    even imported)."""
    if not export_requested(flag):
        return NO_TRACING
    return OtlpTracing(run_id=run_id, seed=seed)


@contextlib.contextmanager
def exporting(*, run_id: str, seed: int) -> Iterator[Tracing]:
    """The tracer for a drill's runs (a root span each) when OTEL_* asks for export; flushed at the end."""
    tracing = from_environment(False, run_id=run_id, seed=seed)
    try:
        yield tracing
    finally:
        tracing.shutdown()


def propagated(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that switch export on and shape it (OTEL_*, TRACEPARENT, TRACESTATE), for a
    process elsewhere (a Ray task) to export as this one would."""
    return {name: value for name, value in environ.items()
            if name.startswith("OTEL_") or name in ("TRACEPARENT", "TRACESTATE")}
