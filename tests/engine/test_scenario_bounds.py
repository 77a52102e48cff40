"""Numbers a scenario, a drill or a flag gives are bounded where they are read (issue 25): a seed is a
whole number the log, the spans and the rngs all take as it is, and every duration is finite and
bounded, so that no delay overflows on its way into a timer or a span (tracing must never change what
the proxy does)."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from chaosproxy.engine.scenario import MAX_SEED, ScenarioError, parse_scenario
from chaosproxy.faults import MAX_WAIT_MS, REGISTRY
from chaosproxy.faults.latency import Latency

CHAOSPROXY = [sys.executable, "-m", "chaosproxy"]
TOO_BIG = [2**63, 2**64, 2**70]


def chaosproxy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHAOSPROXY, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_max_seed_is_what_a_signed_64_bit_span_attribute_holds() -> None:
    assert MAX_SEED == 2**63 - 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", TOO_BIG)
def test_a_scenario_seed_too_big_is_refused_with_its_line(tmp_path: Path, seed: int) -> None:
    scenario = tmp_path / "big.yaml"
    scenario.write_text(f"# a comment\nseed: {seed}\nrules: []\n")
    done = chaosproxy("validate", str(scenario))
    assert done.returncode == 2 and f"{scenario}:2: seed: " in done.stderr, done.stderr
    assert "2^63" in done.stderr or str(MAX_SEED) in done.stderr


@pytest.mark.parametrize("command", [["run", "--upstream", "http://127.0.0.1:9"], ["stdio", "--", "true"],
                                     ["drill", "--agent", "true", "--upstream", "http://127.0.0.1:9"]])
@pytest.mark.slow
def test_a_seed_flag_too_big_is_refused_before_anything_starts(command: list[str]) -> None:
    for seed in TOO_BIG:
        done = chaosproxy(*command[:1], "--seed", str(seed), *command[1:])
        assert done.returncode == 2 and "seed" in done.stderr and "Traceback" not in done.stderr, done.stderr
    if command[0] != "drill":  # the variable is read by run and stdio
        done = chaosproxy(*command, env={"CHAOSPROXY_SEED": str(2**64)})
        assert done.returncode == 2 and "seed" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_largest_seed_runs_and_is_logged_as_given(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    proc = subprocess.Popen([*CHAOSPROXY, "run", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
                             "--seed", str(MAX_SEED), "--log", str(log)], stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in (line := proc.stderr.readline() if proc.stderr else ""):
            assert line and time.monotonic() < deadline, "the proxy did not start"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    assert f'"seed":{MAX_SEED}' in log.read_text()


# --- durations --------------------------------------------------------------------------------------


def _float_fields(cls: type) -> list[str]:
    return [name for name, info in cls.model_fields.items()
            if info.annotation is float or float in get_args(info.annotation)]


FLOAT_FIELDS = [(name, field) for name, cls in sorted(REGISTRY.items()) for field in _float_fields(cls)]


@pytest.mark.parametrize("fault,field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_no_fault_takes_a_non_finite_number(fault: str, field: str, value: float) -> None:
    with pytest.raises(ValidationError) as refused:
        REGISTRY[fault].model_validate({"type": fault, field: value})
    assert any(field in error["loc"] for error in refused.value.errors())


@pytest.mark.parametrize("text,where", [
    ("rules: [{name: slow, fault: {type: latency, delay_ms: .inf}}]", "rules[0].fault.delay_ms"),
    ("rules: [{name: slow, fault: {type: latency, delay_ms: 1e300}}]", "rules[0].fault.delay_ms"),
    ("rules: [{name: slow, fault: {type: latency, delay_ms: 5, max_ms: .nan}}]", "rules[0].fault.max_ms"),
    ("rules: [{name: held, fault: {type: hang, release_after_ms: .inf}}]", "rules[0].fault.release_after_ms"),
    ("rules: [{name: drip, fault: {type: slow_body, delay_ms: 1e20}}]", "rules[0].fault.delay_ms"),
    ("rules: [{name: late, fault: {type: timeout, after_ms: .inf}}]", "rules[0].fault.after_ms"),
    ("rules: [{name: busy, fault: {type: rate_limit, retry_after_s: .inf}}]", "rules[0].fault.retry_after_s"),
    ("rules: [{name: w, window: {start_s: .inf}, fault: {type: reset}}]", "rules[0].window.start_s"),
    ("rules: [{name: w, window: {duration_s: .nan}, fault: {type: reset}}]", "rules[0].window.duration_s"),
    ("rules: [{name: p, probability: .nan, fault: {type: reset}}]", "rules[0].probability"),
])
def test_a_scenario_with_a_non_finite_or_endless_duration_is_refused(text: str, where: str) -> None:
    with pytest.raises(ScenarioError) as refused:
        parse_scenario(text, "s.yaml")
    assert any(problem.startswith(f"s.yaml:1: {where}: ") for problem in refused.value.problems), refused.value


def test_a_heavy_tailed_latency_never_draws_past_the_longest_wait() -> None:
    """A pareto tail with a tiny alpha, a lognormal with a huge sigma: the draw is capped, never an overflow."""
    for fault in (Latency(delay_ms=1000, distribution="pareto", alpha=0.001),
                  Latency(delay_ms=1000, distribution="lognormal", sigma=1000)):
        draws = [fault.sample_ms(random.Random(seed)) for seed in range(200)]
        assert all(0 <= ms <= MAX_WAIT_MS for ms in draws) and max(draws) == MAX_WAIT_MS


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["inf", "nan"])
def test_a_drill_timeout_must_be_finite(flag: str) -> None:
    done = chaosproxy("drill", "--agent", "true", "--upstream", "http://127.0.0.1:9", "--timeout", flag, "--plan")
    assert done.returncode == 2 and "timeout" in done.stderr and "Traceback" not in done.stderr, done.stderr
