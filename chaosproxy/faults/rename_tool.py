from __future__ import annotations

import re
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import with_tools
from chaosproxy.faults._tool_routes import forward, is_plain_name, name_of, picked
from chaosproxy.faults.base import LISTINGS, Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import mcp

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")  # snake, kebab, camel and Pascal words
_VOWELS_AFTER_FIRST = re.compile(r"(?<=.)[aeiou]")


@register
class RenameTool(Fault):
    """Show tools under another name (abbreviated, re-cased, prefixed or given); calls to it still work."""

    type: Literal["rename_tool"] = "rename_tool"
    tool: str = Field("*", description="glob of the tools to rename")
    style: Literal["abbreviate", "case", "prefix"] | None = Field(None, description=(
        "abbreviate (weather -> wthr), case (snake_case <-> camelCase; one word: capitalised), "
        "or prefix"))
    prefix: str | None = Field(None, min_length=1, description="style prefix: what to put before the name")
    to: str | None = Field(None, min_length=1, description="the new name (instead of a style; one tool)")

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = LISTINGS
    routes_calls = True

    @model_validator(mode="after")
    def _one_way_to_rename(self) -> Self:
        if (self.style is None) == (self.to is None):
            raise ValueError("give either style (abbreviate, case, prefix) or to (the new name)")
        if (self.style == "prefix") != (self.prefix is not None):
            raise ValueError("style prefix needs prefix" if self.prefix is None
                             else "prefix only applies with style: prefix")
        if self.to is not None and not is_plain_name(self.tool):
            raise ValueError(f"to {self.to!r} renames one tool, but tool {self.tool!r} is a glob")
        if self.to is not None and self.to == self.tool:
            raise ValueError(f"to {self.to!r} is the tool's own name")
        return self

    def new_name(self, name: str) -> str:
        match self.style:
            case "abbreviate":
                return "_".join(_VOWELS_AFTER_FIRST.sub("", word) if len(word) > 3 else word
                                for word in re.split(r"[_\-]", name))
            case "case":
                return _flip_case(name)
            case "prefix":
                return f"{self.prefix}{name}"
        assert self.to is not None
        return self.to

    def act(self, ctx: FaultContext) -> Rewrite | None:
        tools = mcp.listed_tools(ctx.message)
        chosen = picked(tools, self.tool, first_page=True) if tools else set()
        if not tools or not chosen:
            return None
        taken = {name for tool in tools if (name := name_of(tool)) is not None}
        listed: list[Any] = list(tools)
        renamed = False
        for i in sorted(chosen):
            old = tools[i]["name"]
            new = self.new_name(old)
            if new in taken:  # unchanged, or it would shadow another tool
                continue
            taken.add(new)
            listed[i] = {**tools[i], "name": new}
            forward(ctx, self.type, new, old)
            renamed = True
        return with_tools(ctx.message, listed) if renamed else None


def _flip_case(name: str) -> str:
    """snake_case or kebab-case to camelCase, camelCase to snake_case, one word to or from Capitalised."""
    words: list[str] = _WORDS.findall(name)
    if re.search(r"[_\-]", name) and len(words) > 1:
        return words[0].lower() + "".join(word.capitalize() for word in words[1:])
    if len(words) > 1:
        return "_".join(word.lower() for word in words)
    return name.lower() if name[:1].isupper() else name[:1].upper() + name[1:]
