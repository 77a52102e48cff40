"""Which server's handshake a fault failed, in a sample with several: a fault line on one server's
handshake is never another server's reason (that server's own failure stays the sample's error)."""

from __future__ import annotations

import orjson
import pytest

pytest.importorskip("inspect_ai", reason="the Inspect integration needs inspect-ai (pip install 'chaosproxy[inspect]')")

from chaosproxy.harness.plan import Draw  # noqa: E402
from chaosproxy.harness.sample import SampleChaos  # noqa: E402


async def test_a_handshake_fault_is_claimed_by_its_own_servers_proxy_only(tmp_path, upstream):
    chaos = SampleChaos(Draw("scenario", "s", 1, "rules: []\n"), "agent", tmp_path, tools=True, model=False)
    other = "http://127.0.0.1:9/mcp"  # a second server of the sample (never called: only its proxy starts)
    try:
        await chaos.proxy_url(upstream + "/mcp")
        await chaos.proxy_url(other)
        mine, theirs = chaos.of_upstream(upstream + "/mcp"), chaos.of_upstream(other)
        my_run, their_run = chaos._runs.values()  # each proxy's run id, in the order they started
        assert mine({"run_id": my_run}) and not mine({"run_id": their_run}) and theirs({"run_id": their_run})
        with open(chaos.log_path, "ab") as log:
            for run_id, method in ((their_run, "tools/list"), (my_run, "initialize")):
                log.write(orjson.dumps({"event": "fault", "run_id": run_id, "method": method, "rule": "r"}) + b"\n")
        assert [line["method"] for line in chaos.handshake_faults(mine)] == ["initialize"]
        assert chaos.handshake_faults(mine) == []  # claimed once
        assert [line["method"] for line in chaos.handshake_faults(theirs)] == ["tools/list"]
    finally:
        await chaos.aclose()
