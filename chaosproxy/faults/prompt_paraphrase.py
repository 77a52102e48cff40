from __future__ import annotations

import importlib.resources
import random
from functools import cache
from typing import Literal

import yaml

from chaosproxy.faults._llm import PromptFault
from chaosproxy.faults._rewording import Rewording
from chaosproxy.faults.base import register


@cache
def query_rewording() -> Rewording:
    """Rules for users' requests (not tool descriptions): their own synonyms, verbs and templates."""
    text = importlib.resources.files("chaosproxy").joinpath("data/query_paraphrase.yaml").read_text("utf-8")
    return Rewording(yaml.safe_load(text))


@register
class PromptParaphrase(PromptFault):
    """Reword the user's newest prompt (model API), meaning kept: synonyms and templates, no model."""

    type: Literal["prompt_paraphrase"] = "prompt_paraphrase"

    def reword(self, text: str, rng: random.Random) -> str:
        return query_rewording().paraphrase(text, rng)
