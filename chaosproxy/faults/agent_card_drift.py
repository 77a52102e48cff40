from __future__ import annotations

import copy
import fnmatch
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register
from chaosproxy.protocols import a2a
from chaosproxy.protocols.a2a import card as cards

MediaTypes = list[str]


@register
class AgentCardDrift(Fault):
    """The remote agent's card changes: skills renamed, removed or added, input or output modes changed."""

    type: Literal["agent_card_drift"] = "agent_card_drift"
    rename: int = Field(0, ge=0, le=100, description="skills renamed: their id and name get `suffix`")
    remove: int = Field(0, ge=0, le=100, description="skills taken off the card")
    add: int = Field(0, ge=0, le=100, description="skills added, each a variant of a listed one under a new id")
    skills: str | None = Field(None, description="glob on the ids of the skills that may be renamed or removed")
    suffix: str = Field("_v2", min_length=1, max_length=64, pattern=r"^[\w.-]+$")
    input_modes: MediaTypes | None = Field(None, max_length=32, description=(
        "media types the card's defaultInputModes, and each skill's inputModes, become"))
    output_modes: MediaTypes | None = Field(None, max_length=32, description="the same for output modes")

    component = Component.ACTION
    level = Level.A2A
    phase = Phase.RESPONSE
    methods = a2a.CARDS

    @model_validator(mode="after")
    def _changes_something(self) -> Self:
        if not (self.rename or self.remove or self.add) and self.input_modes is None and self.output_modes is None:
            raise ValueError("agent_card_drift changes nothing: give rename, remove, add, input_modes or output_modes")
        return self

    def act(self, ctx: FaultContext) -> Rewrite | None:
        rpc = ctx.message.rpc or {}
        card = rpc.get("result")
        if not isinstance(card, dict):
            return None
        card = copy.deepcopy(card)
        effect: dict[str, Any] = {}
        listed = cards.skills(card)
        eligible = [skill for skill in listed if isinstance(skill.get("id"), str)
                    and (self.skills is None or fnmatch.fnmatchcase(skill["id"], self.skills))]
        chosen = ctx.rng.sample(eligible, min(len(eligible), self.rename + self.remove))
        renamed, removed = chosen[:self.rename], chosen[self.rename:]
        if renamed:
            effect["renamed"] = {skill["id"]: _rename(skill, self.suffix) for skill in renamed}
        if removed:
            card["skills"] = [skill for skill in listed if all(skill is not gone for gone in removed)]
            effect["removed"] = [skill["id"] for skill in removed]
        if self.add and listed:
            added = [_variant(ctx.rng.choice(listed), n) for n in range(1, self.add + 1)]
            card["skills"] = [*cards.skills(card), *added]
            effect["added"] = [skill.get("id") for skill in added]
        for key, modes, name in (("inputModes", self.input_modes, "input_modes"),
                                 ("outputModes", self.output_modes, "output_modes")):
            if modes is not None and _set_modes(card, key, modes):
                effect[name] = modes
        return Rewrite({**rpc, "result": card}, effect=effect) if effect else None


def _rename(skill: dict[str, Any], suffix: str) -> str:
    new_id = f"{skill['id']}{suffix}"
    skill["id"] = new_id
    if isinstance(skill.get("name"), str):
        skill["name"] += suffix
    return new_id


def _variant(skill: dict[str, Any], n: int) -> dict[str, Any]:
    """A plausible new skill: a listed one under a new id and name, said to be a newer variant."""
    variant = copy.deepcopy(skill)
    variant["id"] = f"{skill.get('id', 'skill')}_beta{n if n > 1 else ''}"
    variant["name"] = f"{skill.get('name', variant['id'])} (beta)"
    if isinstance(skill.get("description"), str):
        variant["description"] = skill["description"] + " (beta: newer, may behave differently)"
    return variant


def _set_modes(card: dict[str, Any], key: str, modes: list[str]) -> bool:
    """The card's default modes and every skill's that lists its own become `modes`; whether any changed."""
    changed = card.get("default" + key[0].upper() + key[1:]) != modes
    card["default" + key[0].upper() + key[1:]] = list(modes)
    for skill in cards.skills(card):
        if key in skill and skill[key] != modes:
            skill[key] = list(modes)
            changed = True
    return changed

