"""The scenario model: YAML in, validated rules out, errors as FILE:LINE: reason."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaosproxy.faults import FaultSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    @field_validator("api")
    @classmethod
    def _known_api(cls, api: str | None) -> str | None:
        from chaosproxy.llm import APIS
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


class Scenario(_Strict):
    """A set of rules, and the seed that makes every random choice reproducible."""

    seed: int | None = Field(None, ge=0, description="unset: one is drawn and logged")
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


class ScenarioError(ValueError):
    """An invalid scenario. `problems` holds one 'FILE:LINE: reason' string per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def read_text(path: Path) -> str:
    """A scenario (or suite) file's text, or a ScenarioError saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError([f"{path}: cannot read: {exc}"]) from None


def compose(loader: yaml.SafeLoader, source: str) -> tuple[yaml.Node | None, Any]:
    """The YAML node tree (for line numbers) and its data; a ScenarioError with the line of a syntax
    error, or of a key given twice (YAML would quietly keep the last one and hide the mistake)."""
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}" if mark is not None else "1"
        reason = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([f"{source}:{line}: invalid YAML: {reason}"]) from None
    finally:
        loader.dispose()
    if root is not None and (duplicates := _duplicate_keys(root, source)):
        raise ScenarioError(duplicates)
    return root, data


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    return parse_scenario(read_text(path), str(path), base_dir=path.parent)


def parse_scenario(text: str, source: str = "<scenario>", base_dir: Path | None = None) -> Scenario:
    """Validate YAML (or JSON) text; every problem is reported with the line it comes from.

    Files a scenario names (a paraphrase mapping) are found relative to `base_dir`.
    """
    root, data = compose(yaml.SafeLoader(text), source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}:1: a scenario is a mapping with a 'rules' list"])
    try:
        return Scenario.model_validate(data, context={"base_dir": base_dir or Path.cwd()})
    except ValidationError as exc:
        raise ScenarioError([_describe(error, root, source) for error in exc.errors()]) from None


def _duplicate_keys(node: yaml.Node, source: str) -> list[str]:
    problems: list[str] = []
    if isinstance(node, yaml.MappingNode):
        first_line: dict[Any, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if key.value in first_line:
                problems.append(f"{source}:{line}: duplicate key {key.value!r} (first on line {first_line[key.value]})")
            first_line.setdefault(key.value, line)
            problems += _duplicate_keys(value, source)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            problems += _duplicate_keys(item, source)
    return problems


def _describe(error: Any, root: yaml.Node, source: str) -> str:
    line, path = locate(root, error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    return f"{source}:{line}: {path or 'scenario'}: {message}"


def locate(node: yaml.Node, loc: tuple[Any, ...]) -> tuple[int, str]:
    """The 1-based line and dotted path of the YAML node at pydantic's `loc`.

    Parts of `loc` that name no node (pydantic's tags for union members) are skipped.
    """
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
