"""The relay itself (`StdioRelay`): lines both ways between the agent and the server, each a message
the engine judges, the faults carried out per line; what a fault holds waits in its direction's lane,
bounded, without holding up what may pass it. The pipes it reads and writes are set up here too."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import stat
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import orjson

from chaosproxy.adapters.jsonrpc import MAX_PENDING, rpc_key
from chaosproxy.adapters.stdio.process import EXIT_CRASHED, KILL_GRACE, ServerProcess, exit_status
from chaosproxy.engine.actions import (
    Action,
    Delay,
    Drip,
    Drop,
    Garble,
    Hang,
    Notify,
    Reply,
    Reset,
    Respond,
    Truncate,
)
from chaosproxy.engine.core import Engine
from chaosproxy.engine.message import Message, Phase
from chaosproxy.protocols.mcp import error_reply
from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.log_schema import Outcome

TRANSPORT = "stdio"
SESSION = "stdio"  # one agent per relay process; a constant keeps seeded decisions reproducible
CLOSE_GRACE = 10.0  # after its stdin closes, how long the server may finish its work (clients signal sooner)
DRAIN_GRACE = 1.0  # after the server exits, how long its lines may stand still (a grandchild may hold the pipe)
MAX_LINE = 16 << 20  # a longer line passes through in pieces, unexamined: it is never held whole
LANE_BYTES = 16 << 20  # line bytes a direction may hold behind faults before it stops reading (a full pipe)
LANE_DEPTH = 1000  # and messages (each costs a task besides its bytes)
HTTP_ERROR = -32000  # what an HTTP bridge in front of a stdio server reports for an HTTP error


@dataclass(slots=True)
class _Call:
    """An agent's request on its way to an answer, for the call log."""

    key: Any
    request: Message
    started: float = field(default_factory=time.perf_counter)
    faults: list[str] = field(default_factory=list)


class _Pipe:
    """The write end of one direction. Frames go out whole (a drip holds the pipe, as a slow pipe
    would), and a reader that went away closes the pipe instead of failing the relay. `tap`, when
    given, is handed what goes out (a recording)."""

    def __init__(self, writer: asyncio.StreamWriter, tap: Callable[[bytes], None] | None = None) -> None:
        self._writer = writer
        self.tap = tap
        self.lock = asyncio.Lock()  # held while one frame is going out

    async def send(self, data: bytes, drip: Drip | None = None) -> None:
        async with self.lock:
            await self.write(data, drip)

    async def write(self, data: bytes, drip: Drip | None = None) -> None:
        """`send` for a caller that holds the lock already (a long line going out piece by piece)."""
        if not data:
            return
        if self.tap is not None:
            self.tap(data)
        size, delay = (len(data), 0.0) if drip is None else (drip.chunk_bytes, drip.delay)
        try:
            for start in range(0, len(data), size):
                if start:
                    await asyncio.sleep(delay)
                if self._writer.is_closing():
                    return
                self._writer.write(data[start:start + size])
                await self._writer.drain()
        except ConnectionError:
            self.close()

    def unsent(self) -> int:
        """Bytes written here that the reader has yet to take (beyond what the OS pipe holds)."""
        return self._writer.transport.get_write_buffer_size()

    def close(self) -> None:
        self._writer.close()

    async def wait_closed(self, grace: float) -> None:
        """Close once what was written has gone out, at the reader's pace however slow; a reader that
        takes nothing for `grace` is given up on."""
        self.close()
        closed = asyncio.ensure_future(self._writer.wait_closed())
        while not closed.done():
            unsent = self.unsent()
            await asyncio.wait([closed], timeout=grace)
            if self.unsent() == unsent:
                closed.cancel()
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await closed


class _Lane:
    """One direction's messages on their way out, some of them held by faults.

    A held message holds up no message that may pass it: requests and replies are paired by id, so
    they may arrive in any order, and a call held for seconds leaves the other calls alone. What has
    an order keeps it: messages without an id (notifications, lines that are not JSON-RPC) go out in
    the order they came, and every message goes out after those that came before it (the progress
    notifications before the result they precede). A message's delay runs from when it arrived.
    What is held is bounded as a full pipe bounds it: past LANE_BYTES or LANE_DEPTH held messages
    the reader stops, and the writer on the other side waits.
    """

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self._ordered_tail: asyncio.Task[None] | None = None  # the last message without an id, in turn
        self._held_bytes = 0
        self._room = asyncio.Event()  # set while within the bounds
        self._room.set()

    async def deliver(self, work: Callable[[], Awaitable[None]], *, size: int, waits: bool,
                      ordered: bool) -> None:
        """Carry out `work` (which sends `size` bytes): at once when it does not wait and no message it
        must follow is held, else in a task of its own, while the reader goes on within the bounds."""
        before = self.ordered_tail()
        if not waits and before is None:
            await work()  # the line in hand: the pipe's own back-pressure holds the reader
            return
        task = asyncio.create_task(_after(before, work))
        if ordered:
            self._ordered_tail = task
        self.tasks.add(task)
        self._held_bytes += size
        task.add_done_callback(functools.partial(self._release, size))
        if self._full():
            self._room.clear()
            await self._room.wait()

    def ordered_tail(self) -> asyncio.Task[None] | None:
        """The held message without an id that the next message must follow, if any."""
        tail = self._ordered_tail
        return tail if tail is not None and not tail.done() else None

    def _full(self) -> bool:
        return self._held_bytes > LANE_BYTES or len(self.tasks) > LANE_DEPTH

    def _release(self, size: int, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._held_bytes -= size
        if not self._full():
            self._room.set()

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


async def _after(before: asyncio.Task[None] | None, work: Callable[[], Awaitable[None]]) -> None:
    if before is not None:
        await asyncio.wait([before])
    await work()


class FrameRecorder(Protocol):
    """Who records a stdio session (a cassette): `frame("client", data)` what reached the server, `frame("server",
    data)` what it wrote, in pieces as they went."""

    def frame(self, side: str, data: bytes) -> None: ...


class StdioRelay:
    """One agent, one server process: relays lines both ways and carries out the engine's decisions."""

    def __init__(self, engine: Engine, server: ServerProcess, *, session: str = SESSION,
                 close_grace: float = CLOSE_GRACE, recorder: FrameRecorder | None = None) -> None:
        self.engine = engine
        self.recorder = recorder
        self.server = server
        self.session = session
        self.close_grace = close_grace
        self._pending: dict[Any, _Call] = {}  # oldest first
        self._lanes = {Phase.REQUEST: _Lane(), Phase.RESPONSE: _Lane()}
        self._reads = {Phase.REQUEST: 0, Phase.RESPONSE: 0}  # lines and pieces: a silent pipe stays put
        self._crashed = asyncio.Event()

    async def run(self, agent_in: int, agent_out: int) -> int:
        """Relay until the server exits, the agent hangs up or a reset; the fds become the relay's.

        SIGINT and SIGTERM are passed on to the server's process group, as if the client had signalled
        the server directly; one that ignores them is killed after KILL_GRACE. When the agent hangs up,
        what faults hold still goes out (bounded); when the server ends first (or a reset), the agent
        sees it end at once and what is held is dropped. Returns the status to exit with: the server's,
        or EXIT_CRASHED after a reset.
        """
        loop = asyncio.get_running_loop()
        in_fd, _ = _as_pipe(agent_in, reading=True)
        out_fd, out_copier = _as_pipe(agent_out, reading=False)
        agent_lines, agent_reading = await _open_reader(open(in_fd, "rb", buffering=0))  # noqa: SIM115
        self._to_agent = _Pipe(await _open_writer(open(out_fd, "wb", buffering=0)))  # noqa: SIM115
        assert self.server.stdin is not None and self.server.stdout is not None
        recorder = self.recorder
        self._to_server = _Pipe(await _open_writer(self.server.stdin),
                                functools.partial(recorder.frame, "client") if recorder is not None else None)
        server_lines, _ = await _open_reader(self.server.stdout)
        if recorder is not None:
            server_lines = _tapped(server_lines, functools.partial(recorder.frame, "server"))

        exited = asyncio.ensure_future(asyncio.to_thread(self.server.wait))
        requests = asyncio.create_task(self._pump(agent_lines, Phase.REQUEST))
        replies = asyncio.create_task(self._pump(server_lines, Phase.RESPONSE))
        crashed = asyncio.create_task(self._crashed.wait())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._pass_on, sig, exited)
        try:
            await asyncio.wait([exited, requests, crashed], return_when=asyncio.FIRST_COMPLETED)
            requests.cancel()  # the agent hung up, the server is gone, or a reset
            agent_reading.close()
            agent_left = not exited.done() and not self._crashed.is_set()
            if agent_left:
                await self._settle()
            else:  # what a fault holds has no one to go to, or would reach the agent after the end
                self._drop_held()
            await self._stop_server(exited)
            await self._drain(replies)
            if agent_left:
                await self._settle()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for task in (requests, replies, crashed):
                task.cancel()
            self._drop_held()
            await self._to_agent.wait_closed(DRAIN_GRACE)
            if out_copier is not None:
                await asyncio.to_thread(out_copier.join, DRAIN_GRACE)
            await asyncio.to_thread(self.server.release)
            for call in list(self._pending.values()):
                self._finish(call, Outcome.UNANSWERED)
            self.engine.end_session(self.session)  # one agent per relay: its session ends with it
        status = exit_status(self.server.returncode)
        if status:
            ops.warning("server command exited with status %d", status)
        return EXIT_CRASHED if self._crashed.is_set() else status

    async def _drain(self, replies: asyncio.Task[None]) -> None:
        """Relay what the server wrote before it exited, all of it, at the agent's pace however slow.
        Only when nothing moves for DRAIN_GRACE is it given up: the server's pipe is silent (a
        grandchild may hold it open), or the agent stopped reading."""
        while not replies.done():
            moved = self._reads[Phase.RESPONSE], self._to_agent.unsent()
            await asyncio.wait([replies], timeout=DRAIN_GRACE)
            if (self._reads[Phase.RESPONSE], self._to_agent.unsent()) == moved:
                return

    async def _settle(self) -> None:
        """Let the messages faults hold arrive (bounded) before the pipe they go to closes."""
        held = [task for lane in self._lanes.values() for task in lane.tasks]
        if held:
            await asyncio.wait(held, timeout=self.close_grace)

    def _drop_held(self) -> None:
        for lane in self._lanes.values():
            lane.cancel()

    def _pass_on(self, sig: int, exited: asyncio.Future[int]) -> None:
        """A signal for the relay goes to the server's group; SIGKILL follows if the server is still
        there after KILL_GRACE."""
        if exited.done():
            return
        self.server.signal_group(sig)
        asyncio.get_running_loop().call_later(KILL_GRACE, self._kill_lingering, exited)

    def _kill_lingering(self, exited: asyncio.Future[int]) -> None:
        if not exited.done() and self.server.poll() is None:
            ops.warning("server (pid %d) ignored the signal for %g s; sending SIGKILL", self.server.pid, KILL_GRACE)
            self.server.signal_group(signal.SIGKILL)

    async def _stop_server(self, exited: asyncio.Future[int]) -> None:
        """Close its stdin, as MCP clients do to end a session; SIGTERM, then SIGKILL, if it lingers."""
        self._to_server.close()
        for escalate, grace in ((None, self.close_grace), (signal.SIGTERM, KILL_GRACE),
                                (signal.SIGKILL, KILL_GRACE)):
            if escalate is not None:
                ops.warning("server (pid %d) still running; sending %s", self.server.pid, escalate.name)
                self.server.signal_group(escalate)
            await asyncio.wait([exited], timeout=grace)
            if exited.done():
                return

    async def _pump(self, lines: AsyncIterator[tuple[bytes, bool]], phase: Phase) -> None:
        """Relay one direction line by line: as is when no rule can act on it, else via the engine."""
        pipe = self._to_server if phase is Phase.REQUEST else self._to_agent
        lane = self._lanes[phase]
        async for line, whole in lines:
            self._reads[phase] += 1
            if not whole:
                await self._pass_unexamined(line, lines, pipe, lane, phase)
                continue
            msg = Message(TRANSPORT, phase, session=self.session, body=line.rstrip(b"\r\n"))
            if self.engine.interest.acts(phase):
                await self._decide(msg, line, pipe, lane)
                continue
            if phase is Phase.REQUEST:
                self._track(msg)  # before the server can answer it
                if msg.trace is not None and msg.body is not None:
                    line = msg.body + b"\n"  # with the trace context in its _meta
            await lane.deliver(functools.partial(pipe.send, line), size=len(line), waits=False, ordered=True)
            if phase is Phase.RESPONSE:
                self._finish(self._track(msg), reply=msg.rpc)  # parsed only after it is on its way

    async def _pass_unexamined(self, first: bytes, rest: AsyncIterator[tuple[bytes, bool]], pipe: _Pipe,
                               lane: _Lane, phase: Phase) -> None:
        """A line over MAX_LINE goes out in pieces as they come, after the messages it must follow,
        with the pipe held so that no other message lands inside it."""
        self.engine.log.skip(rule=None, transport=TRANSPORT, session=self.session, phase=phase,
                             reason=f"a line over {MAX_LINE >> 20} MiB passes through unexamined")
        if (before := lane.ordered_tail()) is not None:
            await asyncio.wait([before])
        async with pipe.lock:
            await pipe.write(first)
            async for piece, whole in rest:
                self._reads[phase] += 1
                await pipe.write(piece)
                if whole:
                    return

    def _track(self, msg: Message) -> _Call | None:
        """Pair the agent's requests with the server's replies by JSON-RPC id, for rules and the call log.

        Requests the server sends the agent (sampling, roots, ping) use their own ids and are not tracked.
        """
        rpc = msg.rpc
        if rpc is None or "id" not in rpc:
            return None
        key = rpc_key(rpc["id"])
        if msg.phase is Phase.REQUEST:
            if "method" not in rpc:
                return None  # the agent answering the server
            call = self._pending[key] = _Call(key, msg)
            if self.engine.tracing.on:
                self.engine.tracing.start(msg, network="pipe")
            if len(self._pending) > MAX_PENDING:
                del self._pending[next(iter(self._pending))]
            return call
        if "method" in rpc:
            return None  # a request from the server
        answered = self._pending.get(key)  # pending until _finish: a fault may hold the reply yet
        if answered is not None:
            msg.request = answered.request
        return answered

    async def _decide(self, msg: Message, line: bytes, pipe: _Pipe, lane: _Lane) -> None:
        """Ask the engine about one line and carry out its answer, after the messages it must follow.

        What a fault holds is the message (its body and what was parsed of it), not the line too.
        """
        original = msg.body
        assert original is not None
        newline = line[len(original):]
        call = self._track(msg)
        fired = self.engine.decide(msg)
        if call is not None:
            call.faults.extend(f.rule.name for f in fired)
        actions = [f.action for f in fired]
        arrived = time.monotonic()
        await lane.deliver(lambda: self._act(msg, original, newline, actions, call, pipe, arrived),
                           size=len(line), waits=any(_waits(action) for action in actions),
                           ordered=_keeps_order(msg))

    async def _act(self, msg: Message, original: bytes, newline: bytes, actions: list[Action],
                   call: _Call | None, pipe: _Pipe, arrived: float) -> None:
        """Carry out the fired faults' actions on one message, in rule order (fail open on a bug)."""
        try:
            await self._carry_out(msg, newline, actions, call, pipe, arrived)
        except Exception:  # fail open: the line passes as it came
            ops.exception("stdio: carrying out %s failed; passing the line through", actions)
            await pipe.send(original + newline)

    async def _carry_out(self, msg: Message, newline: bytes, actions: list[Action], call: _Call | None,
                         pipe: _Pipe, arrived: float) -> None:
        """Waits run from when the message arrived (`arrived`), not from when its turn came."""
        due = arrived

        async def wait(seconds: float) -> None:
            nonlocal due
            due += seconds
            await asyncio.sleep(max(0.0, due - time.monotonic()))

        assert msg.body is not None
        payload = msg.body + newline  # as it came, or as a Rewrite left it
        drip: Drip | None = None
        cut: int | None = None
        outcome = Outcome.OK
        for action in actions:
            match action:
                case Delay(seconds):
                    await wait(seconds)
                case Hang(release_after=seconds):
                    if seconds is None:
                        return self._finish(call, Outcome.HANG)
                    await wait(seconds)
                case Reply(message, delay):
                    await wait(delay)
                    await self._to_agent.send(orjson.dumps(message) + b"\n")
                    return self._finish(call, Outcome.FAULT_RESPONSE)
                case Respond(status, body):
                    if (answer := _http_error(msg, status, body)) is not None:
                        await self._to_agent.send(answer)
                    return self._finish(call, Outcome.FAULT_RESPONSE)
                case Garble(raw):  # the raw bytes take the line's place; its newline still ends them
                    payload = raw + newline
                case Drop():  # nothing takes its place (the notifications a fault sent before it went)
                    return self._finish(call, Outcome.DROPPED)
                case Notify(message):
                    await pipe.send(orjson.dumps(message) + b"\n")
                case Drip():
                    drip = action
                case Truncate(limit, fraction):
                    cut = limit if limit is not None else int(len(payload) * (fraction or 0))
                    outcome = Outcome.TRUNCATED
                case Reset(after_bytes, delay):
                    await wait(delay)
                    cut, outcome = after_bytes or 0, Outcome.RESET
                # CutStream has no stream to cut on stdio; Rewrite is already in msg.body
        await pipe.send(payload[:cut], drip)
        if outcome == Outcome.TRUNCATED:
            pipe.close()
        elif outcome == Outcome.RESET:
            self._crash()
        if msg.phase is Phase.RESPONSE or outcome != Outcome.OK:
            self._finish(call, outcome, reply=msg.rpc if msg.phase is Phase.RESPONSE else None)

    def _crash(self) -> None:
        """A reset on stdio: the agent's pipes close as if the server had died, and the relay ends."""
        ops.warning("reset: closing the agent's pipes as a crashed server would")
        self._to_agent.close()
        self._crashed.set()

    def _finish(self, call: _Call | None, outcome: Outcome = Outcome.OK, reply: dict[str, Any] | None = None) -> None:
        """The call's exchange is over (answered, or ended by a fault): write its call log line."""
        if call is None:
            return
        if self._pending.get(call.key) is call:
            del self._pending[call.key]
        request = call.request
        self.engine.log.call(
            transport=TRANSPORT, session=self.session, method=request.method, tool=request.tool,
            rpc_id=(request.rpc or {}).get("id"), outcome=outcome,
            duration_ms=round((time.perf_counter() - call.started) * 1000, 3), faults=call.faults,
        )
        if request.trace is not None:
            request.trace.end(outcome, reply=reply)


def _keeps_order(msg: Message) -> bool:
    """A message without an id (a notification, a line that is not JSON-RPC) keeps its place in the
    stream; requests and replies are paired by id, so they may arrive in any order."""
    rpc = msg.rpc
    return rpc is None or "id" not in rpc


def _waits(action: Action) -> bool:
    return (isinstance(action, Delay) or (isinstance(action, Hang) and action.release_after is not None)
            or (isinstance(action, Reply) and action.delay > 0))


def _http_error(msg: Message, status: int, body: bytes) -> bytes | None:
    """An HTTP error as an HTTP bridge shows it to a stdio client: a JSON-RPC error answering the call.

    None when there is no call to answer (a notification, a line that is not JSON-RPC).
    """
    call = msg if msg.phase is Phase.REQUEST else msg.request
    rpc = call.rpc if call is not None else None
    if rpc is None or "method" not in rpc or "id" not in rpc:
        return None
    text = body.decode("utf-8", "replace").strip()
    return orjson.dumps(error_reply(msg, HTTP_ERROR, f"HTTP {status}: {text}")) + b"\n"


async def _lines(reader: asyncio.StreamReader, limit: int = MAX_LINE) -> AsyncIterator[tuple[bytes, bool]]:
    """(line, True) for each line as soon as it is complete, with its newline (the last may lack one).

    A line longer than the reader's buffer is gathered piece by piece, up to `limit`; a longer one
    (a runaway line, binary garbage without newlines) comes as (piece, False) ... (last piece, True),
    so that no more than `limit` bytes are ever held.
    """
    while True:
        parts: list[bytes] = []
        held = 0
        try:
            while True:
                try:
                    parts.append(await reader.readuntil(b"\n"))
                    break
                except asyncio.LimitOverrunError as exc:
                    parts.append(await reader.readexactly(exc.consumed))
                    held += exc.consumed
                    if held > limit:
                        yield b"".join(parts), False
                        parts, held = [], 0
        except asyncio.IncompleteReadError as exc:
            parts.append(exc.partial)
            if line := b"".join(parts):
                yield line, True
            return
        except OSError:
            return
        yield parts[0] if len(parts) == 1 else b"".join(parts), True


async def _tapped(lines: AsyncIterator[tuple[bytes, bool]],
                  tap: Callable[[bytes], None]) -> AsyncIterator[tuple[bytes, bool]]:
    """`lines`, each handed to `tap` as it is read (before any fault acts on it)."""
    async for line, whole in lines:
        tap(line)
        yield line, whole


async def _open_reader(pipe: IO[bytes]) -> tuple[AsyncIterator[tuple[bytes, bool]], asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return _lines(reader), transport


async def _open_writer(pipe: IO[bytes]) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), pipe)
    return asyncio.StreamWriter(transport, protocol, None, loop)


def _as_pipe(fd: int, *, reading: bool) -> tuple[int, threading.Thread | None]:
    """`fd` itself when it is a pipe or a socket (what MCP clients give), else a pipe a thread pumps.

    Event loops watch only pipes and sockets (uvloop aborts on a regular file or /dev/null, and a
    shared tty must not be made non-blocking), yet `chaosproxy stdio -- cmd < requests.jsonl` should work.
    """
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return fd, None
    read_end, write_end = os.pipe()
    source, sink, ours = (fd, write_end, read_end) if reading else (read_end, fd, write_end)
    thread = threading.Thread(target=_copy, args=(source, sink), name=f"stdio-copy-{fd}", daemon=True)
    thread.start()
    return ours, thread


def _copy(source: int, sink: int) -> None:
    """Copy until EOF (or a closed sink), then close both, so the reader after us sees EOF."""
    try:
        while data := os.read(source, 1 << 16):
            view = memoryview(data)
            while view:
                view = view[os.write(sink, view):]
    except OSError:
        pass
    finally:
        os.close(source)
        os.close(sink)
