"""One name for the phase a fault acts in (issue 32): `phase`, declared by every fault (or chosen by the
user where it is a parameter), the documented YAML key of latency and rpc_error, with `at` still read."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from chaosproxy.engine.editor_schema import scenario_schema
from chaosproxy.engine.message import Phase
from chaosproxy.engine.scenario import ScenarioError, parse_scenario
from chaosproxy.faults import REGISTRY, Component, Fault, FaultContext, Level
from chaosproxy.faults.base import register

ROOT = Path(__file__).resolve().parents[2]
CHOSEN = ("latency", "rpc_error")  # the faults whose phase is a parameter


def _fault(spec: str) -> Fault:
    return parse_scenario(f"rules:\n  - name: r\n    fault: {spec}\n").rules[0].fault


def test_every_fault_declares_the_phase_it_acts_in() -> None:
    for name, cls in REGISTRY.items():
        declared = cls.__dict__.get("phase") or next(
            (base.__dict__["phase"] for base in cls.__mro__ if "phase" in base.__dict__), None)
        assert isinstance(declared, Phase | property) or "phase" in cls.model_fields, name
    assert sorted(name for name, cls in REGISTRY.items() if "phase" in cls.model_fields) == sorted(CHOSEN)


def test_a_fault_that_says_no_phase_is_refused_when_it_registers() -> None:
    class Phaseless(Fault):
        type: Literal["phaseless"] = "phaseless"
        component = Component.TRANSITION
        level = Level.HTTP

        def act(self, ctx: FaultContext) -> None:
            return None

    Phaseless.__module__ = "chaosproxy.faults.phaseless"  # where the registry would look for it
    with pytest.raises(ValueError, match="Phaseless: no phase"):
        register(Phaseless)
    assert "phaseless" not in REGISTRY


@pytest.mark.parametrize("fault", CHOSEN)
@pytest.mark.parametrize("key", ["phase", "at"])
def test_phase_is_the_key_and_at_is_still_read(fault: str, key: str) -> None:
    extra = ", delay_ms: 1" if fault == "latency" else ""
    assert _fault(f"{{type: {fault}{extra}, {key}: response}}").phase is Phase.RESPONSE
    assert _fault(f"{{type: {fault}{extra}}}").phase is Phase.REQUEST
    assert _fault(f"{{type: {fault}{extra}, {key}: response}}").params()["phase"] == "response"  # the log's name


def test_phase_and_at_together_are_refused_naming_the_one_too_many() -> None:
    with pytest.raises(ScenarioError, match=r"<scenario>:3: rules\[0\].fault.at: Extra inputs"):
        _fault("{type: latency, delay_ms: 1, phase: response, at: request}")


def test_a_parameter_s_phase_follows_it_where_other_faults_have_a_constant() -> None:
    assert _fault("{type: reset, after_bytes: 10}").phase is Phase.RESPONSE
    assert _fault("{type: reset}").phase is Phase.REQUEST
    assert _fault("{type: truncate_text, chars: 5}").phase is Phase.RESPONSE


def test_the_editor_schema_documents_phase_and_marks_at_deprecated() -> None:
    defs = scenario_schema()["$defs"]
    for cls in (REGISTRY[name] for name in CHOSEN):
        properties = defs[cls.__name__]["properties"]
        assert "deprecated" not in properties["phase"] and properties["phase"]["default"] == "request"
        assert properties["at"]["deprecated"] is True and "`phase`" in properties["at"]["description"]


def _faults(value: Any) -> list[dict[str, Any]]:
    """Every fault mapping in a loaded YAML document."""
    if isinstance(value, dict):
        found = [value["fault"]] if isinstance(value.get("fault"), dict) else []
        return found + [f for child in value.values() for f in _faults(child)]
    return [f for child in value for f in _faults(child)] if isinstance(value, list) else []


class _AnyTag(yaml.SafeLoader):
    """Suites draw values with tags (!range, !choice): read here as nothing, only the keys matter."""


_AnyTag.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_bundled_scenarios_use_phase_not_at() -> None:
    files = [*ROOT.joinpath("scenarios").rglob("*.yaml"), *ROOT.joinpath("chaosproxy", "data").glob("*.yaml")]
    assert len(files) > 20
    old = [f"{path.relative_to(ROOT)}: {fault}" for path in files
           for document in yaml.load_all(path.read_text(), _AnyTag) for fault in _faults(document) if "at" in fault]
    assert old == []


def test_no_fault_class_is_named_like_an_exception() -> None:
    """A fault that makes an error is an ErrorFault (flip_is_error flips the isError flag: a verb)."""
    named = {name: cls.__name__ for name, cls in REGISTRY.items() if name.endswith("_error")}
    assert [cls for name, cls in named.items() if not cls.endswith("ErrorFault") and name != "flip_is_error"] == []
    assert len(named) >= 5
