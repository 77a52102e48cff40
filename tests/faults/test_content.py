"""Properties of the content perturbations: deterministic per seed, JSON stays JSON, zero is nothing."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaosproxy.engine.scenario import parse_scenario
from chaosproxy.faults import _text_edits

seeds = st.integers(0, 2**32 - 1)
rates = st.floats(0, 1)
layouts = st.sampled_from(["qwerty", "azerty", "qwertz"])
kinds = st.sampled_from(["homoglyphs", "zero_width", "whitespace", "mojibake"])
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=200)
words = st.text("abcdefghijklmnopqrstuvwxyz ÀéüßЖ.,!\n\t-1", max_size=60)
numbers = st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | numbers | words
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=5)
                           | st.dictionaries(words, children, max_size=5), max_leaves=25)
documents = st.dictionaries(words, json_values, max_size=6) | st.lists(json_values, max_size=6)
styles = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"ensure_ascii": False}])


def shape(value: Any) -> Any:
    """The document with every string blanked: what must survive a value-level perturbation."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    return "" if isinstance(value, str) else value


def strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return [value] if isinstance(value, str) else []


def string_edits(rate: float, layout: str, kind: str) -> list[Any]:
    """Each string edit as a function of (text, rng)."""
    return [
        lambda text, rng: _text_edits.typo(text, rate, layout, rng),
        lambda text, rng: _text_edits.noise(text, kind, rate, rng),
        lambda text, rng: _text_edits.truncate(text, fraction=rate, marker="…"),
        lambda text, rng: _text_edits.inject_into(text, "SNIPPET", "insert", rng),
    ]


# --- Determinism and identity -----------------------------------------------------------------


@given(texts, rates, layouts, kinds, seeds)
def test_same_seed_same_text(text, rate, layout, kind, seed):
    for edit in string_edits(rate, layout, kind):
        assert edit(text, random.Random(seed)) == edit(text, random.Random(seed))


@pytest.mark.slow
@given(documents, rates, seeds)
def test_same_seed_same_document(doc, rate, seed):
    def every(rng: random.Random) -> list[Any]:
        def typo(text: str) -> str:
            return _text_edits.typo(text, rate, "qwerty", rng)
        return [_text_edits.edit_strings(doc, typo, rng, probability=rate),
                _text_edits.inject(doc, "X", "insert", rng), _text_edits.oversize(doc, 2000, rng),
                _text_edits.swap(doc, rng, count=2), _text_edits.emptied(doc, rng, probability=rate)]
    assert every(random.Random(seed)) == every(random.Random(seed))


@given(texts, layouts, kinds, seeds)
def test_rate_zero_is_the_identity(text, layout, kind, seed):
    rng = random.Random(seed)
    assert _text_edits.typo(text, 0, layout, rng) == text
    assert _text_edits.noise(text, kind, 0, rng) == text


@pytest.mark.slow
@given(documents, seeds)
def test_probability_zero_returns_the_very_same_document(doc, seed):
    rng = random.Random(seed)
    assert _text_edits.edit_strings(doc, lambda t: t + "!", rng, probability=0) is doc
    assert _text_edits.inject(doc, "X", "append", rng, probability=0) is doc
    assert _text_edits.swap(doc, rng, probability=0) is doc
    assert _text_edits.emptied(doc, rng, probability=0) is doc


# --- JSON stays JSON ----------------------------------------------------------------------------


@pytest.mark.slow
@given(documents, rates, layouts, kinds, styles, seeds)
def test_string_edits_keep_json_valid_and_its_shape(doc, rate, layout, kind, style, seed):
    original = json.dumps(doc, **style)
    for edit in string_edits(rate, layout, kind):
        rng = random.Random(seed)
        changed = _text_edits.edit_strings(doc, lambda t, edit=edit, rng=rng: edit(t, rng), rng)
        rendered = _text_edits.render_like(changed, original)
        assert shape(json.loads(rendered)) == shape(doc)


@pytest.mark.slow
@given(documents, styles)
def test_render_like_reproduces_the_original_style(doc, style):
    original = json.dumps(doc, **style)
    assert _text_edits.render_like(json.loads(original), original) == original
    assert _text_edits.render_like(json.loads(original), f"\n {original}\n") == f"\n {original}\n"


@pytest.mark.slow
@given(documents, st.sampled_from(["append", "prepend", "insert"]), seeds)
def test_inject_puts_the_snippet_in_one_string_only(doc, position, seed):
    changed = _text_edits.inject(doc, "<<CANARY>>", position, random.Random(seed))
    assert shape(changed) == shape(doc)
    assert sum("<<CANARY>>" in s for s in strings(changed)) == (1 if strings(doc) else 0)


def fields(value: Any) -> list[tuple[str, str]]:
    """Type and value of every scalar object member: what swap may trade, and must keep."""
    if isinstance(value, dict):
        return [f for item in value.values() for f in (
            fields(item) if isinstance(item, dict | list) else [(type(item).__name__, repr(item))])]
    return [f for item in value for f in fields(item)] if isinstance(value, list) else []


def lists(value: Any) -> list[list[Any]]:
    if isinstance(value, dict):
        return [found for item in value.values() for found in lists(item)]
    return [value, *(found for item in value for found in lists(item))] if isinstance(value, list) else []


@pytest.mark.slow
@given(documents, st.integers(1, 5), seeds)
def test_swap_trades_values_within_a_type(doc, count, seed):
    changed = _text_edits.swap(doc, random.Random(seed), count=count)
    assert sorted(fields(changed)) == sorted(fields(doc))
    assert (changed == doc) == (changed is doc)


@pytest.mark.slow
@given(documents, seeds)
def test_emptied_empties_lists_or_else_strings(doc, seed):
    changed = _text_edits.emptied(doc, random.Random(seed))
    if lists(doc):
        assert all(found == [] for found in lists(changed))
        assert isinstance(doc, list) or list(changed) == list(doc)
    else:
        assert shape(changed) == shape(doc) and all(s == "" for s in strings(changed))


# --- Lengths ------------------------------------------------------------------------------------


@given(texts, st.integers(0, 300), st.text(max_size=5))
def test_truncate_to_chars(text, chars, marker):
    cut = _text_edits.truncate(text, chars=chars, marker=marker)
    assert cut == (text if chars >= len(text) else text[:chars] + marker)


@given(texts, st.floats(0, 1))
def test_truncate_to_a_fraction(text, fraction):
    cut = _text_edits.truncate(text, fraction=fraction)
    assert cut == text[: int(len(text) * fraction)]


def test_truncate_marker_counts_what_was_cut():
    assert _text_edits.truncate("0123456789", chars=4, marker="…[{omitted} more]") == "0123…[6 more]"


@given(texts, st.integers(0, 20_000), seeds)
def test_oversize_text_ends_exactly_at_the_target(text, target, seed):
    grown = _text_edits.oversize(text, target, random.Random(seed))
    assert grown.startswith(text)
    assert _text_edits.size(grown) == max(target, _text_edits.size(text))


@pytest.mark.slow
@given(documents, st.integers(0, 20_000), styles, seeds)
def test_oversize_json_reaches_the_target_in_any_style_and_keeps_what_was_there(doc, target, style, seed):
    original = json.dumps(doc, **style)
    grown = _text_edits.oversize(doc, target, random.Random(seed))
    assert len(_text_edits.render_like(grown, original).encode()) >= target
    if isinstance(doc, dict):
        assert {key: grown[key] for key in doc} == doc  # a debug_log is added beside what was there
    else:
        assert grown[: len(doc)] == doc  # records are added after the real ones


def test_oversize_records_look_like_the_real_ones():
    doc = {"items": [{"name": "lamp", "price": 12.5, "stock": 4, "tags": ["home"], "sale": False}]}
    grown = _text_edits.oversize(doc, 3000, random.Random(1), paths=["$.items"])
    assert len(grown["items"]) > 10 and list(grown) == ["items"]
    assert {tuple((k, type(v)) for k, v in item.items()) for item in grown["items"]} == \
        {(("name", str), ("price", float), ("stock", int), ("tags", list), ("sale", bool))}


# --- The edits themselves -----------------------------------------------------------------------


@given(texts, rates, layouts, seeds)
def test_typos_touch_letters_only(text, rate, layout, seed):
    typoed = _text_edits.typo(text, rate, layout, random.Random(seed))
    assert [ch for ch in typoed if not ch.isalpha()] == [ch for ch in text if not ch.isalpha()]


def test_typos_come_from_the_neighbouring_keys():
    rng = random.Random(3)
    for layout, letter, near in [("qwerty", "a", "qwsz"), ("azerty", "a", "zq"), ("qwertz", "z", "tuhg"),
                                 ("qwerty", "y", "tuhg"), ("azerty", "m", "plù")]:
        assert set(_text_edits.neighbours(layout)[letter]) == set(near), (layout, letter)
        substituted = {_text_edits.typo(letter * 1, 1, layout, rng) for _ in range(300)}
        assert substituted - {""} - {letter * 2} <= set(near)


@pytest.mark.parametrize("layout", ["qwerty", "azerty", "qwertz"])
def test_keyboard_neighbours_are_mutual(layout):
    near = _text_edits.neighbours(layout)
    assert all(key in near[other] for key, around in near.items() for other in around)
    assert len(near) >= 26


def test_typos_keep_the_case():
    assert _text_edits.typo("A", 1, "qwerty", random.Random(0)) in {"", "AA"} | set("QWSZ")


@given(texts, rates, seeds)
def test_zero_width_noise_is_invisible(text, rate, seed):
    noisy = _text_edits.noise(text, "zero_width", rate, random.Random(seed))
    assert "".join(ch for ch in noisy if ch not in _text_edits.ZERO_WIDTH) == \
        "".join(ch for ch in text if ch not in _text_edits.ZERO_WIDTH)


@given(texts, rates, seeds)
def test_whitespace_noise_changes_whitespace_only(text, rate, seed):
    noisy = _text_edits.noise(text, "whitespace", rate, random.Random(seed))
    assert "".join(noisy.split()) == "".join(text.split())


@given(texts, rates, seeds)
def test_homoglyphs_keep_the_length(text, rate, seed):
    noisy = _text_edits.noise(text, "homoglyphs", rate, random.Random(seed))
    assert len(noisy) == len(text)
    assert all(a == b or _text_edits.HOMOGLYPHS.get(a) == b for a, b in zip(text, noisy, strict=True))


def test_mojibake_reads_utf8_as_latin1():
    assert _text_edits.noise("naïve café — ok", "mojibake", 1, random.Random(0)) == "naÃ¯ve cafÃ© â€” ok"
    assert _text_edits.noise("plain ascii", "mojibake", 1, random.Random(0)) == "plain ascii"


@given(st.text("abc .!?\n", max_size=40), seeds)
def test_insert_lands_on_a_boundary(text, seed):
    out = _text_edits.inject_into(text, "<X>", "insert", random.Random(seed))
    def squeezed(s: str) -> str:
        return s.replace(" ", "").replace("\n", "")
    assert squeezed(out.replace("<X>", "", 1)) == squeezed(text)


# --- Targeting ----------------------------------------------------------------------------------


@given(st.lists(st.fixed_dictionaries({"name": words, "note": words}), max_size=5), seeds)
def test_paths_change_only_what_they_select(records, seed):
    doc = {"title": "keep me", "items": records}
    changed = _text_edits.edit_strings(doc, lambda t: t.upper() + "!", random.Random(seed),
                                   paths=["$.items[*].name"])
    assert changed["title"] == "keep me"
    assert [r["note"] for r in changed["items"]] == [r["note"] for r in records]
    assert [r["name"] for r in changed["items"]] == [r["name"].upper() + "!" for r in records]


def test_a_path_selects_everything_under_it_once():
    doc = {"a": {"b": "x", "c": ["y", {"d": "z"}]}, "e": "w"}
    changed = _text_edits.edit_strings(doc, lambda t: t + "!", random.Random(0), paths=["$.a", "$..d", "$.a.c"])
    assert changed == {"a": {"b": "x!", "c": ["y!", {"d": "z!"}]}, "e": "w"}
    assert changed["e"] is doc["e"]


def test_plain_text_is_never_selected_by_paths():
    assert _text_edits.targets("some text", ["$.items"]).hit == frozenset()
    assert _text_edits.targets("some text", []).hit == frozenset({()})


@pytest.mark.parametrize("path", ["$.items[", "items", "$..", "$[?@.x ==]", "$.a | $.b", "$.a.keys()"])
def test_invalid_paths_are_value_errors(path):
    with pytest.raises(ValueError, match="invalid JSONPath"):
        _text_edits.compile_path(path)


@pytest.mark.parametrize("fault", [
    {"type": "typos", "rate": 0.3}, {"type": "noise", "kind": "homoglyphs", "rate": 0.5},
    {"type": "truncate_text", "fraction": 0.5, "paths": ["$..*"]}, {"type": "oversize", "factor": 3},
    {"type": "inject_text"}, {"type": "wrong_data"}, {"type": "wrong_data", "mode": "empty"},
])
@pytest.mark.slow
@given(doc=documents, style=styles, seed=seeds)
def test_every_fault_keeps_json_text_valid(fault, doc, style, seed):
    rule = parse_scenario(json.dumps({"rules": [{"name": "r", "fault": fault}]})).rules[0]
    text = json.dumps(doc, **style)
    perturbed = rule.fault.perturb_text(text, random.Random(seed))
    assert perturbed == text or isinstance(json.loads(perturbed), dict | list)
