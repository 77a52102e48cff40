"""Deterministic paraphrasing of short technical prose (tool and parameter descriptions), no model.

A paraphrase must keep the meaning, so only a few kinds of change are made: whole phrases swapped
for ones that mean the same (a table, data/paraphrase.yaml, plus the user's own); trailing clauses
moved to the front and independent sentences after the first reordered; the first sentence recast
in a template ("Use this tool to ...") or stripped of a leading article. Text laid out on several
lines (docstrings with Args: sections, lists) keeps its layout and gets phrase swaps only. What a
description is precise about is never touched: code, quoted text, numbers, identifiers (snake_case,
camelCase, dotted), acronyms, URLs, tags, and the names of the tool and its parameters.

Not a fault itself: it registers nothing.
"""

from __future__ import annotations

import importlib.resources
import random
import re
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from chaosproxy.engine.yaml_limits import BoundedLoader, YamlProblems, compose

PROTECTED = [
    r"`[^`]*`", r'"[^"]*"', r"<[^>]*>", r"https?://\S+",
    r"\b\w*\d\w*\b",                 # numbers, and names with digits in them
    r"\b[A-Z]{2,}s?\b",              # acronyms: JSON, URLs
    r"\b\w*_\w*\b",                  # snake_case
    r"\b[a-z]+[A-Z]\w*\b",           # camelCase
    r"\b\w+(?:[./:]\w+)+\b",         # dotted and path-like: e.g, a.b, a/b
]
SENTENCE_END = re.compile(r"(?<=[.!?])(?<!\be\.g\.)(?<!\bi\.e\.)\s+(?=[A-Z])")
TRAILING_CLAUSE = re.compile(r"^(?P<main>[^,]+), (?P<clause>(?P<verb>[a-z]{2,}ing)\b[^,]*?)(?P<end>[.!?]?)$")
NOT_PARTICIPLES = {"string", "thing", "nothing", "something", "anything", "everything", "during", "bring",
                   "ring", "king", "spring", "morning", "evening", "ceiling", "padding", "heading", "setting"}
# A sentence opening with one of these leans on the one before it, so sentences are not reordered.
LEANING = {"this", "that", "these", "those", "it", "its", "they", "their", "then", "otherwise", "also",
           "however", "else", "such", "thus", "hence", "but", "finally", "next", "afterwards", "instead"}

type Segment = tuple[str, bool]  # text, and whether it is final (protected, or already rewritten)


class PhraseTable:
    """Phrases and what may replace them; matched on whole words, case-insensitively, longest first."""

    def __init__(self, entries: Mapping[str, Iterable[str]]) -> None:
        self.entries = {_key(phrase): list(alternatives) for phrase, alternatives in entries.items()}
        alternation = "|".join(re.escape(phrase).replace(r"\ ", r"\s+")
                               for phrase in sorted(self.entries, key=len, reverse=True))
        self.pattern = re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE) if self.entries else None

    def substitute(self, segments: list[Segment], rng: random.Random) -> list[Segment]:
        if self.pattern is None:
            return segments
        return _split(segments, self.pattern,
                      lambda found: _cased(rng.choice(self.entries[_key(found)]), found))

    def matches(self, text: str) -> bool:
        return self.pattern is not None and self.pattern.search(text) is not None


class Rewording:
    """The built-in rules: a synonym table, the verbs descriptions start with, and sentence templates."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.synonyms = PhraseTable(data["synonyms"])
        verbs = set(data["verbs"])
        self.starts = ({verb: "imperative" for verb in verbs}
                       | {_third_person(verb): "third_person" for verb in verbs})
        self.templates: dict[str, list[str]] = data["templates"]

    def paraphrase(self, text: str, rng: random.Random, *, keep: Iterable[str] = (),
                   phrases: PhraseTable | None = None, attempts: int = 8) -> str:
        """`text` reworded, or `text` itself when no rule applies. `keep`: names to leave as they are.

        `phrases` (the user's table) comes first; a description it matches is reworded by phrase only.
        """
        protect = re.compile("|".join([*PROTECTED, *(rf"(?<!\w){re.escape(name)}(?!\w)" for name in keep)]))
        for _ in range(attempts):
            segments: list[Segment] = [(text, False)]
            if phrases is not None and phrases.matches(text):
                segments = phrases.substitute(segments, rng)
            elif "\n" not in text.strip():
                segments = [(self._restructure(text, rng), False)]
            segments = _split(segments, protect, lambda found: found)
            reworded = "".join(part for part, _ in self.synonyms.substitute(segments, rng))
            if reworded != text:
                return reworded
        return text

    def _restructure(self, text: str, rng: random.Random) -> str:
        head, *rest = SENTENCE_END.split(text.strip())
        if not any(sentence.split(" ", 1)[0].lower() in LEANING for sentence in rest):
            rng.shuffle(rest)  # the first sentence is the summary; the others stand alone
        sentences = [_front_clause(sentence) if rng.random() < 0.5 else sentence for sentence in [head, *rest]]
        sentences[0] = self._recast(sentences[0], rng)
        return " ".join(sentences)

    def _recast(self, sentence: str, rng: random.Random) -> str:
        """Fit a sentence that starts with a known verb into a template; drop a leading 'The'."""
        first, _, rest = sentence.partition(" ")
        kind = self.starts.get(first.lower()) if first[:1].isupper() else None
        if kind is not None:
            template = rng.choice([None, *self.templates[kind]])
            return template.replace("{text}", _lower_first(sentence)) if template else sentence
        if first == "The" and rest[:1].islower():
            return rng.choice([sentence, rest[0].upper() + rest[1:]])
        return sentence


@cache
def builtin() -> Rewording:
    text = importlib.resources.files("chaosproxy").joinpath("data/paraphrase.yaml").read_text(encoding="utf-8")
    return Rewording(yaml.safe_load(text))


def load_phrases(text: str, path: Path) -> PhraseTable:
    """A user's mapping file (phrase -> paraphrase or list of them), or ValueError saying what is wrong.

    Errors give lines, never the file's words: the file may not be the sender's to read.
    """
    try:
        root, data = compose(BoundedLoader(text), str(path), quote=False)
    except YamlProblems as exc:
        line, _, reason = exc.problems[0].removeprefix(f"{path}:").partition(": ")
        raise ValueError(f"mapping file {path} line {line}: {reason}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"mapping file {path} must be a non-empty mapping of phrase -> paraphrases")
    assert isinstance(root, yaml.MappingNode)
    entries: dict[str, list[str]] = {}
    for (key, _), (phrase, alternatives) in zip(root.value, data.items(), strict=False):
        where = f"mapping file {path} line {key.start_mark.line + 1}"
        options = [alternatives] if isinstance(alternatives, str) else alternatives
        if not isinstance(phrase, str) or not phrase.strip():
            raise ValueError(f"{where}: a phrase must be a non-empty string")
        if not isinstance(options, list) or not options or not all(isinstance(o, str) and o.strip()
                                                                   for o in options):
            raise ValueError(f"{where}: a phrase must map to a paraphrase (a non-empty string) "
                             "or a non-empty list of them")
        entries[phrase] = options
    return PhraseTable(entries)


def _split(segments: list[Segment], pattern: re.Pattern[str], replace: Callable[[str], str]) -> list[Segment]:
    """Replace each match of `pattern` in the segments not yet final, and make the replacement final."""
    out: list[Segment] = []
    for text, final in segments:
        if final:
            out.append((text, True))
            continue
        position = 0
        for found in pattern.finditer(text):
            out += [(text[position:found.start()], False), (replace(found.group(0)), True)]
            position = found.end()
        out.append((text[position:], False))
    return out


def _front_clause(sentence: str) -> str:
    """'Count to n, reporting progress.' -> 'Reporting progress, count to n.'"""
    parts = TRAILING_CLAUSE.match(sentence)
    if parts is None or parts["verb"] in NOT_PARTICIPLES:
        return sentence
    clause = parts["clause"]
    return f"{clause[0].upper()}{clause[1:]}, {_lower_first(parts['main'])}{parts['end']}"


def _lower_first(text: str) -> str:
    """Lower the first letter unless the first word is a name or an acronym (JSON, iOS, McDonald)."""
    first = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if first[1:] == first[1:].lower() else text


def _cased(replacement: str, original: str) -> str:
    return replacement[0].upper() + replacement[1:] if original[:1].isupper() else replacement


def _key(phrase: str) -> str:
    return " ".join(phrase.lower().split())


def _third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"
