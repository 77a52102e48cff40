"""stdio adapter: spawns the MCP server command and relays newline-delimited JSON-RPC both ways.

The agent runs us in place of the server (we are the command in its MCP config): its stdin lines
go to the child's stdin, the child's stdout lines come back on our stdout, and the child's stderr is
ours. A line passes byte for byte unless a fault changes it, a line that is not JSON passes too,
and only the line in hand is ever held. Every fault, wire or message level, acts per line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from chaosproxy.actions import Action, Delay, Drip, Garble, Hang, Notify, Reply, Reset, Respond, Truncate
from chaosproxy.adapters.jsonrpc import MAX_PENDING, rpc_key
from chaosproxy.engine import Engine
from chaosproxy.log import ops
from chaosproxy.mcp import error_reply
from chaosproxy.message import Message, Phase

TRANSPORT = "stdio"
SESSION = "stdio"  # one agent per relay process; a constant keeps seeded decisions reproducible
CLOSE_GRACE = 10.0  # after its stdin closes, how long the server may finish its work (clients signal sooner)
KILL_GRACE = 2.0  # after SIGTERM, before SIGKILL; after SIGKILL, before giving up on it
DRAIN_GRACE = 1.0  # after the server exits, how long its last lines may take (a grandchild may hold the pipe)
EXIT_CRASHED = 1  # our exit status after a reset: the agent saw the server die
MAX_LINE = 16 << 20  # a longer line passes through in pieces, unexamined: it is never held whole
LANE_DEPTH = 1000  # messages a direction may hold behind a delay before it stops reading, as a full pipe does
PR_SET_PDEATHSIG = 1
HTTP_ERROR = -32000  # what an HTTP bridge in front of a stdio server reports for an HTTP error


class SpawnError(Exception):
    """The server command cannot run; `status` is what a shell would exit with (127, 126)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def spawn(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start the server with pipes for stdin and stdout; stderr and the environment are ours.

    On Linux the server is killed if the relay dies without stopping it (SIGKILL from the host):
    it must never outlive the relay as an orphan.
    """
    try:
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    except FileNotFoundError:
        raise SpawnError(127, f"chaosproxy stdio: {command[0]}: command not found") from None
    except OSError as exc:
        raise SpawnError(126, f"chaosproxy stdio: cannot run {command[0]}: {exc.strerror or exc}") from None


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent goes (and at once if it already went)."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def claim_stdio() -> tuple[int, int]:
    """Take fds 0 and 1 for the relay, leaving /dev/null and stderr in their place.

    Only protocol frames may reach the client, so a stray print from anywhere in the process lands
    on stderr; and closing the relay's copies really closes the client's pipes (it waits for EOF).
    """
    agent_in, agent_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return agent_in, agent_out


def exit_status(returncode: int | None) -> int:
    """The child's exit code as a shell reports it (128 + N for death by signal N)."""
    if returncode is None:
        return EXIT_CRASHED
    return 128 - returncode if returncode < 0 else returncode


@dataclass(slots=True)
class _Call:
    """An agent's request on its way to an answer, for the call log."""

    key: Any
    request: Message
    started: float = field(default_factory=time.perf_counter)
    faults: list[str] = field(default_factory=list)


class _Pipe:
    """The write end of one direction. Frames go out whole and in order (a drip holds the pipe, as a
    slow pipe would), and a reader that went away closes the pipe instead of failing the relay."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._lock = asyncio.Lock()

    async def send(self, data: bytes, drip: Drip | None = None) -> None:
        if not data:
            return
        size, delay = (len(data), 0.0) if drip is None else (drip.chunk_bytes, drip.delay)
        async with self._lock:
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

    def close(self) -> None:
        self._writer.close()

    async def wait_closed(self, timeout: float) -> None:
        self.close()
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), timeout)


class _Lane:
    """One direction's deliveries, in order, as through a slow pipe: a message a delay holds holds
    the ones after it too (head-of-line), and none overtakes another. A message's delay runs from
    when it arrived, so a steady stream under `latency` keeps its rate and arrives late, not slower."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self._tail: asyncio.Task[None] | None = None

    async def deliver(self, work: Callable[[], Awaitable[None]], *, waits: bool) -> None:
        """Carry out `work` in turn: at once when nothing is held and it does not wait, else behind the
        held ones (the reader goes on meanwhile, up to LANE_DEPTH held messages)."""
        if not waits and (self._tail is None or self._tail.done()):
            await work()
            return
        previous = self._tail

        async def in_turn() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            await work()

        task = self._tail = asyncio.create_task(in_turn())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if len(self.tasks) > LANE_DEPTH:
            await asyncio.wait([task])

    async def idle(self) -> None:
        if self._tail is not None:
            await asyncio.wait([self._tail])

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


class StdioRelay:
    """One agent, one server process: relays lines both ways and carries out the engine's decisions."""

    def __init__(self, engine: Engine, server: subprocess.Popen[bytes], *, session: str = SESSION,
                 close_grace: float = CLOSE_GRACE) -> None:
        self.engine = engine
        self.server = server
        self.session = session
        self.close_grace = close_grace
        self._pending: dict[Any, _Call] = {}  # oldest first
        self._lanes = {Phase.REQUEST: _Lane(), Phase.RESPONSE: _Lane()}
        self._crashed = asyncio.Event()

    async def run(self, agent_in: int, agent_out: int) -> int:
        """Relay until the server exits, the agent hangs up or a reset; the fds become the relay's.

        SIGINT and SIGTERM are passed on to the server, as if the client had signalled it directly;
        one that ignores them is killed after KILL_GRACE. Returns the status to exit with: the
        server's, or EXIT_CRASHED after a reset.
        """
        loop = asyncio.get_running_loop()
        in_fd, _ = _as_pipe(agent_in, reading=True)
        out_fd, out_copier = _as_pipe(agent_out, reading=False)
        agent_lines, agent_reading = await _open_reader(open(in_fd, "rb", buffering=0))  # noqa: SIM115
        self._to_agent = _Pipe(await _open_writer(open(out_fd, "wb", buffering=0)))  # noqa: SIM115
        assert self.server.stdin is not None and self.server.stdout is not None
        self._to_server = _Pipe(await _open_writer(self.server.stdin))
        server_lines, _ = await _open_reader(self.server.stdout)

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
            if exited.done():  # requests held by a delay have no one to go to: the agent learns at once
                self._lanes[Phase.REQUEST].cancel()
            await self._settle()
            await self._stop_server(exited)
            await asyncio.wait([replies], timeout=DRAIN_GRACE)  # relay what it said before it exited
            await self._settle()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for task in (requests, replies, crashed):
                task.cancel()
            for lane in self._lanes.values():
                lane.cancel()
            await self._to_agent.wait_closed(DRAIN_GRACE)
            if out_copier is not None:
                await asyncio.to_thread(out_copier.join, DRAIN_GRACE)
            for call in list(self._pending.values()):
                self._finish(call, "unanswered")
            self.engine.end_session(self.session)  # one agent per relay: its session ends with it
        status = exit_status(self.server.returncode)
        if status:
            ops.warning("server command exited with status %d", status)
        return EXIT_CRASHED if self._crashed.is_set() else status

    async def _settle(self) -> None:
        """Let the messages a delay holds arrive (bounded) before the pipe they go to closes."""
        held = [task for lane in self._lanes.values() for task in lane.tasks]
        if held and not self._crashed.is_set():
            await asyncio.wait(held, timeout=self.close_grace)

    def _pass_on(self, sig: int, exited: asyncio.Future[int]) -> None:
        """A signal for the relay goes to the server; SIGKILL follows if it is still there after KILL_GRACE."""
        if exited.done():
            return
        self.server.send_signal(sig)
        asyncio.get_running_loop().call_later(KILL_GRACE, self._kill_lingering, exited)

    def _kill_lingering(self, exited: asyncio.Future[int]) -> None:
        if not exited.done() and self.server.poll() is None:
            ops.warning("server (pid %d) ignored the signal for %g s; sending SIGKILL", self.server.pid, KILL_GRACE)
            self.server.kill()

    async def _stop_server(self, exited: asyncio.Future[int]) -> None:
        """Close its stdin, as MCP clients do to end a session; SIGTERM, then SIGKILL, if it lingers."""
        self._to_server.close()
        for escalate, grace in ((None, self.close_grace), (self.server.terminate, KILL_GRACE),
                                (self.server.kill, KILL_GRACE)):
            if escalate is not None:
                ops.warning("server (pid %d) still running; sending %s", self.server.pid, escalate.__name__)
                escalate()
            await asyncio.wait([exited], timeout=grace)
            if exited.done():
                return

    async def _pump(self, lines: AsyncIterator[tuple[bytes, bool]], phase: Phase) -> None:
        """Relay one direction line by line: as is when no rule can act on it, else via the engine.

        A line over MAX_LINE comes in pieces and goes out as they come, in turn, unexamined.
        """
        pipe = self._to_server if phase is Phase.REQUEST else self._to_agent
        lane = self._lanes[phase]
        oversize = False
        async for line, whole in lines:
            if not whole or oversize:
                if not oversize:
                    oversize = True
                    self.engine.log.skip(rule=None, transport=TRANSPORT, session=self.session, phase=phase,
                                         reason=f"a line over {MAX_LINE >> 20} MiB passes through unexamined")
                await lane.idle()
                await pipe.send(line)
                oversize = not whole
                continue
            msg = Message(TRANSPORT, phase, session=self.session, body=line.rstrip(b"\r\n"))
            if self.engine.active(phase):
                await self._decide(msg, line, pipe, lane)
            elif phase is Phase.REQUEST:
                self._track(msg)  # before the server can answer it
                out = line if msg.trace is None else msg.body + b"\n"  # msg.body: with our _meta
                await lane.deliver(lambda out=out: pipe.send(out), waits=False)
            else:
                await lane.deliver(lambda line=line: pipe.send(line), waits=False)
                self._finish(self._track(msg), reply=msg.rpc)  # parsed only after it is on its way

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
        answered = self._pending.pop(key, None)
        if answered is not None:
            msg.request = answered.request
        return answered

    async def _decide(self, msg: Message, line: bytes, pipe: _Pipe, lane: _Lane) -> None:
        """Ask the engine about one line and carry out its answer, in turn with the lines before it."""
        original = msg.body
        assert original is not None
        call = self._track(msg)
        fired = self.engine.decide(msg)
        if call is not None:
            call.faults.extend(f.rule.name for f in fired)
        actions = [f.action for f in fired]
        arrived = time.monotonic()
        await lane.deliver(lambda: self._act(msg, line, original, actions, call, pipe, arrived),
                           waits=any(_waits(action) for action in actions))

    async def _act(self, msg: Message, line: bytes, original: bytes, actions: list[Action],
                   call: _Call | None, pipe: _Pipe, arrived: float) -> None:
        """Carry out the fired faults' actions on one message, in rule order (fail open on a bug)."""
        try:
            await self._carry_out(msg, line, original, actions, call, pipe, arrived)
        except Exception:
            ops.exception("stdio: carrying out %s failed; passing the line through", actions)
            await pipe.send(line)

    async def _carry_out(self, msg: Message, line: bytes, original: bytes, actions: list[Action],
                         call: _Call | None, pipe: _Pipe, arrived: float) -> None:
        """Waits run from when the message arrived (`arrived`), not from when its turn came."""
        due = arrived

        async def wait(seconds: float) -> None:
            nonlocal due
            due += seconds
            await asyncio.sleep(max(0.0, due - time.monotonic()))

        newline = line[len(original):]
        rewritten = msg.body if msg.body is not original else None  # a Rewrite replaced the body
        payload = line if rewritten is None else rewritten + newline
        drip: Drip | None = None
        cut: int | None = None
        outcome = "ok"
        for action in actions:
            match action:
                case Delay(seconds):
                    await wait(seconds)
                case Hang(release_after=seconds):
                    if seconds is None:
                        return self._finish(call, "hang")
                    await wait(seconds)
                case Reply(message, delay):
                    await wait(delay)
                    await self._to_agent.send(orjson.dumps(message) + b"\n")
                    return self._finish(call, "fault_response")
                case Respond(status, body):
                    if (answer := _http_error(msg, status, body)) is not None:
                        await self._to_agent.send(answer)
                    return self._finish(call, "fault_response")
                case Garble(raw):  # the raw bytes take the line's place; its newline still ends them
                    payload = raw + newline
                case Notify(message):
                    await pipe.send(orjson.dumps(message) + b"\n")
                case Drip():
                    drip = action
                case Truncate(limit, fraction):
                    cut = limit if limit is not None else int(len(payload) * (fraction or 0))
                    outcome = "truncated"
                case Reset(after_bytes):
                    cut, outcome = after_bytes or 0, "reset"
                # CutStream has no stream to cut on stdio; Rewrite is already in msg.body
        await pipe.send(payload[:cut], drip)
        if outcome == "truncated":
            pipe.close()
        elif outcome == "reset":
            self._crash()
        if msg.phase is Phase.RESPONSE or outcome != "ok":
            self._finish(call, outcome, reply=msg.rpc if msg.phase is Phase.RESPONSE else None)

    def _crash(self) -> None:
        """A reset on stdio: the agent's pipes close as if the server had died, and the relay ends."""
        ops.warning("reset: closing the agent's pipes as a crashed server would")
        self._to_agent.close()
        self._crashed.set()

    def _finish(self, call: _Call | None, outcome: str = "ok", reply: dict[str, Any] | None = None) -> None:
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


async def _open_reader(pipe: IO[bytes]) -> tuple[AsyncIterator[bytes], asyncio.BaseTransport]:
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
