"""The seed the console shows is the one in force (issue 25): a scenario put in force later cannot
change a run's seed, and the console says so instead of showing the new one."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.control.test_console import console, edit  # noqa: F401  (the fixture, and typing into the editor)
from tests.helpers.browser import open_tab

NEW_SEED = "seed: 5\nrules:\n  - name: slow\n    fault: {type: latency, delay_ms: 5}\n"
NOT_USED = "seed 5 is not used: the run keeps seed 7"


def test_the_scenario_in_force_shows_the_runs_seed_and_a_check_says_why_another_is_not_used(console: Any) -> None:
    ctl = console()
    headers = {"Content-Type": "application/yaml"}
    status, body = ctl.request("POST", "/scenario/check", headers, NEW_SEED.encode())
    assert status == 200 and json.loads(body)["notes"] == [
        f"{NOT_USED}, as a seed is fixed when the proxy starts (restart it with --seed to change it)"]
    status, body = ctl.request("PUT", "/scenario", headers, NEW_SEED.encode())
    assert status == 200 and json.loads(body)["seed"] == 7
    status, body = ctl.request("GET", "/scenario?format=yaml")
    assert yaml.safe_load(body)["seed"] == 7 and body.startswith(b"seed: 7\n")
    status, body = ctl.request("POST", "/scenario/check", headers, b"seed: 7\nrules: []\n")
    assert "notes" not in json.loads(body)


async def test_the_console_shows_the_seed_in_force_after_a_scenario_with_another(console: Any) -> None:
    ctl = console()
    async with open_tab(ctl.url) as tab:
        await tab.wait_for("document.getElementById('seed').textContent == '7'")
        await edit(tab, NEW_SEED)
        await tab.wait_for("!document.getElementById('swap').disabled")
        assert NOT_USED in await tab.evaluate("document.getElementById('verdict').textContent")
        await tab.evaluate("document.getElementById('swap').click()")
        await tab.wait_for("document.getElementById('verdict').textContent.startsWith('in force')")
        assert NOT_USED in await tab.evaluate("document.getElementById('verdict').textContent")
        assert (await tab.evaluate("document.getElementById('scenario').value")).startswith("seed: 7\n")
        assert await tab.evaluate("document.getElementById('seed').textContent") == "7"
        assert tab.problems == []
