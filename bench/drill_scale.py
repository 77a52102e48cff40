"""A drill at scale: the retrying example agent over the RobustBench-TC suite, locally and on Ray.

  flock /tmp/chaosproxy-bench.lock .venv/bin/python bench/drill_scale.py --runs 1000 [--executors local,ray]

Starts the bundled MCP tool server, then drills it with `--jobs 2` (local) and `--executor ray` (a
local Ray cluster the drill starts on loopback, one CPU per run), the same plan both times. Prints, per
executor, the wall time, runs per second, the statuses, and the proxy start-up share of a run's time
(the runs' `proxy_start_s` over their `duration_s`). CPU-heavy for minutes: hold the bench lock.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.helpers.mcp_support import serve  # noqa: E402  (the bundled server, started and stopped the tests' way)

SUITE = ROOT / "scenarios" / "suites" / "robustbench-tc.yaml"


def drill(url: str, runs: int, executor: str, out: Path) -> dict[str, object]:
    baseline = max(1, runs // 20)
    argv = [sys.executable, "-m", "chaosproxy", "drill", "--agent", f"{sys.executable} examples/agent_retry.py",
            "--upstream", url, "--suite", str(SUITE), "--randomize", str(runs - baseline),
            "--baseline", str(baseline), "--seed", "2026", "--timeout", "60", "--out", str(out)]
    argv += ["--jobs", "2"] if executor == "local" else ["--executor", "ray", "--ray-num-cpus", "1"]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=6 * 3600, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    wall = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"the {executor} drill failed ({done.returncode}): {done.stderr[-2000:]}")
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    starts = [r["proxy_start_s"] for r in results if r.get("proxy_start_s") is not None]
    return {"executor": executor, "runs": len(results), "wall_s": round(wall, 1),
            "runs_per_s": round(len(results) / wall, 2),
            "statuses": dict(collections.Counter(r["status"] for r in results)),
            "proxy_start_median_s": round(sorted(starts)[len(starts) // 2], 3) if starts else None,
            "proxy_start_share": round(sum(starts) / sum(r["duration_s"] for r in results), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--executors", default="local,ray")
    parser.add_argument("--out", type=Path, default=None, help="where the drills go (default: a temp folder)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="chaosproxy-scale-"))
    with serve("http") as url:
        for executor in args.executors.split(","):
            print(json.dumps(drill(f"{url}/mcp", args.runs, executor, out / executor)), flush=True)
    print(f"drills in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
