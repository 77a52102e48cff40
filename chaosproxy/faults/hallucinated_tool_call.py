from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from chaosproxy.faults._llm import ToolCallFault
from chaosproxy.faults.base import FaultContext, register


@register
class HallucinatedToolCall(ToolCallFault):
    """Make the model call a near-miss of a real tool's name (a dropped letter, another case, a suffix)."""

    type: Literal["hallucinated_tool_call"] = "hallucinated_tool_call"
    style: Literal["typo", "case", "suffix"] = Field("typo", description=(
        "typo: one letter dropped (get_weather -> get_wether); case: snake_case <-> camelCase; "
        "suffix: _tool appended"))

    def change(self, params: dict[str, Any], arguments: dict[str, Any], ctx: FaultContext) -> dict[str, Any] | None:
        near = self._near_miss(params["name"], ctx)
        return {**params, "name": near} if near != params["name"] else None

    def _near_miss(self, name: str, ctx: FaultContext) -> str:
        match self.style:
            case "typo":
                letters = [i for i, ch in enumerate(name) if ch.isalpha() and i > 0]
                i = ctx.rng.choice(letters) if letters else None
                return name[:i] + name[i + 1:] if i is not None else name + "s"
            case "case":
                if "_" in name:
                    head, *rest = name.split("_")
                    return head + "".join(word.capitalize() for word in rest)
                return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() if name.lower() != name else name.capitalize()
        return f"{name}_tool"
