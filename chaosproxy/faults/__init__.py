"""The fault registry. Importing this package imports every module in it, and so registers every fault."""

import importlib
import pkgutil
from typing import Annotated, Union

from pydantic import Field

from chaosproxy.faults.base import REGISTRY, Component, Fault, FaultContext, Level

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

FaultSpec = Annotated[Union[tuple(REGISTRY.values())], Field(discriminator="type")]  # noqa: UP007

__all__ = ["REGISTRY", "Component", "Fault", "FaultContext", "FaultSpec", "Level"]
