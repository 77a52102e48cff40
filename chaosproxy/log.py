"""The perturbation log (JSON lines, machine-read) and the operational log (human-read, stderr)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, BinaryIO

import orjson
import structlog

ops = logging.getLogger("chaosproxy")


def setup_operational_log(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("chaosproxy %(levelname)s %(message)s"))
    ops.handlers[:] = [handler]
    ops.setLevel(logging.DEBUG if verbose else logging.INFO)
    ops.propagate = False


class _FlushOnRequest:
    """The stream, as structlog's BytesLogger sees it: writes pass, its per-line flush does nothing."""

    def __init__(self, stream: BinaryIO) -> None:
        self.write = stream.write

    def flush(self) -> None:
        pass


def digest(payload: bytes) -> str:
    """A short content digest, so a log can say whether two payloads were the same."""
    return hashlib.sha256(payload).hexdigest()[:16]


def _event_first(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    return {"ts": datetime.now(UTC).isoformat(timespec="microseconds"), "event": event.pop("event"), **event}


class PerturbationLog:
    """One JSON line per fired fault (`event: fault`) and per forwarded call (`event: call`).

    Every line carries the run id and seed, so a log file alone is enough to reproduce a run.
    Listeners (the control API's live event stream) get each line's fields as they are written.
    """

    # Call lines (one per request) are flushed at most this often, or by `flush()`: a write system
    # call per request costs more than the rest of the line. Every other line is flushed at once.
    CALL_FLUSH_S = 0.25

    def __init__(self, stream: BinaryIO, *, run_id: str, seed: int) -> None:
        self.run_id = run_id
        self.seed = seed
        self._stream = stream
        self._flushed = time.monotonic()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._logger = structlog.wrap_logger(
            structlog.BytesLogger(_FlushOnRequest(stream)),
            processors=[_event_first, self._notify, structlog.processors.JSONRenderer(serializer=orjson.dumps)],
            context_class=dict,
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),  # plain methods, no __getattr__
        ).bind(run_id=run_id, seed=seed)

    def _notify(self, _logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a broken listener must not break the traffic that is being logged
                ops.exception("log listener %r failed", listener)
        return event

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def fault(self, **fields: Any) -> None:
        self._logger.info("fault", **fields)
        self.flush()

    def call(self, **fields: Any) -> None:
        self._logger.info("call", **fields)
        if time.monotonic() - self._flushed >= self.CALL_FLUSH_S:
            self.flush()

    def skip(self, **fields: Any) -> None:
        """A rule matched but its fault could not act on the payload (and said why)."""
        self._logger.info("skip", **fields)
        self.flush()

    def error(self, **fields: Any) -> None:
        self._logger.info("error", **fields)
        self.flush()

    def control(self, **fields: Any) -> None:
        """A change made at runtime (scenario swap, rule patch, reset, reload), so the log tells all."""
        self._logger.info("control", **fields)
        self.flush()

    def run(self, **fields: Any) -> None:
        """The first line of a run: what was loaded, with which seed."""
        self._logger.info("run", **fields)
        self.flush()

    def flush(self) -> None:
        self._stream.flush()
        self._flushed = time.monotonic()

    async def flush_periodically(self) -> None:
        """Flush buffered call lines while the proxy runs, so a tailed log lags by a fraction of a second."""
        while True:
            await asyncio.sleep(self.CALL_FLUSH_S)
            self.flush()

    def close(self) -> None:
        self._stream.flush()
        if self._stream not in (sys.stdout.buffer, sys.stderr.buffer):
            self._stream.close()
