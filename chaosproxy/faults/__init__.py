"""The fault registry. Importing this package registers every built-in fault."""

from typing import Annotated, Union

from pydantic import Field

from chaosproxy.faults import (  # noqa: F401  (imported to register)
    auth_error,
    hang,
    http_error,
    latency,
    rate_limit,
    reset,
    slow_body,
    stream_cut,
    truncate,
)
from chaosproxy.faults.base import REGISTRY, Component, Fault, FaultContext, Level

FaultSpec = Annotated[Union[tuple(REGISTRY.values())], Field(discriminator="type")]  # noqa: UP007

__all__ = ["REGISTRY", "Component", "Fault", "FaultContext", "FaultSpec", "Level"]
