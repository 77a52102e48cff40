"""Which spans are recorded: `Sampler` reads OTEL_TRACES_SAMPLER and its argument as the SDK does."""

from __future__ import annotations

from collections.abc import Mapping

from chaosproxy.telemetry.log import ops
from chaosproxy.telemetry.tracing.context import Parent


class Sampler:
    """OTEL_TRACES_SAMPLER as the SDK reads it: always_on, always_off, traceidratio (OTEL_TRACES_SAMPLER_ARG,
    by the trace id's low 64 bits, so every hop of a trace decides alike), and parentbased_* (the default,
    parentbased_always_on: a call with a parent context follows its sampled flag)."""

    def __init__(self, name: str = "parentbased_always_on", ratio: float = 1.0) -> None:
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        self.ratio = 1.0 if root == "always_on" else 0.0 if root == "always_off" else ratio
        self.bound = round(self.ratio * (1 << 64))
        self.description = name if root != "traceidratio" else f"{name}({self.ratio:g})"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Sampler:
        name = (environ.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
        if name.removeprefix("parentbased_") not in ("always_on", "always_off", "traceidratio"):
            ops.warning("OTEL_TRACES_SAMPLER=%r is not one of always_on, always_off, traceidratio, "
                        "parentbased_{always_on,always_off,traceidratio}; using parentbased_always_on", name)
            return cls()
        argument = (environ.get("OTEL_TRACES_SAMPLER_ARG") or "").strip()
        try:
            ratio = float(argument) if argument else 1.0
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            ops.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a ratio between 0 and 1; using 1.0", argument)
            ratio = 1.0
        return cls(name, ratio)

    def records(self, low_bits: int) -> bool:
        """Whether a span with no parent is recorded, given the low 64 bits of its trace id."""
        return low_bits < self.bound

    def records_child(self, parent: Parent) -> bool:
        """Whether a span under `parent` (the agent's context) is recorded."""
        return parent.sampled if self.parent_based else self.records(int(parent.trace_id[16:], 16))
