"""The LLM relay: model-API requests and replies through the engine, by way of the shared view.

For each request the relay builds synthetic MCP-shaped messages (the tools array as a tools/list
result, the newest tool results as tools/call results, the newest user turn as a prompt), asks the
engine with a key naming each message's content, and writes what the faults changed back into the
body. A reply is read only when a rule matched the request and may change it (judged from the request
and the tools the model was shown) or a tool route may; then the relay asks about each tool call the
model made that a rule or route may change (the engine's tool routes undo what the proxy invented) and
about the completion as a whole, and changes in the body or the stream only what a fault that fired changed.

Agents resend the whole history every turn, so what was done to a message once is remembered (per
session, bounded) and done again to its resends: the model never sees its past change.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections import ChainMap
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import orjson

from chaosproxy.adapters.session_memory import Bounded, SessionMemory
from chaosproxy.engine.actions import Action, BlankCompletion, FailStream, Garble, Rewrite
from chaosproxy.engine.actions import Reply as ReplyAction
from chaosproxy.engine.core import Engine, Fired
from chaosproxy.engine.interest import Interest
from chaosproxy.engine.message import Message, Phase
from chaosproxy.faults import Fault, Level
from chaosproxy.faults._llm import LlmFault, PromptFault
from chaosproxy.protocols import streams
from chaosproxy.protocols.llm import api_for_path, stream, view
from chaosproxy.protocols.llm.format import FORMATS, ModelFormat
from chaosproxy.protocols.llm.view import FormatError, Request, ToolCall, ToolResult
from chaosproxy.telemetry.log import ops

MAX_SESSIONS = 1024
MAX_REMEMBERED = Bounded.LIMIT  # per session and kind: tool calls, answers, rewritten history items

if TYPE_CHECKING:  # (imported where used: a proxy loads only the faults its scenario names)
    from chaosproxy.faults.llm_stream_error import LlmStreamErrorFault


def key_of(*parts: str | bytes) -> str:
    """A short digest naming a message's content (the engine draws its decisions from it)."""
    h = hashlib.blake2b(digest_size=12)
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


@dataclass(slots=True)
class Memory:
    """What the relay remembers of one session's conversations, so resent history is treated alike."""

    said: Bounded[str, tuple[str, str]] = field(default_factory=Bounded)  # call id -> what the model said
    relayed: Bounded[str, tuple[str, str]] = field(default_factory=Bounded)  # call id -> what the agent got
    answers: Bounded[str, dict[str, Any]] = field(default_factory=Bounded)  # call id -> the proxy's result
    results: Bounded[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=Bounded)  # call id ->
    # the tool result as the agent sent it and as the model got it
    prompts: Bounded[str, str] = field(default_factory=Bounded)  # a user turn -> as the model got it
    counterparts: Bounded[str, str] = field(default_factory=Bounded)  # shown tool name -> the agent's tool


@dataclass(frozen=True, slots=True)
class _Interest:
    """Which kinds of synthetic message some rule of the scenario in force can act on."""

    tools: bool  # tools arrays and tool results (response-phase message rules)
    prompt: bool
    # the tool globs (None: any tool) of the rules on the model's tool calls (request-phase message rules
    # other than prompt ones)
    call_tools: tuple[str | None, ...]
    completion: bool
    any_llm: bool  # some rule names an api or model or is a model-API fault

    @property
    def calls(self) -> bool:
        return bool(self.call_tools)


def _interest(interest: Interest) -> _Interest:
    rules = [rule for rule in interest.rules if rule.enabled]
    message = [rule for rule in rules if rule.fault.on_messages]

    def target(rule: Any) -> str | None:
        return getattr(rule.fault, "target", None) if rule.fault.level is Level.LLM else None

    return _Interest(
        tools=any(r.fault.phase is Phase.RESPONSE and target(r) is None for r in message),
        prompt=any(target(r) == "prompt" for r in message),
        call_tools=tuple({r.match.tool for r in message if r.fault.phase is Phase.REQUEST and target(r) != "prompt"}),
        completion=any(target(r) == "completion" for r in message),
        any_llm=any(r.match.api or r.match.model or isinstance(r.fault, LlmFault) for r in rules),
    )


class LlmRelay:
    """Model-API awareness for one HTTP route: opens an `LlmExchange` per request it understands."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.memory = SessionMemory(engine, Memory, MAX_SESSIONS)

    @property
    def interest(self) -> _Interest:
        return self.engine.interest.derived(_interest)

    def open(self, msg: Message) -> LlmExchange | None:
        """The exchange for a model-API request (setting msg.api, model and turn), or None: then the
        request is not one (or not one this relay understands) and passes untouched."""
        if msg.http_method != "POST" or msg.path is None:
            return None
        api = api_for_path(msg.path)
        if api is not None and msg.body is not None and msg.rpc is not None:
            return None  # JSON-RPC: an MCP server's legacy POST endpoint (the Python SDK's is /messages/)
        msg.api = api
        if self.engine.interest.idle:
            return None  # nothing can act: the call line still names the API, the body is not parsed
        if api is None:
            if self.interest.any_llm and msg.body and b'"model"' in msg.body[:4096]:
                self.skip(msg, f"POST {msg.path} is no model-API path chaosproxy knows "
                               "(chat/completions, responses, messages)")
            return None
        if msg.body is None:
            self.skip(msg, "the request body was not read (streamed or over the size limit)")
            return None
        try:
            body = orjson.loads(msg.body)
            if not isinstance(body, dict):
                raise FormatError(f"the body is a JSON {type(body).__name__}, not an object")
            request = FORMATS[api].parse_request(body)
        except (orjson.JSONDecodeError, FormatError) as exc:
            self.skip(msg, f"not a valid {api} request: {exc}")
            return None
        except Exception as exc:  # fail open: a bug here must not break the agent's traffic
            self.failed(msg, "reading the request", exc)
            return None
        msg.model, msg.turn = request.model, request.turn
        return LlmExchange(self, FORMATS[api], msg, body, request)

    def skip(self, msg: Message, reason: str) -> None:
        self.engine.log.skip(rule=None, transport=msg.transport, session=msg.session, path=msg.path,
                             api=msg.api, model=msg.model, turn=msg.turn, reason=reason)

    def failed(self, msg: Message, what: str, exc: Exception) -> None:
        """A bug of the relay's own: logged, and the message passes as it came."""
        ops.exception("LLM relay failed %s of %s %s; passing it through", what, msg.http_method, msg.path)
        self.engine.log.error(rule=None, transport=msg.transport, session=msg.session, path=msg.path,
                              api=msg.api, model=msg.model, turn=msg.turn, error=f"{what}: {exc!r}")


class LlmExchange:
    """One model-API request and its reply."""

    def __init__(self, relay: LlmRelay, fmt: ModelFormat, msg: Message, body: dict[str, Any],
                 request: Request) -> None:
        self.relay = relay
        self.engine = relay.engine
        self.fmt = fmt
        self.msg = msg
        self.body = body
        self.request = request
        self.memory = relay.memory(msg.session)
        self.interest = relay.interest
        self.agent_tools = {tool["name"] for tool in request.tools or ()}
        self.shown_names = self.agent_tools  # the tools the model is shown (once a fault reshaped the list)
        self.faults: list[str] = []  # names of the rules that fired, for the call line (the adapter's list)
        self._watching: bool | None = None
        self._watched: dict[str, bool] = {}  # tool name -> whether a call to it may be changed
        self._error_points: frozenset[int] | None = None

    def _decide(self, message: Message, key: str | None = None, *,
                carries: Callable[[Action], bool]) -> list[Fired]:
        """The faults that fire on a synthetic message: only those whose action this exchange carries out
        on the body or the stream (others would change nothing the agent or the model gets)."""
        fired = self.engine.decide(message, wire=False, key=key, carries=carries)
        self.faults.extend(f.rule.name for f in fired)
        return fired

    # --- the request -----------------------------------------------------------------------

    async def prepare(self) -> None:
        """What a rule needs from elsewhere before the request is decided (a model's paraphrase of the
        prompt), awaited here so that the other exchanges go on meanwhile."""
        if not (self.interest.prompt and self.request.prompts):
            return
        text = self.request.prompts[-1].text
        if text in self.memory.prompts:
            return  # decided when it was the newest turn: resent history is treated alike
        try:
            for fault in self.engine.interest.faults(view.prompt(self.msg, text)):
                if isinstance(fault, PromptFault):
                    await fault.prepare(text)
        except Exception as exc:  # fail open: the rules decide without it
            self.relay.failed(self.msg, "preparing the request", exc)

    def rewrite_request(self) -> None:
        """Faults on the tools array, the tool results and the prompt; msg.body follows the changes."""
        try:
            changed = self._restore_calls()
            if self.request.tools and self.interest.tools:
                changed |= self._tools()
            changed |= self._results()
            changed |= self._prompts()
            if changed:
                self.msg.body = orjson.dumps(self.body)
        except Exception as exc:  # fail open: the request goes as the agent sent it
            self.relay.failed(self.msg, "rewriting the request", exc)

    def _restore_calls(self) -> bool:
        """The model sees its own tool calls again, not the names and arguments the agent was given."""
        changed = False
        for call in self.request.calls:
            said = self.memory.said.get(call.call_id)
            if said is not None and said != (call.name, call.arguments):
                call.put(*said)
                changed = True
        return changed

    def _tools(self) -> bool:
        tools = self.request.tools
        assert tools is not None
        listing = view.tools_list(self.msg, tools)
        before = listing.rpc
        fired = self._decide(listing, key_of("tools", orjson.dumps(self.body.get("tools"))),
                             carries=_rewrites(listing, lambda rpc: (rpc.get("result") or {}).get("tools"), list))
        if not fired or listing.rpc is before:
            return False
        shown = listing.rpc["result"]["tools"]  # type: ignore[index]
        names = {tool["name"] for tool in shown}
        entries = self.body["tools"]
        untouched = {id(tool) for tool in tools}
        shown_as: dict[str, str] = {}  # the agent's name of a tool that is listed under another name only
        for tool in shown:
            if id(tool) in untouched:
                continue
            real = self.fmt.TOOLS.name_of(view.template_of(tool, entries))
            if real is not None and real != tool["name"]:
                self.memory.counterparts.remember(tool["name"], real)
                if real not in names:
                    shown_as.setdefault(real, tool["name"])
        self.request.put_tools(shown)
        self.shown_names = names
        choice = view.named_choice(self.body)
        if choice is not None and choice.text in shown_as:  # a forced tool_choice follows its tool's new name
            choice.put(shown_as[choice.text])
        return True

    def _results(self) -> bool:
        """Tool results: the proxy's own answers put in; the newest decided on; older ones as they were then."""
        memory = self.memory
        if not (self.interest.tools or memory.answers or memory.results):
            return False
        calls = {call.call_id: call for call in self.request.calls}
        changed = False
        for result in self.request.results:
            new = memory.answers.get(result.call_id)
            answered = new is not None
            if new is None and (seen := memory.results.get(result.call_id)) is not None and seen[0] == result.result:
                new = seen[1]
            elif new is None and result.newest and self.interest.tools:
                new = self._decide_result(result, calls.get(result.call_id) or self._relayed_call(result.call_id))
            if new is None or new == result.result:
                continue
            if answered and result.refuses(new) is not None:  # the proxy's error, as the format can say it
                new = {k: v for k, v in new.items() if k != "isError"}
            result.put(new)
            changed = True
        return changed

    def _decide_result(self, result: ToolResult, call: ToolCall) -> dict[str, Any] | None:
        """The newest tool result through the engine, as the tools/call result of `call`; None: unchanged."""
        message = view.tool_result(self.msg, call, result.result)
        before = message.rpc

        def carries(action: Action) -> bool:
            if isinstance(action, Garble):
                return True
            new = action.message.get("result") if isinstance(action, Rewrite) else None
            if not isinstance(new, dict) or result.form(new) == result.form((message.rpc or {}).get("result") or {}):
                return False
            if (reason := result.refuses(new)) is not None:
                self.relay.skip(self.msg, f"tool result {result.call_id}: {reason}")
            return reason is None

        fired = self._decide(message, key_of("result", result.call_id, orjson.dumps(result.result)), carries=carries)
        garbled = [f.action.raw for f in fired if isinstance(f.action, Garble)]
        new: dict[str, Any] | None = None
        if garbled:  # a broken frame: the model reads the broken text as the tool's result
            new = {"content": [{"type": "text", "text": garbled[-1].decode("utf-8", "replace")}]}
        elif message.rpc is not before and isinstance(after := (message.rpc or {}).get("result"), dict):
            new = after
        if new is not None:
            self.memory.results.remember(result.call_id, (result.result, new))
        return new

    def _relayed_call(self, call_id: str) -> ToolCall:
        """A call the agent's request does not show (Responses with previous_response_id): as relayed."""
        name, arguments = self.memory.relayed.get(call_id, ("", ""))
        return ToolCall(call_id, name, arguments)

    def _prompts(self) -> bool:
        """The newest user turn decided on; earlier ones (resent history) as they were when newest."""
        prompts = self.request.prompts
        memory = self.memory.prompts
        changed = False
        for i, text in enumerate(prompts):
            new = memory.get(text.text) if memory else None
            if new is None and i == len(prompts) - 1 and self.interest.prompt:
                message = view.prompt(self.msg, text.text)
                before = message.rpc
                self._decide(message, key_of("prompt", text.text),
                             carries=_rewrites(message, lambda rpc: (rpc.get("params") or {}).get("text"), str))
                if message.rpc is not before:
                    new = message.rpc["params"]["text"]  # type: ignore[index]
                    memory.remember(text.text, new)
            if new is not None and new != text.text:
                text.put(new)
                changed = True
        return changed

    # --- the reply ---------------------------------------------------------------------------

    @property
    def watching(self) -> bool:
        """True when a rule matched this request and may change its reply (or a tool route may): only
        then is the reply read. Judged once the request is rewritten, from the tools the model was shown."""
        if self._watching is None:
            self._watching = self._calls_watched() or bool(self._empty_faults()) or bool(self.error_points)
        return self._watching

    def _calls_watched(self) -> bool:
        """Whether a call the model may make (to a tool it was shown) could be changed."""
        names = self.shown_names
        if any(self._routed_name(name) for name in names):
            return True
        probes = {next((name for name in names if glob is None or fnmatch.fnmatchcase(name, glob)), None)
                  for glob in self.interest.call_tools}  # one shown name each call rule's tool glob takes
        return any(self.watches(name) for name in probes if name is not None)

    def _routed_name(self, name: str) -> bool:
        return name in self.engine.session_of(self.msg).routes or name in self.memory.counterparts

    def watches(self, tool: str | None) -> bool:
        """Whether a call to `tool` may be changed: routed back, or a rule on calls matches it (a name
        not known yet: whether any call of this request could be)."""
        if tool is None:
            return self._calls_watched()
        watched = self._watched.get(tool)
        if watched is None:
            call = view.tool_call(self.msg, ToolCall("", tool, ""))
            watched = self._watched[tool] = self._routed_name(tool) or (self.interest.calls and any(
                _acts_on_calls(fault) for fault in self.engine.interest.faults(call)))
        return watched

    def _empty_faults(self) -> list[Fault]:
        if not self.interest.completion:
            return []
        return [f for f in self.engine.interest.faults(view.completion(self.msg)) if f.type == "empty_completion"]

    @property
    def error_points(self) -> frozenset[int]:
        """After how many relayed events a matching llm_stream_error rule would end the stream (none when
        the request asks for a whole reply)."""
        if self._error_points is None:
            asked = self.interest.completion and self.request.stream
            faults = self.engine.interest.faults(view.stream_event(self.msg, 0)) if asked else []
            self._error_points = frozenset(cast("LlmStreamErrorFault", f).after_events for f in faults
                                          if f.type == "llm_stream_error")
        return self._error_points

    def empty_mode(self) -> BlankCompletion | None:
        """What empty_completion does to this reply, decided (and logged) now: at the reply's first output."""
        if not self._empty_faults():
            return None
        fired = self._decide(view.completion(self.msg), carries=lambda action: isinstance(action, BlankCompletion))
        return next((f.action for f in reversed(fired) if isinstance(f.action, BlankCompletion)), None)

    def stream_error(self, relayed: int) -> tuple[str, bytes] | None:
        """The error event to send in place of the next one, `relayed` events into the stream, or None."""
        fired = self._decide(view.stream_event(self.msg, relayed),
                             carries=lambda action: isinstance(action, FailStream))
        return next(((f.action.event, f.action.data) for f in fired if isinstance(f.action, FailStream)), None)

    def relay_body(self, payload: bytes, status: int | None, headers: Mapping[str, str]) -> bytes:
        """A whole (non-streamed) reply, with its tool calls and completion decided on."""
        try:
            return self._relay_body(payload, status, headers)
        except Exception as exc:  # fail open: the reply goes as the model API sent it
            self.relay.failed(self.msg, "rewriting the reply", exc)
            return payload

    def _relay_body(self, payload: bytes, status: int | None, headers: Mapping[str, str]) -> bytes:
        if not self.watching or status != 200:
            return payload
        if (encoding := headers.get("Content-Encoding", "identity")) != "identity":
            self.relay.skip(self.msg, f"the model API's reply is {encoding}-encoded")
            return payload
        try:
            body = orjson.loads(payload)
            if not isinstance(body, dict):
                raise FormatError(f"a JSON {type(body).__name__}, not an object")
            reply = self.fmt.parse_reply(body)
        except (orjson.JSONDecodeError, FormatError) as exc:
            self.relay.skip(self.msg, f"the model API answered in an unexpected shape: {exc}")
            return payload
        if reply.has_output and (empty := self.empty_mode()) is not None:
            reply.empty(empty)
            return orjson.dumps(body)
        changed = False
        for call in reply.calls:
            if self.watches(call.name) and (edited := self.edit_call(call)) is not call:
                call.put(edited.name, edited.arguments)
                changed = True
        return orjson.dumps(body) if changed else payload

    async def relay_events(self, chunks: AsyncIterator[bytes], headers: Mapping[str, str]) -> AsyncIterator[bytes]:
        """A streamed reply: passed through untouched unless a rule may change it, then event by event."""
        editor = self.stream_editor(headers)
        if editor is None:
            async for chunk in chunks:
                yield chunk
            return
        async for event in streams.sse_frames(chunks):
            for out in editor.feed(event):
                yield out
            if editor.ended:
                return
        for out in editor.finish():
            yield out

    def stream_editor(self, headers: Mapping[str, str]) -> stream.Editor | None:
        """The editor a streamed reply goes through event by event (adapters that are handed chunks feed
        it themselves); None when no rule may change the stream, which then passes untouched."""
        try:
            return self.fmt.Editor(self) if self.watching else None
        except Exception as exc:  # fail open: the stream goes as the model API sends it
            self.relay.failed(self.msg, "planning the stream", exc)
            return None

    def edit_call(self, call: ToolCall) -> ToolCall:
        """A tool call the model made, as the agent gets it: routes undone, tool-call faults applied."""
        content_type = {"Content-Type": "text/event-stream" if self.request.stream else "application/json"}
        # the request's headers stay readable under it: a rule may match the agent's (X-Chaosproxy-Agent);
        # a ChainMap writes only to its first map, so the request's read-only headers are safe
        headers = ChainMap(content_type, self.msg.headers)  # type: ignore[arg-type]
        message = view.tool_call(self.msg, call, headers=headers)
        before = message.rpc

        def carries(action: Action) -> bool:  # an answer (the model gets it next turn), or another call
            return isinstance(action, ReplyAction) or isinstance(action, Rewrite) and _as_sent(
                call, action.message) != _as_sent(call, message.rpc or {})

        fired = self._decide(message, key_of("call", call.name, call.arguments), carries=carries)
        params = (message.rpc or {}).get("params") or {}
        name, arguments = (call.name, call.arguments) if message.rpc is before else _as_sent(call, message.rpc or {})
        answered = next((f.action for f in fired if isinstance(f.action, ReplyAction)), None)
        imitated = name not in self.agent_tools and name in self.memory.counterparts
        if imitated:  # a tool the proxy made up: the agent runs the one it imitates
            name = self.memory.counterparts[name]
        if answered is not None:
            self.memory.answers.remember(call.call_id, _answer_result(answered.message))
        routed = _routed_params(fired)
        if imitated or routed is not None:  # the model sees its call again as it made it, but for faults
            self.memory.said.remember(call.call_id, _as_said(call, routed, params, arguments))
        self.memory.relayed.remember(call.call_id, (name, arguments))
        if name == call.name and arguments == call.arguments:
            return call
        return ToolCall(call.call_id, name, arguments, call.put)


def _acts_on_calls(fault: Fault) -> bool:
    """A request-side message fault that may change a tool call (not a model-API fault on something else)."""
    return not isinstance(fault, LlmFault) or fault.target == "call"


def _rewrites(view: Message, part: Callable[[dict[str, Any]], Any], kind: type) -> Callable[[Action], bool]:
    """Whether an action puts a new `part` (of the `kind` the body holds there) in `view`'s message: all
    the relay writes back of a tools array or a prompt."""
    def carries(action: Action) -> bool:
        new = part(action.message) if isinstance(action, Rewrite) else None
        return isinstance(new, kind) and new != part(view.rpc or {})
    return carries


def _as_sent(call: ToolCall, rpc: dict[str, Any]) -> tuple[str, str]:
    """The name and arguments (JSON text) a tools/call message of `call` puts in the model's reply."""
    params = rpc.get("params") or {}
    name = params.get("name")
    return name if isinstance(name, str) else call.name, _arguments_text(call, params.get("arguments"))


def _arguments_text(call: ToolCall, new: Any) -> str:
    """The arguments a fault left, as JSON text: made invalid on purpose (malformed_tool_call), renamed
    back or retyped; arguments that were not JSON stay as the model wrote them."""
    if isinstance(new, str):
        return new
    if isinstance(call.parsed, dict) and isinstance(new, dict) and new != call.parsed:
        return view.json_text(new)
    return call.arguments


def _routed_params(fired: list[Fired]) -> dict[str, Any] | None:
    """A call's params once its tool routes were undone (before other faults acted), or None: no route."""
    routed = [f.action.message for f in fired if f.fault.routes_calls and isinstance(f.action, Rewrite)]
    return routed[-1].get("params") if routed else None


def _as_said(call: ToolCall, routed: dict[str, Any] | None, final: dict[str, Any],
             arguments: str) -> tuple[str, str]:
    """What the model is shown of its call on later turns: as it made it, unless a fault other than a
    route changed it; then as the agent got it, under the model's names for the tool and arguments."""
    if routed is None:  # no route: a tool the proxy made up, which the agent ran under another name
        return call.name, arguments
    if routed == final:
        return call.name, call.arguments
    name = call.name if final.get("name") == routed.get("name") else final.get("name", call.name)
    said, shown, got = call.parsed, routed.get("arguments"), final.get("arguments")
    if isinstance(said, dict) and isinstance(shown, dict) and isinstance(got, dict) and len(said) == len(shown):
        names = dict(zip(shown, said, strict=True))  # routes rename arguments one for one, in order
        return name, view.json_text({names.get(key, key): value for key, value in got.items()})
    return name, arguments


def _answer_result(message: dict[str, Any]) -> dict[str, Any]:
    """The tools/call result the agent's own result is replaced with: the proxy's result, or its error."""
    if isinstance(message.get("result"), dict):
        return message["result"]
    error = given if isinstance(given := message.get("error"), dict) else {}
    return {"content": [{"type": "text", "text": f"Error: {error.get('message', 'tool call failed')}"}],
            "isError": True}
