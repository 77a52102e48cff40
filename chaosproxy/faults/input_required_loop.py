from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from chaosproxy.engine.actions import Rewrite
from chaosproxy.engine.message import Phase
from chaosproxy.faults._effects import bounded, short
from chaosproxy.faults._input_required import ROUND_METHODS, asks_for_input, call_key, is_retry, remembered
from chaosproxy.faults.base import Component, Fault, FaultContext, Level, register

MAX_ROUNDS = 1000  # the most rounds the fault asks again (a client that answers for ever meets "forever")


@register
class InputRequiredLoop(Fault):
    """The server asks for input again after every answer: its last question, N more times or for ever."""

    type: Literal["input_required_loop"] = "input_required_loop"
    rounds: Annotated[int, Field(ge=1, le=MAX_ROUNDS)] | Literal["forever"] = Field("forever", description=(
        f"how many times the question is asked again after the agent answered it (1 to {MAX_ROUNDS}); "
        "forever: it is never let through, so the agent must give up"))

    component = Component.TRANSITION
    level = Level.MCP
    phase = Phase.RESPONSE
    methods = ROUND_METHODS

    def act(self, ctx: FaultContext) -> Rewrite | None:
        msg = ctx.message
        rpc = msg.rpc or {}
        result = rpc.get("result")
        if not isinstance(result, dict) or msg.request is None:
            return None
        asked = remembered(ctx.state, "asked")
        key = call_key(msg)
        if asks_for_input(result):  # the server's own question: the one asked again
            asked[key] = {"question": result, "again": asked.get(key, {}).get("again", 0)}
            asked.move_to_end(key)
            return None
        entry = asked.get(key)
        if entry is None or not is_retry(msg.request.rpc):
            return None  # not an answer to a question the server asked
        if self.rounds != "forever" and entry["again"] >= self.rounds:
            return None
        entry["again"] += 1
        question = entry["question"]
        requests = question.get("inputRequests") if isinstance(question.get("inputRequests"), dict) else {}
        return Rewrite({**rpc, "result": question}, effect={
            "asked_again": entry["again"], "of": self.rounds,
            "questions": bounded((str(name), short(request.get("method") if isinstance(request, dict) else None))
                                 for name, request in requests.items())})
