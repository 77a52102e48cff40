"""The fault registry. Each fault type is one class in the module of the same name (`faults/<type>.py`);
modules starting with `_` are what faults share. May import: the engine's model (message, actions,
session state), protocols and telemetry; never adapters, control, drill, report or cli.

A proxy imports only the faults its scenario names, when validation meets them: importing and building
every fault's pydantic model was most of a proxy's start-up, which a drill pays on every run.
`REGISTRY`, every fault (for the fault table, the JSON Schema, reports), imports them all on first use.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated, Any, Union

from pydantic import Field, GetJsonSchemaHandler, SerializeAsAny, TypeAdapter, ValidationInfo, WrapValidator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticKnownError, core_schema

from chaosproxy.faults import base
from chaosproxy.faults.base import MAX_WAIT_MS, Component, Fault, FaultContext, Level

TYPES = frozenset(
    module.name for module in pkgutil.iter_modules(__path__)
    if not module.name.startswith("_") and module.name != "base"
)


def fault_class(name: str) -> type[Fault]:
    """The class of fault type `name`, importing its module the first time. KeyError: no such type."""
    if name not in base.REGISTRY:
        if name not in TYPES:
            raise KeyError(name)
        importlib.import_module(f"{__name__}.{name}")
    return base.REGISTRY[name]


def all_faults() -> dict[str, type[Fault]]:
    """Every fault type's class, by type."""
    for name in sorted(TYPES - base.REGISTRY.keys()):
        fault_class(name)
    return base.REGISTRY


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        return all_faults()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _by_type(value: Any, _handler: Any, info: ValidationInfo) -> Fault:
    """Validate a fault with the class its `type` names, with the errors a discriminated union gives."""
    if isinstance(value, Fault):
        return value
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str):
        raise PydanticKnownError("union_tag_not_found", {"discriminator": "'type'"})
    try:
        cls = fault_class(kind)
    except KeyError:
        raise PydanticKnownError("union_tag_invalid", {
            "discriminator": "'type'", "tag": kind, "expected_tags": ", ".join(f"'{t}'" for t in sorted(TYPES))
        }) from None
    return cls.model_validate(value, context=info.context)


class _EveryFaultSchema:
    """The JSON Schema of a fault: one of every type, told apart by `type` (this imports every fault)."""

    @staticmethod
    def __get_pydantic_json_schema__(_schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        union: Any = Annotated[Union[tuple(all_faults().values())], Field(discriminator="type")]  # noqa: UP007
        return handler(TypeAdapter(union).core_schema)


FaultSpec = Annotated[SerializeAsAny[Fault], WrapValidator(_by_type), _EveryFaultSchema()]

__all__ = ["MAX_WAIT_MS", "REGISTRY", "TYPES", "Component", "Fault", "FaultContext", "FaultSpec", "Level", "all_faults",
           "fault_class"]
