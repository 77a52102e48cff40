from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from chaosproxy.engine.named_files import ScenarioFiles
from chaosproxy.faults._rewording import PhraseTable, builtin, load_phrases
from chaosproxy.faults._tool_metadata import ToolListFault, seeded
from chaosproxy.faults.base import Component, FaultContext, register

type Reword = Callable[[str, str], str]  # (where in the tool, text) -> new text


@register
class ParaphraseDescription(ToolListFault):
    """Reword tool and/or parameter descriptions, meaning kept: phrase table, clause order, templates, no model."""

    type: Literal["paraphrase_description"] = "paraphrase_description"
    target: Literal["tool", "parameters", "both"] = Field("tool", description=(
        "the tool's description, its parameters' descriptions (inputSchema), or both"))
    mapping: Path | None = Field(None, description=(
        "a YAML file of phrase -> paraphrase (or list of them), tried before the built-in table"))

    component = Component.REWARD
    _phrases: PhraseTable | None = PrivateAttr(None)

    @field_validator("mapping")
    @classmethod
    def _readable(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        """Read the file now, so that a bad one stops the scenario from loading.

        Where it may lie and how a relative name is found are the scenario's (see named_files).
        """
        if path is None:
            return None
        files = _files(info)
        path = files.resolve(path, "mapping")
        files.load(path, load_phrases, "mapping")
        return path

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> Self:
        if self.mapping is not None:
            self._phrases = _files(info).load(self.mapping, load_phrases, "mapping")
        return self

    def rewrite(self, tool: dict[str, Any], names: set[str], ctx: FaultContext) -> list[dict[str, Any]]:
        name = tool["name"]
        schema = tool.get("inputSchema")
        keep = [name, *_parameters(schema)]

        def reword(where: str, text: str) -> str:
            rng = seeded(ctx, self.type, name, where, text)
            return builtin().paraphrase(text, rng, keep=keep, phrases=self._phrases)

        changed = dict(tool)
        if self.target != "parameters" and isinstance(tool.get("description"), str):
            changed["description"] = reword("description", tool["description"])
        if self.target != "tool" and isinstance(schema, dict):
            changed["inputSchema"] = _reworded(schema, reword, "inputSchema")
        return [changed] if changed != tool else [tool]


def _files(info: ValidationInfo) -> ScenarioFiles:
    files = (info.context or {}).get("files")
    return files if isinstance(files, ScenarioFiles) else ScenarioFiles.trusted()


def _parameters(schema: Any) -> list[str]:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return [key for key in properties if isinstance(key, str)] if isinstance(properties, dict) else []


def _reworded(schema: dict[str, Any], reword: Reword, where: str) -> dict[str, Any]:
    """A copy of a JSON Schema with the description of every property (nested ones too) reworded."""
    out = dict(schema)
    if isinstance(properties := schema.get("properties"), dict):
        out["properties"] = {key: _reworded_property(value, reword, f"{where}.{key}")
                             for key, value in properties.items()}
    if isinstance(items := schema.get("items"), dict):
        out["items"] = _reworded(items, reword, f"{where}[]")
    if isinstance(defs := schema.get("$defs"), dict):
        out["$defs"] = {key: _reworded(value, reword, f"{where}.$defs.{key}") if isinstance(value, dict)
                        else value for key, value in defs.items()}
    return out


def _reworded_property(prop: Any, reword: Reword, where: str) -> Any:
    if not isinstance(prop, dict):
        return prop
    out = _reworded(prop, reword, where)
    if isinstance(out.get("description"), str):
        out["description"] = reword(where, out["description"])
    return out
