from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import call_effect
from chaosproxy.faults.base import RESULTS, Component, Fault, FaultContext, Level, register

# QWERTY rows; each row sits half a key right of the one above, so a key's neighbours are the keys
# left and right of it, the two above (same column and the next) and the two below (previous and same).
_ROWS = ["1234567890-", "qwertyuiop", "asdfghjkl", "zxcvbnm"]
NEIGHBOURS: dict[str, str] = {
    key: "".join(
        _ROWS[r][c] for r, c in ((row, col - 1), (row, col + 1), (row - 1, col), (row - 1, col + 1),
                                 (row + 1, col - 1), (row + 1, col))
        if 0 <= r < len(_ROWS) and 0 <= c < len(_ROWS[r]))
    for row, keys in enumerate(_ROWS) for col, key in enumerate(keys)
}
NEIGHBOURS["_"] = "-"
Typo = Literal["any", "substitute", "insert", "omit", "transpose"]


@register
class UnknownTool(Fault):
    """Call a tool that does not exist: one keyboard slip in the called name, so upstream finds no tool."""

    type: Literal["unknown_tool"] = "unknown_tool"
    typo: Typo = Field("any", description=(
        "substitute a neighbouring key, insert one, omit a letter, transpose two, or any of these"))

    component = Component.ACTION
    level = Level.MCP
    phase = Phase.REQUEST
    methods = RESULTS

    def act(self, ctx: FaultContext) -> Rewrite | None:
        msg = ctx.message
        name = msg.tool
        if msg.method != "tools/call" or name is None or msg.rpc is None:
            return None
        wrong = misspell(name, ctx.rng, self.typo)
        if wrong is None:
            return None
        rpc = msg.rpc
        params = {**rpc["params"], "name": wrong}
        return Rewrite({**rpc, "params": params}, effect=call_effect(rpc["params"], params))


def misspell(word: str, rng: random.Random, typo: Typo = "any") -> str | None:
    """`word` with one keyboard slip, or None when no slip of that kind changes it."""
    kinds: list[Typo] = ["substitute", "insert", "omit", "transpose"] if typo == "any" else [typo]
    rng.shuffle(kinds)
    # Slips past the first letter first: a name still recognisable is the realistic mistake.
    positions = list(range(1, len(word))) or [0]
    rng.shuffle(positions)
    positions += [0] if len(word) > 1 else []
    for kind in kinds:
        for i in positions:
            char = word[i]
            near = NEIGHBOURS.get(char.lower(), "")
            match kind:
                case "substitute" if near:
                    slip = rng.choice(near)
                    wrong = word[:i] + (slip.upper() if char.isupper() else slip) + word[i + 1:]
                case "insert" if near:
                    wrong = word[:i + 1] + rng.choice(near) + word[i + 1:]
                case "omit" if len(word) > 1:
                    wrong = word[:i] + word[i + 1:]
                case "transpose" if i + 1 < len(word) and word[i] != word[i + 1]:
                    wrong = word[:i] + word[i + 1] + word[i] + word[i + 2:]
                case _:
                    continue
            if wrong != word:
                return wrong
    return None
