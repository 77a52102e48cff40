"""JSON Schemas of scenario and suite files, for editors and CI (`chaosproxy schema [--suite]`).

pydantic's schema describes the fault as a `oneOf` with an OpenAPI `discriminator`, which JSON Schema
validators ignore: a bad parameter then fails against every fault type, and `check-jsonschema`
reports one error per type. Here the fault is chosen by its `type` with if/then, so a bad file gets
the one true reason.

A suite is a scenario whose values may be drawn per sample, written with the YAML tags
`!range [low, high]` and `!choice [a, b, ...]`, and that picks `pick` rules per sample. Editors
learn the tags from their settings (VS Code's YAML extension: `"yaml.customTags": ["!range sequence",
"!choice sequence"]`), and then see a tagged value as a list: the suite schema accepts a list wherever
a value may be drawn.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import AliasChoices

from chaosproxy.engine.scenario import Scenario
from chaosproxy.faults import all_faults

_DRAW = {"type": "array", "minItems": 1,
         "description": "drawn per sample: !range [low, high] or !choice [option, ...]"}


def scenario_schema(*, suite: bool = False) -> dict[str, Any]:
    schema = copy.deepcopy(Scenario.model_json_schema())
    defs = schema["$defs"]
    rule = defs["Rule"]["properties"]
    rule["fault"] = _fault_by_type(rule["fault"])
    _former_names(defs)
    if suite:
        schema["title"] = "chaosproxy drill suite"
        schema["properties"]["pick"] = {"type": "integer", "minimum": 1, "default": 1,
                                        "description": "rules drawn per sample"}
        for name in [*_fault_names(rule["fault"]), "Rule"]:
            properties = defs[name]["properties"]
            for key, value in properties.items():
                if key not in ("type", "name", "match"):
                    properties[key] = {"anyOf": [value, _DRAW]}
    return schema


def _former_names(defs: dict[str, Any]) -> None:
    """A parameter's former names (`at` of `phase`), which a scenario may still use, marked deprecated so
    that an editor accepts them and says which name to use instead."""
    for cls in all_faults().values():
        for name, info in cls.model_fields.items():
            if isinstance(info.validation_alias, AliasChoices) and cls.__name__ in defs:
                properties = defs[cls.__name__]["properties"]
                for former in info.validation_alias.choices:
                    if former != name and isinstance(former, str):
                        properties[former] = {**properties[name], "deprecated": True,
                                              "description": f"the former name of `{name}`"}


def _fault_by_type(union: dict[str, Any]) -> dict[str, Any]:
    mapping: dict[str, str] = union["discriminator"]["mapping"]
    return {
        "title": "Fault", "type": "object", "required": ["type"],
        "properties": {"type": {"enum": sorted(mapping), "description": "the fault type (chaosproxy faults)"}},
        "allOf": [{"if": {"properties": {"type": {"const": name}}, "required": ["type"]}, "then": {"$ref": ref}}
                  for name, ref in sorted(mapping.items())],
    }


def _fault_names(fault: dict[str, Any]) -> list[str]:
    return [branch["then"]["$ref"].rsplit("/", 1)[1] for branch in fault["allOf"]]
