"""`chaosproxy demo --a2a`: the A2A act runs from nothing, every fault of its scenario fires, and its
careful delegating agent gets through all but the task that never ends."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_a2a_demo_tells_its_story(tmp_path: Path) -> None:
    log = tmp_path / "demo.jsonl"
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "demo", "--a2a", "--log", str(log)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for fault in ("agent_card_drift", "stream_drop", "a2a_input_required_loop", "task_stuck", "task_failed",
                  "inject_text"):
        assert fault in out, fault
    assert re.search(r"A2A delegation\s+5\s+1\s+3\s+1", out), out  # tasks, succeeded, recovered, failed
    assert "skills [plan-trip_v2, plan-trip_v2_beta]" in out  # the card it read again had drifted
    assert log.with_suffix(".html").exists()
