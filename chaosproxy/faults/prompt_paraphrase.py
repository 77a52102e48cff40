from __future__ import annotations

import importlib.resources
import random
from functools import cache
from pathlib import Path
from typing import Literal, Self

import yaml
from pydantic import Field, ValidationInfo, field_validator, model_validator

from chaosproxy.engine.named_files import ScenarioFiles
from chaosproxy.faults._llm import PromptFault
from chaosproxy.faults._model_paraphrase import cache_at
from chaosproxy.faults._rewording import Rewording
from chaosproxy.faults.base import register


@cache
def query_rewording() -> Rewording:
    """Rules for users' requests (not tool descriptions): their own synonyms, verbs and templates."""
    text = importlib.resources.files("chaosproxy").joinpath("data/query_paraphrase.yaml").read_text("utf-8")
    return Rewording(yaml.safe_load(text))


@register
class PromptParaphrase(PromptFault):
    """Reword the user's newest prompt (model API), meaning kept: templates and synonyms, or a model's paraphrase."""

    type: Literal["prompt_paraphrase"] = "prompt_paraphrase"
    by: Literal["templates", "model"] = Field("templates", description=(
        "templates: synonyms and templates, no model; model: a paraphrase from the endpoint in "
        "CHAOSPROXY_PARAPHRASE_ENDPOINT, cached, with the templates standing in when there is none"))
    model: str | None = Field(None, min_length=1, description="by: model: the model that paraphrases")
    cache: Path = Field(Path("prompt-paraphrases.jsonl"), validate_default=True, description=(
        "by: model: the JSON-lines file of paraphrases, keyed by the prompt's hash: a rerun reads it offline"))
    timeout_s: float = Field(30, gt=0, le=600, description="by: model: how long to wait for the endpoint")

    @field_validator("cache")
    @classmethod
    def _beside_the_scenario(cls, path: Path, info: ValidationInfo) -> Path:
        """Where it may lie and how a relative name is found are the scenario's (see named_files)."""
        if info.data.get("by") != "model":
            return path
        files = (info.context or {}).get("files")
        return (files if isinstance(files, ScenarioFiles) else ScenarioFiles.trusted()).resolve(path, "cache")

    @model_validator(mode="after")
    def _model_named(self) -> Self:
        if self.by == "model" and self.model is None:
            raise ValueError("by: model needs `model`: the name of the model that paraphrases")
        return self

    async def prepare(self, text: str) -> None:
        """Before the request is decided: the model's paraphrase of `text` in the cache, if it can be had."""
        if self.by == "model":
            assert self.model is not None
            await cache_at(self.cache).fill(self.model, text, self.timeout_s)

    def reword(self, text: str, rng: random.Random) -> str:
        if self.by == "model":
            assert self.model is not None
            paraphrase = cache_at(self.cache).get(self.model, text)
            if paraphrase is not None:
                return paraphrase
            cache_at(self.cache).tell(f"no paraphrase from model {self.model} in {self.cache} for this prompt")
        return query_rewording().paraphrase(text, rng)
