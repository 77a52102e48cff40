"""Reloading the scenario file on SIGHUP and on change: a bad file never replaces a good scenario."""

from __future__ import annotations

import asyncio
import io
import os
import signal
from pathlib import Path

import pytest

from chaosproxy.control.reload import reload_scenario, reloading
from chaosproxy.engine.core import Engine
from chaosproxy.engine.scenario import Scenario
from chaosproxy.telemetry.log import PerturbationLog, ops

ONE = "rules: [{name: one, fault: {type: http_error}}]\n"
TWO = "rules: [{name: two, fault: {type: http_error}}]\n"
BAD = "rules:\n  - name: bad\n    fault: {type: http_error, status: 200}\n"


@pytest.fixture
def engine() -> Engine:
    return Engine(Scenario(), seed=1, log=PerturbationLog(io.BytesIO(), run_id="test", seed=1))


def rule_names(engine: Engine) -> list[str]:
    return [rule.name for rule in engine.scenario.rules]


async def wait_for(condition, timeout: float = 5) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_an_invalid_file_keeps_the_scenario_in_force(engine, tmp_path: Path, caplog):
    path = tmp_path / "drill.yaml"
    path.write_text(ONE)
    assert await reload_scenario(engine, path) and rule_names(engine) == ["one"]
    path.write_text(BAD)
    ops.addHandler(caplog.handler)
    try:
        assert not await reload_scenario(engine, path)
    finally:
        ops.removeHandler(caplog.handler)
    assert rule_names(engine) == ["one"]
    assert f"{path}:3: rules[0].fault.status: Input should be greater than or equal to 400" in caplog.text


async def test_sighup_reloads(engine, tmp_path: Path):
    path = tmp_path / "drill.yaml"
    path.write_text(ONE)
    async with reloading(engine, path):
        os.kill(os.getpid(), signal.SIGHUP)
        await wait_for(lambda: rule_names(engine) == ["one"])


async def test_watch_reloads_when_the_file_changes(engine, tmp_path: Path):
    path = tmp_path / "drill.yaml"
    path.write_text(ONE)
    async with reloading(engine, path, watch=True, interval=0.02):
        path.write_text(TWO)
        await wait_for(lambda: rule_names(engine) == ["two"])
        path.write_text(BAD)
        await asyncio.sleep(0.1)
        assert rule_names(engine) == ["two"]
        fresh = tmp_path / "new.yaml"  # saved the way editors do: a new file renamed over the old
        fresh.write_text(ONE)
        fresh.replace(path)
        await wait_for(lambda: rule_names(engine) == ["one"])
