"""The perturbation log (JSON lines, machine-read) and the operational log (human-read, stderr).

Every line is a dict serialised by orjson, with no processor chain in between: a call line is
written per request, and a chain of processors cost ~50 µs where this costs a few. A running proxy
keeps each call's values as a record, makes the lines of CALL_CHUNK records at a time, and writes
call and session lines in a batch (every CALL_FLUSH_S, and at every exit);
every other line is written at once, as is every line of a log made without `batch_s`. A failing
write (a full disk, a log file made unwritable) never stops the proxy: it is reported once on
stderr, lines are kept (up to a bound) and written when it works again. `reopen()` (SIGUSR1) opens
the log file again by name, for logrotate.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Unpack

import orjson

from chaosproxy.telemetry.log_schema import (
    SCHEMA_VERSION,
    CallFields,
    ControlFields,
    ErrorFields,
    Event,
    FaultFields,
    Key,
    Marks,
    RunFields,
    SessionFields,
    SkipFields,
    line_of,
)

ops = logging.getLogger("chaosproxy")

CALL_FLUSH_S = 0.25  # a running proxy's batch: a tailed log lags by at most this
SESSION_SUMMARY_S = 10.0  # sessions dropped idle or evicted are told in a line per reason this often
SUMMARISED = frozenset({"idle", "evicted"})  # (a session an agent ended, or one that came back: a line each)
# Call records made lines together: a tight loop over a few is cheaper than a line at a time among the
# requests' other work, and records kept for a whole batch (thousands, a quarter of a second) had gone
# cold in the CPU's caches by the flush (~1.5 µs a call more, side by side at 20k calls a second).
CALL_CHUNK = 64
MAX_PENDING_BYTES = 64 << 20  # lines kept while the log cannot be written; the oldest go beyond this
# makes a call line (a log_schema.CallLine, whose keys mypy checks where it is made) of (ts, run_id, seed, record)
MakeLine = Callable[[str, str, int, Any], Any]


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # (a tab stays)


class _OneLine(logging.Formatter):
    """Each message on a line of its own: control characters in it (an agent's `%0d%0a` in a path, an
    upstream's in an error) are escaped, so that nothing sent to the proxy can forge a line of its log.
    A traceback, which the proxy makes itself, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", super().formatMessage(record))


class Throttle:
    """A warning that may repeat (an upstream down, out of files) said at most once per `every` seconds
    for each key, with how many were left out: a sidecar's log must not get a line per request."""

    MAX_KEYS = 1024  # all forgotten beyond (the keys name upstreams and kinds of error: few)

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._said: dict[object, tuple[float, int]] = {}  # key -> when last said, how many left out since

    def warning(self, key: object, message: str, *args: object) -> None:
        now = time.monotonic()
        said, left_out = self._said.get(key, (-self.every, 0))
        if now - said < self.every:
            self._said[key] = (said, left_out + 1)
            return
        if left_out:
            message += " (and %d more like it in the last %g s)"
            args = (*args, left_out, self.every)
        if len(self._said) >= self.MAX_KEYS:
            self._said.clear()
        self._said[key] = (now, 0)
        ops.warning(message, *args)


LOG_FORMATS = ("text", "json")
_run: dict[str, str] = {}  # the run the operational log's JSON lines name (name_run)


def setup_operational_log(verbose: bool = False, log_format: str = "text") -> None:
    """The proxy's own messages (listening, reloads, upstream failures, warnings) on stderr: `text`, a
    line each, as `chaosproxy LEVEL message`; or `json`, a JSON object each for a sidecar's log pipeline
    (`ts`, `level`, `message`, and `run_id` once the run has one: the keys the perturbation log has where
    they mean the same)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_json_lines() if log_format == "json" else _OneLine("chaosproxy %(levelname)s %(message)s"))
    ops.handlers[:] = [handler]
    ops.setLevel(logging.DEBUG if verbose else logging.INFO)
    ops.propagate = False


def name_run(run_id: str) -> None:
    """From now on the operational log's JSON lines carry `run_id` (the perturbation log's)."""
    _run[Key.RUN_ID] = run_id


def _json_lines() -> logging.Formatter:
    """structlog's formatter for the standard library's records: a JSON object a line, a traceback in
    `exception`. Loaded only for --log-format json."""
    import structlog

    def with_run(_: Any, __: str, fields: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        fields.update(_run)
        return fields

    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.processors.TimeStamper(fmt="iso", utc=True, key=Key.TS),
                           structlog.stdlib.add_log_level, with_run, structlog.processors.format_exc_info,
                           structlog.processors.EventRenamer("message")],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.JSONRenderer(serializer=lambda fields, **_: orjson.dumps(fields).decode())])


def digest(payload: bytes) -> str:
    """A short content digest, so a log can say whether two payloads were the same."""
    return hashlib.sha256(payload).hexdigest()[:16]


def open_log_file(path: Path) -> BinaryIO:
    """The log file opened for appending, unbuffered: PerturbationLog does its own batching."""
    return open(path, "ab", buffering=0)  # noqa: SIM115


class _Clock:
    """ISO-8601 UTC timestamps with microseconds, the formatting done once per second."""

    __slots__ = ("_second", "_prefix")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def now(self) -> str:
        return self.at(time.time_ns())

    def at(self, ns: int) -> str:
        """The timestamp of `ns` (time.time_ns())."""
        micros = ns // 1000  # integers: cheaper than float arithmetic and f-string formatting
        second = micros // 1_000_000
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        return "%s%06d+00:00" % (self._prefix, micros - second * 1_000_000)  # noqa: UP031 (%: 0.13 µs, f-string: 0.2)


def _call_line(ts: str, run_id: str, seed: int, fields: CallFields) -> dict[str, Any]:
    return line_of(Event.CALL, ts, run_id, seed, fields)


class PerturbationLog:
    """One JSON line per fired fault (`event: fault`) and per forwarded call (`event: call`), and a few rarer kinds.

    Every line carries the run id and seed, so a log file alone is enough to reproduce a run.
    Listeners (the control API's live event stream, metrics) get each line's fields as it is written.
    """

    def __init__(self, stream: BinaryIO, *, run_id: str, seed: int, path: Path | None = None,
                 batch_s: float = 0.0, each_session: bool = True) -> None:
        """`path`: the file `stream` was opened from, so `reopen()` can open it again after a rotation.
        `batch_s`: write call and session lines at most this often (CALL_FLUSH_S for a proxy: a write
        system call per request costs more than the rest of the line); 0 writes each line at once.
        `each_session`: a line for each session dropped idle or evicted, rather than a summary (`session`)."""
        self.run_id = run_id
        self.seed = seed
        self.path = path
        self._stream = stream
        # Lines not yet written. A bytearray, not a list of lines: orjson's many live outputs made the
        # allocator slow (~14 µs a line); appending to one buffer costs ~0.1 µs.
        self._pending = bytearray()
        # Call records of a batching log with no listener (time_ns, record, make: see write_call), made
        # lines CALL_CHUNK at a time, at a flush or before any other line. A deque: appended to without the lock.
        self._calls: deque[tuple[int, Any, MakeLine]] = deque()
        self._lock = threading.Lock()  # flush() may come from another thread (tests, EmbeddedProxy.log_lines)
        self._lost = 0  # lines dropped while the log could not be written
        self._failing = False
        self._flushed = time.monotonic()
        self.batch_s = batch_s
        self._clock = _Clock()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self.each_session = each_session
        self._dropped: dict[str, int] = {}  # sessions dropped idle or evicted since the last summary, by reason
        self._summarised = time.monotonic()

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def call(self, **fields: Unpack[CallFields]) -> None:
        """One proxied request, whatever befell it."""
        self.write_call(fields, _call_line)

    def write_call(self, record: Any, make: MakeLine) -> None:
        """A call line: `make(ts, run_id, seed, record)` makes it, those first. Called on the hot path,
        with `record` a tuple of the call's values: a batching log with no listener keeps it, and makes
        the lines of the records it keeps in one tight loop once there are CALL_CHUNK of them (or at the
        flush). `record` must not change after this."""
        if self.batch_s and not self._listeners:
            calls = self._calls
            calls.append((time.time_ns(), record, make))
            if len(calls) >= CALL_CHUNK:
                with self._lock:
                    self._serialise_calls()
        else:
            self._write(make(self._clock.now(), self.run_id, self.seed, record))
        self._flush_if_due()

    def _flush_if_due(self) -> None:
        if time.monotonic() - self._flushed >= self.batch_s:
            self.flush()

    def session(self, **fields: Unpack[SessionFields]) -> None:
        """A session's state was dropped (ended, idle, evicted) or a dropped session came back. Sessions
        dropped idle or evicted are counted and told in one line per SESSION_SUMMARY_S for each reason
        (`count`, no `session`), unless `each_session`: a churn of session ids past --max-sessions
        would otherwise nearly double the log."""
        if not self.each_session and fields[Key.CHANGE] == "dropped" and fields[Key.REASON] in SUMMARISED:
            reason = fields[Key.REASON]
            self._dropped[reason] = self._dropped.get(reason, 0) + 1
            self._summarise()
        else:
            self._write(self._line(Event.SESSION, fields))
        self._flush_if_due()

    def _summarise(self, *, now: bool = False) -> None:
        """The sessions dropped idle or evicted since the last summary, once SESSION_SUMMARY_S has passed
        (or `now`)."""
        if self._dropped and (now or time.monotonic() - self._summarised >= SESSION_SUMMARY_S):
            dropped, self._dropped = self._dropped, {}
            self._summarised = time.monotonic()
            for reason, count in sorted(dropped.items()):
                self._write(self._line(Event.SESSION, SessionFields(change="dropped", reason=reason, count=count)))

    def fault(self, **fields: Unpack[FaultFields]) -> None:
        self._write(self._line(Event.FAULT, fields))
        self.flush()

    def skip(self, **fields: Unpack[SkipFields]) -> None:
        """A rule matched but its fault could not act on the payload (and said why)."""
        self._write(self._line(Event.SKIP, fields))
        self.flush()

    def error(self, **fields: Unpack[ErrorFields]) -> None:
        self._write(self._line(Event.ERROR, fields))
        self.flush()

    def control(self, **fields: Unpack[ControlFields]) -> None:
        """A change made at runtime (scenario swap, rule patch, reset, reload), so the log tells all."""
        self._write(self._line(Event.CONTROL, fields))
        self.flush()

    def run(self, **fields: Unpack[RunFields]) -> None:
        """The first line of a run: what was loaded, with which seed, and the log's schema version."""
        self._write(self._line(Event.RUN, {"schema": SCHEMA_VERSION, **fields}))
        self.flush()

    def _line(self, event: str, fields: Mapping[str, object]) -> dict[str, Any]:
        return line_of(event, self._clock.now(), self.run_id, self.seed, fields)

    def _write(self, line: dict[str, Any]) -> None:
        data = orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE, default=str)
        with self._lock:
            self._serialise_calls()  # the call lines logged before this one go first
            self._pending += data
            self._bound_pending()
        for listener in self._listeners:
            try:
                listener(line)
            except Exception:  # fail open: a broken listener must not break the traffic being logged
                ops.exception("log listener %r failed", listener)

    def _serialise_calls(self) -> None:
        """The call records kept join the pending bytes as lines, in order (with the lock held)."""
        calls = self._calls
        if not calls:
            return
        pending, at, dumps, run_id, seed = self._pending, self._clock.at, orjson.dumps, self.run_id, self.seed
        while calls:
            ts, record, make = calls.popleft()
            pending += dumps(make(at(ts), run_id, seed, record), option=orjson.OPT_APPEND_NEWLINE, default=str)
        self._bound_pending()

    def _bound_pending(self) -> None:
        if len(self._pending) > MAX_PENDING_BYTES:  # the log has been failing for long: drop the oldest
            cut = self._pending.find(b"\n", len(self._pending) - MAX_PENDING_BYTES) + 1
            self._lost += self._pending.count(b"\n", 0, cut)
            del self._pending[:cut]

    def flush(self) -> None:
        """Write the lines gathered so far; on failure keep them for the next try (reported once)."""
        self._summarise()
        self._flushed = time.monotonic()
        with self._lock:
            self._serialise_calls()
            if not self._pending:
                return
            try:
                written = self._stream.write(self._pending)
                self._stream.flush()
            except (OSError, ValueError) as exc:  # ValueError: the stream was closed under us
                if not self._failing:
                    self._failing = True
                    print(f"chaosproxy error: cannot write the perturbation log ({exc}); proxying goes on, "
                          "lines are kept and written once it works again", file=sys.stderr, flush=True)
                return
            # a short write leaves the rest for next time
            del self._pending[:len(self._pending) if written is None else written]
            if self._pending:
                return
        if self._failing:
            self._failing = False
            lost = f"; {self._lost} lines were dropped meanwhile" if self._lost else ""
            print(f"chaosproxy: the perturbation log is written again{lost}", file=sys.stderr, flush=True)
            self._lost = 0

    async def flush_periodically(self) -> None:
        """Flush buffered call lines while the proxy runs, so a tailed log lags by a fraction of a second."""
        while True:
            await asyncio.sleep(self.batch_s or CALL_FLUSH_S)
            self.flush()

    def reopen(self) -> None:
        """Open the log file again by name (after logrotate moved it): later lines go to the new file."""
        if self.path is None:
            return
        self.flush()
        try:
            stream = open_log_file(self.path)
        except OSError as exc:
            print(f"chaosproxy error: cannot reopen the perturbation log {self.path} ({exc.strerror or exc}); "
                  "it stays on the file it had", file=sys.stderr, flush=True)
            return
        old, self._stream = self._stream, stream
        old.close()
        ops.info("perturbation log reopened: %s", self.path)

    def close(self) -> None:
        self._summarise(now=True)
        self.flush()
        if self._stream not in (sys.stdout.buffer, sys.stderr.buffer):
            self._stream.close()


class MarkedLog(PerturbationLog):
    """The run's log as one engine of several writes it: a proxy made on demand, or a scope of a listener
    (chaosproxy.control). Its lines go to the run's log (the same file, batches and listeners) marked
    with `marks` (`{"proxy": NAME}`, `{"scope": NAME}`) and with that engine's own seed, so that a journal
    tells one test's calls and faults from another's and each can be reproduced alone.

    It owns no stream: it never calls PerturbationLog.__init__, and overrides every method that touches one.
    """

    def __init__(self, log: PerturbationLog, marks: Marks, *, seed: int) -> None:  # (owns no stream)
        self.base = log
        self.marks = marks
        self.run_id = log.run_id
        self.seed = seed
        self.path = None
        self.batch_s = log.batch_s

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        return self.base.subscribe(listener)

    def session(self, **fields: Unpack[SessionFields]) -> None:
        """A line each: an engine made for a test churns no sessions."""
        self._write(self._line(Event.SESSION, fields))

    def write_call(self, record: Any, make: MakeLine) -> None:
        self.base.write_call(record, functools.partial(_marked_call, make, self.marks, self.seed))

    def _line(self, event: str, fields: Mapping[str, object]) -> dict[str, Any]:
        return {**self.base._line(event, fields), Key.SEED: self.seed, **self.marks}

    def _write(self, line: dict[str, Any]) -> None:
        self.base._write(line)

    def _flush_if_due(self) -> None:
        self.base._flush_if_due()

    def flush(self) -> None:
        self.base.flush()

    def reopen(self) -> None:
        """The run's log is reopened by the run."""

    def close(self) -> None:
        """The run's log is closed by the run: this only writes what is pending."""
        self.base.flush()


def _marked_call(make: MakeLine, marks: Marks, seed: int,
                 ts: str, run_id: str, _: int, record: Any) -> dict[str, Any]:
    line = make(ts, run_id, seed, record)
    line.update(marks)
    return line
