"""The body stages (adapters/shaping.py) where they meet each other: a stage that holds the body whole
(mitm's, for a rule on the message) hands those after it nothing until the body is in."""

from __future__ import annotations

import pytest

from chaosproxy.adapters import shaping
from chaosproxy.adapters.shaping import Fraction


def test_a_fraction_after_a_stage_that_holds_the_body_waits_for_the_body_not_the_clock(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(shaping.time, "monotonic", lambda: clock[0])
    unended: list[bool] = []
    stage = Fraction(0.5, None, max_held=1 << 20, unended=lambda: unended.append(True))
    for _ in range(5):  # the body comes slowly: the stage before holds it and passes nothing on
        assert stage([], False) == []
        clock[0] += shaping.FRACTION_WAIT_S
    assert b"".join(stage([b"0123456789"], True)) == b"01234"
    assert stage.cut and unended == []


def test_a_fraction_of_a_body_that_began_and_then_stalled_is_let_go(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(shaping.time, "monotonic", lambda: clock[0])
    unended: list[bool] = []
    stage = Fraction(0.5, None, max_held=1 << 20, unended=lambda: unended.append(True))
    assert stage([b"01234"], False) == []
    clock[0] += shaping.FRACTION_WAIT_S + 0.1
    assert stage([], False) == [b"01234"]  # held that long: what was held goes on, then the rest
    assert stage([b"56789"], True) == [b"56789"]
    assert unended == [True] and not stage.cut


@pytest.mark.parametrize("length", [10, None])
def test_a_fraction_cuts_the_same_with_a_length_or_without(length):
    stage = Fraction(0.3, length, max_held=1 << 20, unended=lambda: None)
    out = stage([b"01234"], False) + stage([b"56789"], True)
    assert b"".join(out) == b"012"
