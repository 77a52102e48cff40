"""The scenario model: YAML in, validated rules out, errors as FILE:LINE: reason."""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaosproxy.engine import yaml_limits
from chaosproxy.engine.message import Phase
from chaosproxy.engine.named_files import ScenarioFiles, read_capped
from chaosproxy.engine.yaml_limits import BoundedLoader, YamlProblems
from chaosproxy.faults import FaultSpec, Level


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # every number finite


class Match(_Strict):
    """Which messages a rule applies to. Every key is optional; all given keys must match."""

    transport: str | None = Field(None, description="glob on the transport: http, stdio, mitm")
    route: str | None = Field(None, description="glob on the route name (the prefix without its slash)")
    http_method: str | None = Field(None, description="HTTP method, e.g. POST (case-insensitive)")
    path: str | None = Field(None, description="glob on the URL path, e.g. /api/*")
    method: str | None = Field(None, description="glob on the JSON-RPC method, e.g. tools/*")
    tool: str | None = Field(None, description="glob on the tool name of a tools/call")
    header: dict[str, str] = Field(default_factory=dict, description="header name -> value glob")
    api: str | None = Field(None, description="glob on the model API: openai-chat, openai-responses, anthropic")
    model: str | None = Field(None, description="glob on the model a model-API request names, e.g. gpt-4*")
    a2a_method: str | None = Field(None, description=(
        "glob on the A2A method as v1.0 names it, whatever the binding or version: SendMessage, "
        "SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask, GetAgentCard, ..."))
    skill: str | None = Field(None, description=(
        "glob on the skill an A2A message names (its metadata's skill), or the only skill its agent's card lists"))
    task_state: str | None = Field(None, description=(
        "glob on an A2A task's state (working, input-required, completed, ...; TASK_STATE_* names too): "
        "the state a reply or event says, on a request the state the proxy last saw"))
    a2a_agent: str | None = Field(None, description="glob on the remote A2A agent's name, as its card gives it")

    @field_validator("a2a_method")
    @classmethod
    def _known_a2a_method(cls, method: str | None) -> str | None:
        from chaosproxy.protocols.a2a import METHODS
        if method is not None and not any(fnmatch.fnmatchcase(name, method) for name in METHODS):
            raise ValueError(f"a2a_method {method!r} matches none of {', '.join(sorted(METHODS))}")
        return method

    @field_validator("task_state")
    @classmethod
    def _known_task_state(cls, state: str | None) -> str | None:
        from chaosproxy.protocols.tasks import TaskState, parse_state
        if state is None:
            return None
        named = parse_state(state)
        if named is not None:
            return named.value
        if not any(fnmatch.fnmatchcase(known.value, state) for known in TaskState):
            raise ValueError(f"task_state {state!r} matches none of {', '.join(known.value for known in TaskState)}")
        return state

    @field_validator("api")
    @classmethod
    def _known_api(cls, api: str | None) -> str | None:
        from chaosproxy.protocols.llm import APIS
        if api is not None and not any(fnmatch.fnmatchcase(name, api) for name in APIS):
            raise ValueError(f"api {api!r} matches none of {', '.join(APIS)}")
        return api

    @model_validator(mode="after")
    def _tool_needs_tools_call(self) -> Self:
        if self.tool is not None and self.method is not None and not fnmatch.fnmatchcase("tools/call", self.method):
            raise ValueError(f"match.tool only applies to tools/call, but match.method is {self.method!r}")
        return self


class Window(_Strict):
    """Fire only between start_s and start_s + duration_s after the proxy started."""

    start_s: float = Field(0, ge=0)
    duration_s: float | None = Field(None, gt=0, description="unset: until the proxy stops")


class Rule(_Strict):
    """A match, the gates that decide whether a matching message is hit, and the fault."""

    name: str = Field(min_length=1)
    description: str | None = None
    enabled: bool = True
    match: Match = Field(default_factory=Match)
    probability: float = Field(1.0, ge=0, le=1)
    after: int = Field(0, ge=0, description="let this many matches through first")
    first: int | None = Field(None, ge=1, description="fire at most this many times")
    every: int = Field(1, ge=1, description="fire on every Nth eligible match")
    window: Window | None = None
    scope: Literal["session", "global"] = Field(
        "session", description="count matches per session (reproducible under interleaving) or globally")
    fault: FaultSpec


def check_route(prefix: str, url: str) -> None:
    """Raise ValueError unless PREFIX=URL is a usable route: /name (or / for the default) to http(s)://host."""
    from yarl import URL
    if not prefix.startswith("/") or (prefix != "/" and prefix.endswith("/")) or "*" in prefix:
        raise ValueError(f"route prefix {prefix!r} must look like /name (or / for the default)")
    try:
        target = URL(url)
    except ValueError as exc:
        raise ValueError(f"route {prefix} -> {url!r}: {exc}") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise ValueError(f"route {prefix} -> {url!r}: expected an http:// or https:// URL")


MAX_SEED = 2**63 - 1  # a root seed goes as it is into the log, the rngs and OTLP's signed 64-bit attributes


def check_seed(seed: int) -> int:
    """`seed` when every part of the proxy takes it as it is; else a ValueError saying the range."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"a seed is a whole number from 0 to {MAX_SEED} (2^63-1), got {seed}")
    return seed


class Scenario(_Strict):
    """A set of rules, and the seed that makes every random choice reproducible."""

    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="unset: one is drawn and logged")
    description: str | None = None
    routes: dict[str, str] = Field(default_factory=dict, description="path prefix -> upstream URL, e.g. "
                                   "{/github: 'http://127.0.0.1:9001'}; --route and --upstream add to these")
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("routes")
    @classmethod
    def _check_routes(cls, routes: dict[str, str]) -> dict[str, str]:
        for prefix, url in routes.items():
            check_route(prefix, url)
        return routes

    @model_validator(mode="after")
    def _unique_names(self) -> Self:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}; names must be unique")
            seen.add(rule.name)
        return self


class ScenarioError(YamlProblems):
    """An invalid scenario. `problems` holds one 'FILE:LINE: reason' string per problem."""


PARSE_BUDGET_S = 5.0  # how long a scenario may take to read off the event loop before it is refused


def read_text(path: Path) -> str:
    """A scenario (or suite) file's text, or a ScenarioError saying why it cannot be read."""
    try:
        return read_capped(path)
    except ValueError as exc:
        raise ScenarioError([f"{path}: cannot read: the file {exc}"]) from None


def compose(loader: yaml.SafeLoader, source: str) -> tuple[yaml.Node | None, Any]:
    """The YAML node tree (for line numbers) and its data, within yaml_limits' bounds."""
    try:
        return yaml_limits.compose(loader, source)
    except YamlProblems as exc:
        raise ScenarioError(exc.problems) from None


def load_scenario(path: str | Path, scenario_dirs: Iterable[Path] = ()) -> Scenario:
    """A scenario file; the files it names lie beside it or under one of `scenario_dirs`."""
    path = Path(path)
    return parse_scenario(read_text(path), str(path), ScenarioFiles.beside(path, scenario_dirs))


def parse_scenario(text: str, source: str = "<scenario>", files: ScenarioFiles | None = None) -> Scenario:
    """Validate YAML (or JSON) text; every problem is reported with the line it comes from.

    `files` says where files the scenario names may lie (default: anywhere, for Python callers).
    """
    try:
        yaml_limits.check_size(text, source)
    except YamlProblems as exc:
        raise ScenarioError(exc.problems) from None
    root, data = compose(BoundedLoader(text), source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}:1: a scenario is a mapping with a 'rules' list"])
    try:
        return Scenario.model_validate(data, context={"files": files or ScenarioFiles.trusted()})
    except ValidationError as exc:
        raise ScenarioError([_describe(error, root, source) for error in exc.errors()]) from None


def keep_routes(scenario: Scenario, start_routes: dict[str, str], source: str) -> Scenario:
    """The one rule for a scenario swapped in at runtime (PUT, SIGHUP, --watch): routes are fixed at start.

    A new scenario may leave `routes:` out or repeat the start-up scenario's; it then shows them, as
    they are what traffic follows. Different routes are refused with the reason.
    """
    if scenario.routes and scenario.routes != start_routes:
        raise ScenarioError([f"{source}:1: routes: routes are fixed when the proxy starts (they are "
                             f"{start_routes or 'none in its scenario'}); restart it to change them"])
    return scenario if scenario.routes == start_routes else scenario.model_copy(update={"routes": start_routes})


async def off_loop[T](read: Callable[[], T], source: str, budget: float = PARSE_BUDGET_S) -> T:
    """`read()` (parse_scenario, load_scenario) in a worker thread, so the proxy keeps serving meanwhile;
    a ScenarioError when it takes longer than `budget` seconds (the thread's result is then dropped)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(read), budget)
    except TimeoutError:
        raise ScenarioError([f"{source}:1: took longer than {budget:g} s to read; refused"]) from None


def order_warnings(scenario: Scenario, text: str, source: str) -> list[str]:
    """'FILE:LINE: rules[i]: warning: ...' for each rule applied before a rule written above it.

    Rules apply in the order written, whatever their level, with one exception: on a model-API request
    the rules on the whole HTTP request are decided first (an `llm_error`, a `latency`), then the rules
    on what it carries (its prompt, its tools, the tool results in it). A rule of the first kind written
    below one of the second may end the exchange before the other sees the request.
    """
    root, _ = compose(BoundedLoader(text), source)
    warnings = []
    for later, rule in enumerate(scenario.rules):
        earlier = next((other for other in scenario.rules[:later]
                        if _on_model_request_contents(other) and _on_model_request(rule, other)), None)
        if earlier is not None:
            line, path = locate(root, ("rules", later))
            warnings.append(f"{source}:{line}: {path}: warning: on a model-API request, {rule.name!r} "
                            f"({rule.fault.type}, on the whole HTTP request) is decided before {earlier.name!r} "
                            f"({earlier.fault.type}, on what the request carries), though written after it: "
                            f"when it ends the exchange, {earlier.name!r} never sees the request. "
                            f"Write it above {earlier.name!r} to make the order plain.")
    return warnings


def _on_model_request_contents(rule: Rule) -> bool:
    """A rule on what a model-API request carries: the prompt, or (named for the model API) tools and results."""
    fault, match = rule.fault, rule.match
    return fault.on_messages and ((fault.level is Level.LLM and fault.phase is Phase.REQUEST)
                                  or match.api is not None or match.model is not None)


def _on_model_request(rule: Rule, other: Rule) -> bool:
    """A rule on a whole HTTP request that may match the model-API requests `other` matches."""
    match = rule.match
    if rule.fault.on_messages or rule.fault.phase is not Phase.REQUEST or match.method or match.tool:
        return False  # (JSON-RPC requests alone carry a method or a tool)
    from chaosproxy.protocols.llm import APIS
    return match.api is None or any(fnmatch.fnmatchcase(api, match.api) and (
        other.match.api is None or fnmatch.fnmatchcase(api, other.match.api)) for api in APIS)


def _describe(error: Any, root: yaml.Node | None, source: str) -> str:
    line, path = locate(root, error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    return f"{source}:{line}: {path or 'scenario'}: {message}"


def locate(node: yaml.Node | None, loc: tuple[Any, ...]) -> tuple[int, str]:
    """The 1-based line and dotted path of the YAML node at pydantic's `loc` (line 1 in an empty document).

    Parts of `loc` that name no node (pydantic's tags for union members) are skipped.
    """
    if node is None:
        return 1, ".".join(str(part) for part in loc)
    path = ""
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((value for key, value in node.value if key.value == part), None)
            if found is None:
                is_tag = any(key.value == "type" and value.value == part for key, value in node.value)
                if part == loc[-1] and not is_tag:
                    path += f".{part}"  # a missing key
                continue
            node, path = found, f"{path}.{part}"
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node, path = node.value[part], f"{path}[{part}]"
    return node.start_mark.line + 1, path.lstrip(".")
