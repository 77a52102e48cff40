from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from chaosproxy.engine.actions import Respond
from chaosproxy.engine.message import Phase
from chaosproxy.faults._llm import LlmFault
from chaosproxy.faults.base import Component, FaultContext, Level, register
from chaosproxy.protocols.llm import errors


@register
class LlmErrorFault(LlmFault):
    """Answer a model-API request with the provider's own error: 429, 529/503 overloaded, 500, quota, context length."""

    type: Literal["llm_error"] = "llm_error"
    kind: errors.Kind = Field("rate_limit", description=(
        "rate_limit (429), overloaded (Anthropic 529 overloaded_error, OpenAI 503 server_is_overloaded), "
        "server_error (500), quota (non-retryable: OpenAI 429 insufficient_quota, Anthropic 400), "
        "context_length (400)"))
    retry_after_s: float | None = Field(None, ge=0, le=3600, description=(
        "sent as retry-after and retry-after-ms; unset: 1 for rate_limit, none otherwise"))
    should_retry: bool | None = Field(None, description=(
        "sent as x-should-retry, which the SDKs obey over the status; unset: false for quota, none otherwise"))

    component = Component.TRANSITION
    level = Level.HTTP
    phase = Phase.REQUEST
    target = "request"

    @model_validator(mode="after")
    def _quota_is_final(self) -> Self:
        if self.kind in ("quota", "context_length") and self.should_retry:
            raise ValueError(f"kind {self.kind} is an error no retry can fix; should_retry: true contradicts it")
        return self

    def act(self, ctx: FaultContext) -> Respond | None:
        msg = ctx.message
        if msg.api is None:
            return None
        retry_after = self.retry_after_s if self.retry_after_s is not None else (
            1.0 if self.kind == "rate_limit" else None)
        should_retry = self.should_retry if self.should_retry is not None else (
            False if self.kind == "quota" else None)
        return errors.error_response(msg.api, self.kind, model=msg.model, retry_after_s=retry_after,
                                     should_retry=should_retry)
