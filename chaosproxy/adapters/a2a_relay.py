"""The A2A relay: A2A requests and replies through the engine, by way of the view.

For each A2A request (`wire.classify`) the relay sets `Message.a2a` (so rules match on the method,
skill, task state and agent) and, when some rule may act on its reply, reads the reply piece by piece
(a task, a message, a status or artifact update: in a whole body, or event by event in a stream) and
asks the engine about each: once as the A2A piece itself (the task-state faults, with the task as the
decision's key, so that a task meets the same fault in every reply about it), once as a tools/call
result of the texts it carries and the outcome it reports (the content and reward faults: `texts`).
Only what a fault that fired changed is written back; a reply no rule changed goes as it came. A fault
fires only when the reply can carry what it did (`Engine.decide`'s `carries`): so a fault is logged
exactly when the agent gets other bytes than the remote agent sent.

The card is always read: its interface URLs are pointed back through the proxy (else the client
calls the remote agent directly), and faults on the card act on it then.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from yarl import URL

from chaosproxy.adapters.llm_relay import key_of
from chaosproxy.adapters.session_memory import Bounded, SessionMemory
from chaosproxy.engine.actions import Action, EndStream, Garble, Reply, Respond, Rewrite, Withhold
from chaosproxy.engine.core import Engine, Fired
from chaosproxy.engine.interest import Interest
from chaosproxy.engine.message import Message, Phase
from chaosproxy.faults._task_state import TaskStateFault
from chaosproxy.protocols import a2a, streams
from chaosproxy.protocols.a2a import card as cards
from chaosproxy.protocols.a2a import wire
from chaosproxy.protocols.a2a.texts import PieceTexts
from chaosproxy.protocols.a2a.wire import A2aCall, Piece
from chaosproxy.protocols.tasks import TaskState
from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.redact import redacted_url

MAX_SESSIONS = 1024
MAX_TASKS = Bounded.LIMIT  # per session: task ordinals, states and held results, oldest forgotten first
MAX_EVENT = 16 << 20
MAX_TOLD = 64  # things said once per route (URLs a card names elsewhere, ...): beyond, nothing more is said
MAX_URL_SHOWN = 200


@dataclass(slots=True)
class Memory:
    """What the relay remembers of one session's tasks."""

    ordinals: Bounded[str, int] = field(default_factory=Bounded)  # task id -> order of first appearance
    states: Bounded[str, TaskState] = field(default_factory=Bounded)  # task id -> the state last relayed
    held: Bounded[str, dict[str, Any]] = field(default_factory=Bounded)  # task id -> the real task a fault
    # replaced: its follow-ups are answered from it
    streams: int = 0  # the session's streams so far


@dataclass(frozen=True, slots=True)
class _Interest:
    """What the rules in force may act on."""

    pieces: bool  # rules on replies' messages: A2A pieces and their texts
    requests: bool  # rules on requests' messages (REST requests are read into JSON-RPC form for them)
    cards: bool  # rules on the card itself (agent_card_drift)
    by_state: bool  # a rule on replies names a task state (known from each piece only)


def _interest(interest: Interest) -> _Interest:
    rules = [rule for rule in interest.rules if rule.enabled and rule.fault.on_messages]
    replies = [rule.fault for rule in rules if rule.fault.phase is Phase.RESPONSE]
    return _Interest(
        pieces=bool(replies),
        requests=any(rule.fault.phase is Phase.REQUEST for rule in rules),
        cards=any(fault.methods is not None and fault.methods & a2a.CARDS for fault in replies),
        by_state=any(rule.match.task_state is not None for rule in rules if rule.fault.phase is Phase.RESPONSE),
    )


class A2aRelay:
    """A2A awareness for one HTTP route (one remote agent): opens an `A2aExchange` per A2A request."""

    def __init__(self, engine: Engine, prefix: str, upstream: URL) -> None:
        self.engine = engine
        self.prefix = prefix  # the route's path prefix, in front of the card's URLs as rewritten
        self.upstream = upstream.with_user(None)  # the card's URLs under it point back through the proxy
        self.agent: str | None = None  # the remote agent's name, as its card says
        self.skills: list[str] = []  # the skill ids its card lists (before any fault)
        self.served_card = False  # a card came through: requests on this route are A2A without A2A-Version
        self.memory = SessionMemory(engine, Memory, MAX_SESSIONS)
        self._told: set[str] = set()  # warnings given once

    @property
    def interest(self) -> _Interest:
        return self.engine.interest.derived(_interest)

    def open(self, msg: Message) -> A2aExchange | None:
        """The exchange for an A2A request (setting msg.a2a), or None when it is none or nothing can act
        on it (then it is relayed as any request; a card is always opened, to point it back here)."""
        if self.engine.interest.idle and not wire.is_card(msg.http_method, msg.path):
            return None
        try:
            call = wire.classify(msg, self.served_card)
        except Exception as exc:  # fail open: a bug here must not break the agent's traffic
            self.failed(msg, "reading the request", exc)
            return None
        if call is None:
            return None
        call.agent = self.agent
        if call.skill is None and len(self.skills) == 1:
            call.skill = self.skills[0]
        memory = self.memory(msg.session)
        if call.task_id is not None:
            call.state = memory.states.get(call.task_id)
        msg.a2a = call
        return A2aExchange(self, msg, call, memory)

    def tell_once(self, msg: Message, topic: str, reason: str) -> None:
        if topic not in self._told and len(self._told) < MAX_TOLD:
            self._told.add(topic)
            self.skip(msg, reason)

    def skip(self, msg: Message, reason: str) -> None:
        self.engine.log.skip(rule=None, transport=msg.transport, session=msg.session, path=msg.path, reason=reason)

    def failed(self, msg: Message, what: str, exc: Exception) -> None:
        """A bug of the relay's own: logged, and the message passes as it came."""
        ops.exception("A2A relay failed %s of %s %s; passing it through", what, msg.http_method, msg.path)
        self.engine.log.error(rule=None, transport=msg.transport, session=msg.session, path=msg.path,
                              error=f"{what}: {exc!r}")


class A2aExchange:
    """One A2A request and its reply."""

    def __init__(self, relay: A2aRelay, msg: Message, call: A2aCall, memory: Memory) -> None:
        self.relay = relay
        self.engine = relay.engine
        self.msg = msg
        self.call = call
        self.memory = memory
        self.interest = relay.interest
        self.faults: list[str] = []  # names of the rules that fired, for the call line (the adapter's list)
        self.card = call.method == a2a.GET_AGENT_CARD
        # the id the synthetic messages carry, so each fault line names the call it hit (a REST call: none)
        self.rpc_id = (msg.rpc or {}).get("id") if call.binding == wire.JSONRPC else None
        self._watching: bool | None = None

    @property
    def watching(self) -> bool:
        """True when the reply must be read: a card (its URLs), or a reply some rule may change (judged
        once, from the request: its method, agent and skill; a rule on a task state may match any reply)."""
        if self._watching is None:
            self._watching = self.card or self.call.method == a2a.GET_EXTENDED_CARD or (
                self.interest.pieces and (self.interest.by_state or any(
                    self.engine.interest.faults(self._probe(method)) for method in (self.call.method, "tools/call"))))
        return self._watching

    def _probe(self, method: str) -> Message:
        """A reply to this call as a rule on replies would see it: the A2A piece, or its texts as a tool result."""
        call = replace(self.call, kind="task")
        request = self._synthetic(Phase.REQUEST, {"jsonrpc": "2.0", "id": self.rpc_id, "method": method,
                                                  "params": {"name": call.skill or call.agent or "a2a"}}, call)
        return self._synthetic(Phase.RESPONSE, {"jsonrpc": "2.0", "id": self.rpc_id, "result": {}}, call,
                               request=request)

    # --- the request -------------------------------------------------------------------------

    def request_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The headers sent upstream: a card is asked for plain (it is read), and whole when a rule may
        change it (the proxy answers If-None-Match itself, against the card the agent gets)."""
        if not self.card:
            return headers
        drop = (b"accept-encoding", b"if-none-match") if self.interest.cards else (b"accept-encoding",)
        return [(name, value) for name, value in headers if name.lower() not in drop] + [
            (b"Accept-Encoding", b"identity")]

    async def answer(self) -> Respond | None:
        """The proxy's own answer to this request, or None for it to go upstream: a follow-up to a task
        whose result a fault holds, or what a rule on a REST request's message said (given after the
        wait its fault asked for, as a JSON-RPC request's: a timeout's)."""
        try:
            if self.call.method in a2a.SENDS and self.call.followup and self.call.task_id in self.memory.held:
                return self._answer_followup()
            if self.call.binding == wire.REST and self.interest.requests and self.msg.body:
                reply = self._decide_rest_request()
                if reply is not None:
                    await asyncio.sleep(reply.delay)
                    return _rest_answer(reply.message)
        except Exception as exc:  # fail open: the request goes as the agent sent it
            self.relay.failed(self.msg, "deciding on the request", exc)
        return None

    def _decide_rest_request(self) -> Reply | None:
        """A REST request's body, read as the JSON-RPC request it stands for, through the message rules:
        the Reply a fault answers it with, or None (the body then as the faults that fired left it)."""
        body = wire.json_value(self.msg.body or b"")
        if not isinstance(body, dict):
            return None
        view = self._synthetic(Phase.REQUEST, {"jsonrpc": "2.0", "id": self.rpc_id, "method": self.call.method,
                                               "params": body}, self.call)
        before = view.rpc
        new_params = _rewrites(view, "params")
        for fired in self._decide(view, carries=lambda action: isinstance(action, Reply) or new_params(action)):
            if isinstance(fired.action, Reply):
                return fired.action
        if view.rpc is not before and isinstance(params := (view.rpc or {}).get("params"), dict):
            self.msg.body = orjson.dumps(params)
        return None

    def _answer_followup(self) -> Respond:
        """A message sent to a task a fault holds: the held task decided on again (the fault asks again,
        or lets the real result go), answered here; the remote agent finished the task already."""
        task_id = self.call.task_id
        assert task_id is not None
        holder = {"result": self.memory.held[task_id]}
        piece = wire.pieces(holder)[0]
        self._decide_piece(piece, self.call.piece(piece))
        answered = holder["result"]
        if not any(self._holding(name) for name in self.faults):
            del self.memory.held[task_id]  # let go: the agent has the real result now
        result = wire.task_result(self.call, answered)
        body = wire.result_body(self.call, self.rpc_id, result)
        if self.call.method == a2a.SEND_STREAMING_MESSAGE:
            return Respond(200, wire.sse_event(body), {"Content-Type": "text/event-stream"})
        return Respond(200, body, {"Content-Type": "application/json"})

    def _holding(self, rule: str) -> bool:
        return any(r.name == rule and isinstance(r.fault, TaskStateFault) and r.fault.holds_results
                   for r in self.engine.scenario.rules)


    # --- the card ----------------------------------------------------------------------------

    def relay_card(self, payload: bytes, headers: MutableMapping[str, str]) -> tuple[int, bytes]:
        """The card as the agent gets it (status, body): its URLs through the proxy, decided on; the
        header changes it needs go to `headers` (its own ETag when a rule may change it)."""
        try:
            return self._relay_card(payload, headers)
        except Exception as exc:  # fail open: the card goes as the remote agent sent it
            self.relay.failed(self.msg, "rewriting the card", exc)
            return 200, payload

    def _relay_card(self, payload: bytes, headers: MutableMapping[str, str]) -> tuple[int, bytes]:
        card = wire.json_value(payload)
        if not isinstance(card, dict):
            self.relay.skip(self.msg, "the agent card is not a JSON object: relayed as it came")
            return 200, payload
        card, changed = self._card_as_agent_gets(card)
        body = orjson.dumps(card) if changed else payload
        if self.interest.cards:  # its own validator: a card that drifts must not be revalidated by upstream's
            headers["ETag"] = tag = cards.etag(body)
            if cards.if_none_match_hits(self.msg.headers.get("If-None-Match"), tag):
                return 304, b""
        return 200, body

    def _card_as_agent_gets(self, card: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """A card (public, or the extended one) as the agent gets it, and whether that is not as it came:
        its URLs through the proxy, the faults on cards decided. What it says of the agent is learnt."""
        msg, relay = self.msg, self.relay
        relay.served_card = True
        relay.agent = card.get("name") if isinstance(card.get("name"), str) else None
        relay.skills = cards.skill_ids(card)
        changed = False
        base = cards.proxy_base(msg.headers.get("Host"), relay.prefix)
        if base is None:
            relay.tell_once(msg, "host", "the agent's Host header is no host[:port]: the card's URLs are left "
                                         "as they are, and the client calls the remote agent directly")
        else:
            before = orjson.dumps(card)
            for url in cards.point_through(card, relay.upstream, base):
                shown = redacted_url(url)[:MAX_URL_SHOWN]  # the remote agent's words: no secret, bounded
                relay.tell_once(msg, shown, f"the agent card names {shown}, which is not under this route's "
                                            "upstream: calls to it do not go through the proxy (add a route for it)")
            changed = orjson.dumps(card) != before
        if self.interest.cards:
            call = A2aCall(self.call.method, self.call.version, self.call.binding, agent=relay.agent, kind="card")
            view = self._synthetic(Phase.RESPONSE, {"jsonrpc": "2.0", "id": self.rpc_id, "result": card}, call)
            self._decide(view, carries=_rewrites(view, "result"))
            if isinstance(new := (view.rpc or {}).get("result"), dict) and new is not card:
                card, changed = new, True
        if changed and "signatures" in card:
            relay.tell_once(msg, "signatures", "the agent card is signed: the proxy changed it (its URLs, or a "
                                               "fault), so its signatures no longer verify; a client that verifies "
                                               "signatures rejects it")
        return card, changed

    # --- replies -----------------------------------------------------------------------------

    def relay_body(self, payload: bytes, status: int | None) -> bytes:
        """A whole (non-streamed) reply, its pieces decided on."""
        if status != 200 or not self.watching:
            return payload
        try:
            held = self._holder(payload)
            if held is None:
                return payload
            holder, unwrap = held
            changed = False
            if self.call.method == a2a.GET_EXTENDED_CARD and isinstance(holder["result"], dict):
                holder["result"], changed = self._card_as_agent_gets(holder["result"])
            for piece in wire.pieces(holder):
                changed |= self._decide_piece(piece, self.call.piece(piece))
            return orjson.dumps(unwrap(holder)) if changed else payload
        except Exception as exc:  # fail open: the reply goes as the remote agent sent it
            self.relay.failed(self.msg, "rewriting the reply", exc)
            return payload

    def _holder(self, data: bytes) -> tuple[dict[str, Any], Callable[[dict[str, Any]], Any]] | None:
        """The reply's result under "result" (a JSON-RPC reply as it is; a REST body put there), and how
        to get the wire form back; None when the reply carries no result."""
        parsed = wire.json_value(data)
        if self.call.binding == wire.JSONRPC:
            return (parsed, lambda holder: holder) if isinstance(parsed, dict) and "result" in parsed else None
        return ({"result": parsed}, lambda holder: holder["result"]) if isinstance(parsed, dict) else None

    async def relay_events(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A stream of task events, decided on event by event as they arrive (never buffered whole); it
        ends after an event a fault made final (the remote agent's later events are not relayed)."""
        if not self.watching:
            async for chunk in chunks:
                yield chunk
            return
        self.memory.streams += 1
        stream, events = self.memory.streams, 0
        snapshot: dict[str, Any] = {}  # the task as its events built it (a held result needs it whole)
        async for frame in streams.sse_frames(chunks, MAX_EVENT):
            data = None if isinstance(frame, streams.Unframed) else streams.sse_data(frame)
            held = self._holder(data) if data is not None else None
            found = wire.pieces(held[0]) if held is not None else []
            if held is None or not found:
                yield frame
                continue
            holder, unwrap = held
            piece = found[0]
            events += 1
            real_ends = piece.ends_stream
            _build(snapshot, piece)
            call = self.call.piece(piece, events - 1)
            call.stream = stream
            try:
                outcome = self._decide_piece(piece, call, snapshot=snapshot, streamed=True)
            except Exception as exc:  # fail open: the event goes as the remote agent sent it
                self.relay.failed(self.msg, "rewriting a stream event", exc)
                outcome = None
            if isinstance(outcome, EndStream):
                if outcome.idle:
                    await asyncio.Event().wait()  # silent until the agent gives up (the task is cancelled)
                return
            if isinstance(outcome, Withhold):
                continue
            if isinstance(outcome, bytes):
                yield streams.sse_with_data(frame, outcome)
            elif outcome is True:
                yield streams.sse_with_data(frame, orjson.dumps(unwrap(holder)))
                piece = wire.pieces(holder)[0]
            else:
                yield frame
            if piece.ends_stream and not real_ends:
                return  # a fault ended the task here: what upstream says after it is not the agent's to see

    # --- deciding on a piece -----------------------------------------------------------------

    def _decide_piece(self, piece: Piece, call: A2aCall, *, snapshot: dict[str, Any] | None = None,
                      streamed: bool = False) -> Any:
        """Ask the engine about one piece (as itself, then its texts as a tool result), put what fired
        in its place. Returns True when the piece changed; a stream's event may also be withheld or end
        the stream (EndStream, Withhold) or be replaced by broken bytes (a whole reply keeps what it
        cannot do without: there, faults that would do so do not fire)."""
        task_id = piece.task_id
        key = self._task_key(task_id) if task_id is not None else None
        if key is None and streamed:
            key = f"a2a stream#{call.stream}"
        real = piece.obj
        view = self._synthetic(Phase.RESPONSE, {"jsonrpc": "2.0", "id": self.rpc_id, "result": piece.obj}, call)
        new_piece = _rewrites(view, "result")
        fired = self._decide(view, key, carries=lambda action: new_piece(action) or (  # (a whole reply keeps it)
            streamed and isinstance(action, EndStream | Withhold | Garble)))
        changed = False
        for one in fired:
            action = one.action
            if isinstance(action, EndStream | Withhold):
                return action
            if isinstance(action, Garble):
                return action.raw
        new = (view.rpc or {}).get("result")
        if isinstance(new, dict) and new is not real:
            piece.put(new)
            piece = wire.Piece(piece.kind, new, piece.put)
            changed = True
            if task_id is not None and any(isinstance(f.fault, TaskStateFault) and f.fault.holds_results
                                           and isinstance(f.action, Rewrite) for f in fired):
                held = dict(snapshot) if snapshot else real
                self.memory.held.remember(task_id, held if held.get("id") == task_id else real)
        said = self._decide_texts(piece, call, key)
        if said is not None:
            piece.put(said)
            piece = wire.Piece(piece.kind, said, piece.put)
            changed = True
        state = piece.state
        if task_id is not None and state is not None:
            self.memory.states.remember(task_id, state)
        if self.msg.trace is not None:  # the call's span: the task, in the state the agent got
            self.msg.trace.task(task_id, state.value if state is not None else None)
        return changed

    def _decide_texts(self, piece: Piece, call: A2aCall, key: str | None) -> dict[str, Any] | None:
        """The piece's texts (and outcome), as a tools/call result of its skill (or agent), through the
        content and reward faults: the piece saying what they made of it, or None when none changed it.
        Only what the piece can carry back fires (`texts.PieceTexts`)."""
        texts = PieceTexts.of(piece, call)
        if texts is None:
            return None
        name = call.skill or call.agent or "a2a"
        request = self._synthetic(Phase.REQUEST, {"jsonrpc": "2.0", "id": self.rpc_id, "method": "tools/call",
                                                  "params": {"name": name, "arguments": {}}}, call)
        result = texts.result()
        view = self._synthetic(Phase.RESPONSE, {"jsonrpc": "2.0", "id": self.rpc_id, "result": result}, call,
                               request=request)

        def carries(action: Action) -> bool:
            said = texts.written(action.message.get("result")) if isinstance(action, Rewrite) else None
            return said is not None and said != texts.written((view.rpc or {}).get("result"))

        fired = self._decide(view, key_of("a2a texts", key or "", orjson.dumps(result)), carries=carries)
        return texts.written((view.rpc or {}).get("result")) if fired else None

    def _task_key(self, task_id: str) -> str:
        """A task's decision key: its order of first appearance in the session, not its id (a random
        one), so that the same run meets the same faults."""
        ordinals = self.memory.ordinals
        ordinal = ordinals.get(task_id)
        if ordinal is None:
            ordinal = len(ordinals) + 1 if len(ordinals) < MAX_TASKS else max(ordinals.values()) + 1
            ordinals.remember(task_id, ordinal)
        return f"a2a task#{ordinal}"

    def _synthetic(self, phase: Phase, rpc: dict[str, Any], call: A2aCall, *,
                   request: Message | None = None) -> Message:
        base = self.msg
        msg = Message(base.transport, phase, session=base.session, http_method=base.http_method, path=base.path,
                      headers=base.headers, route=base.route, request=request)
        if phase is Phase.RESPONSE and request is None:  # the A2A request it answers, in its JSON-RPC form
            msg.request = self._synthetic(Phase.REQUEST, {"jsonrpc": "2.0", "id": self.rpc_id, "method": call.method},
                                          call)
        msg.a2a = call
        msg.trace = base.trace
        msg.replace(rpc)
        return msg

    def _decide(self, message: Message, key: str | None = None, *,
                carries: Callable[[Action], bool]) -> list[Fired]:
        """The faults that fire on a synthetic message: only those whose action this relay carries out."""
        fired = self.engine.decide(message, wire=False, key=key, carries=carries)
        self.faults.extend(f.rule.name for f in fired)
        return fired


def _rewrites(view: Message, field: str) -> Callable[[Action], bool]:
    """Whether an action puts a new `field` (an object: a request's params, a reply's result) in `view`:
    all a relay's view carries back into the real message but for answers and stream breaks."""
    def carries(action: Action) -> bool:
        new = action.message.get(field) if isinstance(action, Rewrite) else None
        return isinstance(new, dict) and new != (view.rpc or {}).get(field)
    return carries


def _rest_answer(message: dict[str, Any]) -> Respond:
    """A fault's JSON-RPC answer to a REST request, as HTTP+JSON writes it (an error: its code the status,
    when it is one)."""
    if "error" in message:
        error = message["error"] if isinstance(message["error"], dict) else {}
        code = error.get("code")
        status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        return Respond(status, orjson.dumps({"error": {"code": status, "message": error.get("message")}}),
                       {"Content-Type": "application/json"})
    return Respond(200, orjson.dumps(message.get("result")), {"Content-Type": "application/json"})


def _build(snapshot: dict[str, Any], piece: Piece) -> None:
    """The task as a stream's events tell it so far: its first snapshot, its status, its artifacts."""
    obj = piece.obj
    if piece.kind == "task":
        snapshot.clear()
        snapshot.update(obj)
    elif not snapshot or snapshot.get("id") != piece.task_id:
        return
    elif piece.kind == "status" and isinstance(obj.get("status"), dict):
        snapshot["status"] = obj["status"]
    elif piece.kind == "artifact" and isinstance(artifact := obj.get("artifact"), dict):
        artifacts = list(snapshot.get("artifacts") or [])
        same = next((i for i, one in enumerate(artifacts) if isinstance(one, dict)
                     and one.get("artifactId") == artifact.get("artifactId")), None)
        if same is not None and obj.get("append"):
            artifacts[same] = {**artifacts[same], "parts": [*artifacts[same].get("parts", []),
                                                              *artifact.get("parts", [])]}
        elif same is not None:
            artifacts[same] = artifact
        else:
            artifacts.append(artifact)
        snapshot["artifacts"] = artifacts
