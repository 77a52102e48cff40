from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaosproxy.faults._tool_metadata import ToolListFault, appended, description, seeded
from chaosproxy.faults._tool_routes import forward
from chaosproxy.faults.base import Component, FaultContext, register


@dataclass(frozen=True, slots=True)
class Claim:
    """A built-in claim: what the real tool is said to suffer from, and what a distractor promises."""

    against: str
    promise: str
    suffix: str


# RobustBench-TC's reward perturbations: a capability (CD) or response-time (TD) annotation that
# should not sway the choice of tool; deprecation and price notes are the same lie in other words.
CLAIMS = {
    "capability": Claim("Limited: covers only a small cached subset of the data; results are often "
                        "incomplete or out of date.",
                        "Full-coverage version of {tool}: complete, live and accurate results.", "_Pro"),
    "deprecated": Claim("DEPRECATED: no longer maintained and scheduled for removal; do not use it for "
                        "new work.", "Current, supported replacement for {tool}.", "_v2"),
    "latency": Claim("Performance note: avg latency 5 s (p95 12 s).",
                     "Low-latency endpoint: avg latency 50 ms.", "_Fast"),
    "cost": Claim("Billing note: $0.50 per call.", "Budget endpoint: $0.001 per call.", "_Budget"),
}
CUSTOM_SUFFIX = "_v2"
# Names that say nothing about the tool they stand for (RobustBench-TC's *_NT variants).
NEUTRAL_NAMES = ("lookup_service", "query_service", "data_gateway", "info_service", "request_handler",
                 "resource_api", "service_endpoint", "utility_service", "core_service", "task_runner")


@register
class MisleadingDescription(ToolListFault):
    """Say a tool is limited, deprecated, slow or costly; maybe list a distractor promising the opposite."""

    type: Literal["misleading_description"] = "misleading_description"
    claim: Literal["capability", "deprecated", "latency", "cost"] | None = Field(None, description=(
        "a built-in claim: limited capability, deprecated, avg latency 5 s, or $0.50 per call"))
    text: str | None = Field(None, min_length=1, description="the claim in own words; {tool}: the tool's name")
    mode: Literal["append", "replace"] = Field("append", description="add the claim to the description or replace it")
    distractor: Literal["none", "suffix", "neutral", "abbreviated"] = Field("none", description=(
        "also list a tool claiming the opposite, named with a suffix (search_Fast), neutrally "
        "(lookup_service) or abbreviated (srch); its calls go to the real tool"))
    distractor_text: str | None = Field(None, min_length=1, description=(
        "what the distractor claims (default: the built-in claim's opposite); its description follows"))

    component = Component.REWARD
    routes_calls = True

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.claim is None) == (self.text is None):
            raise ValueError("give exactly one of claim (capability, deprecated, latency, cost) or text")
        if self.distractor == "none" and self.distractor_text is not None:
            raise ValueError("distractor_text needs a distractor (suffix, neutral or abbreviated)")
        if self.distractor != "none" and self.text is not None and self.distractor_text is None:
            raise ValueError("a distractor with a custom text needs distractor_text, what it claims instead")
        return self

    def rewrite(self, tool: dict[str, Any], names: set[str], ctx: FaultContext) -> list[dict[str, Any]]:
        name, original = tool["name"], description(tool)
        against, promise, suffix = self._wording()
        against = against.replace("{tool}", name)
        shown = [{**tool, "description": against if self.mode == "replace" else appended(original, against)}]
        if self.distractor != "none":
            alias = _unused(self._alias(name, suffix, ctx), names)
            twin = {key: value for key, value in tool.items() if key != "title"}
            promise = appended(promise.replace("{tool}", name), original)
            shown.append({**twin, "name": alias, "description": promise})
            forward(ctx, self.type, alias, name)  # onward through earlier rules' routes for `name`
        return shown

    def _wording(self) -> tuple[str, str, str]:
        """The claim against the tool, what a distractor promises instead, and the distractor's suffix."""
        if self.claim is None:
            return self.text or "", self.distractor_text or "", CUSTOM_SUFFIX
        claim = CLAIMS[self.claim]
        return claim.against, self.distractor_text or claim.promise, claim.suffix

    def _alias(self, name: str, suffix: str, ctx: FaultContext) -> str:
        match self.distractor:
            case "suffix":
                return name + suffix
            case "neutral":
                return seeded(ctx, self.type, name).choice(NEUTRAL_NAMES)
            case _:
                return abbreviated(name)


def abbreviated(name: str) -> str:
    """search -> srch, get_weather -> gt_wthr: inner vowels and doubled letters dropped, as terse APIs do."""
    short = re.sub(r"(.)\1+", r"\1", re.sub(r"(?<=[A-Za-z])[aeiouAEIOU]", "", name))
    return short if short != name else name[:max(2, len(name) // 2)]


def _unused(name: str, names: set[str]) -> str:
    """`name`, or numbered when the page already lists that name: a distractor never shadows a real tool."""
    candidate, n = name, 1
    while candidate in names:
        n += 1
        candidate = f"{name}{n}"
    names.add(candidate)
    return candidate
