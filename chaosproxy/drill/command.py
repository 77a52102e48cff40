"""Run an agent against chaosproxy over a matrix of scenarios x repetitions, clean baselines included.

  chaosproxy drill --agent "python my_agent.py" --upstream http://127.0.0.1:9001/mcp \\
      --scenario scenarios/transition/server_error.yaml --repeat 5 --jobs 4
  chaosproxy drill --agent "python my_agent.py" --upstream http://127.0.0.1:9001/mcp \\
      --suite scenarios/suites/transient.yaml --randomize 20 --timeout 60
  chaosproxy drill drill.yaml                      # the same settings from a file (flags win)
  chaosproxy drill --replay drills/drill-20260101-120000/run-17
  chaosproxy drill drill.yaml --plan                 # the run matrix (run, shard, scenario, seed) only
  chaosproxy drill drill.yaml --shard 1/3 --out drills/s1   # shard 1 of 3 (from 0); merge them afterwards:
  chaosproxy merge drills/s0 drills/s1 drills/s2 --out drills/all
  chaosproxy drill drill.yaml --executor ray --ray-address HOST:PORT   # a Ray task per run (the [ray] extra)
  chaosproxy drill drill.yaml --fail-under transition=0.8   # exit 3 when a success rate is under its minimum

Each run gets its own proxy (or, with --stdio, a ready `chaosproxy stdio` command line) and its own
seed. The agent finds in its environment (the drill's, less any other CHAOSPROXY_* variable):
CHAOSPROXY_URL (the tool server's URL through the proxy), CHAOSPROXY_STDIO_COMMAND (with --stdio),
CHAOSPROXY_RUN (the run's folder) and CHAOSPROXY_SEED. A
run passes when the agent exits 0, or, with --judge, when the judge does (it also gets
CHAOSPROXY_AGENT_EXIT). A run over --timeout is killed with its process group: status `timeout`.

A suite (--suite) is a scenario whose values may be drawn per sample:
  `!range [low, high]`  uniform; integers when both bounds are integers, bounds included
  `!choice [a, b, c]`   one of the options (options may hold distributions themselves)
and `pick: N` says how many of its rules each sample takes (default 1). Each sample's scenario and
seed are written to its runs' folders. See scenarios/suites/.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

from chaosproxy.report.command import add_gate_arguments

EXIT_INVALID = 2
EXIT_STOPPED = 130


def _shard(text: str) -> Any:
    from chaosproxy.drill.plan import Shard

    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", type=Path, metavar="DRILL.yaml",
                        help="drill settings (the flags' names as keys); flags given as well win")
    parser.add_argument("--agent", help="the agent command line, e.g. 'python my_agent.py' (no shell)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--upstream", help="the tool server's URL; the agent gets it through the proxy in "
                        "CHAOSPROXY_URL, path included (e.g. http://127.0.0.1:9001/mcp)")
    target.add_argument("--stdio", help="an MCP server command line; the agent gets a ready "
                        "`chaosproxy stdio` command line for it in CHAOSPROXY_STDIO_COMMAND")
    parser.add_argument("--replay-cassette", type=Path, metavar="DIR",
                        help="run offline: the upstream (or the stdio server) is this cassette, replayed; with "
                             "--upstream, its URL's path is the agent's (chaosproxy record and replay)")
    parser.add_argument("--scenario", dest="scenarios", action="append", type=Path, metavar="FILE",
                        help="a scenario to run (repeatable)")
    parser.add_argument("--suite", type=Path, help="a suite to sample scenarios from (with --randomize)")
    parser.add_argument("--randomize", type=int, metavar="N", help="sample N scenarios from the suite")
    parser.add_argument("--repeat", type=int, metavar="N", help="runs per scenario (default 1)")
    parser.add_argument("--baseline", type=int, metavar="N", help="clean runs (default: --repeat)")
    parser.add_argument("--timeout", type=float, metavar="S", help="seconds per run (default 120)")
    parser.add_argument("--jobs", type=int, metavar="N", help="runs at once (default 1)")
    parser.add_argument("--judge", help="a command whose exit status decides success (default: the agent's)")
    parser.add_argument("--seed", type=int, help="the drill's root seed (default: drawn and recorded)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="the drill's folder (default drills/drill-TIMESTAMP)")
    parser.add_argument("--replay", type=Path, metavar="RUN_DIR",
                        help="run DRILL/run-N again with its scenario and seed (with --agent: another agent; "
                             "with --upstream: another upstream, or the same given again with its credentials)")
    parser.add_argument("--plan", nargs="?", const="-", metavar="FILE",
                        help="print the run matrix (run, shard, kind, scenario, seed) and run nothing; "
                             "with FILE, write it as JSON lines (the scenarios' text included)")
    parser.add_argument("--shard", type=_shard, metavar="I/N",
                        help="carry out only shard I of N (I from 0, e.g. \"$JOB_COMPLETION_INDEX/4\"): "
                             "every "
                             "N-th run of the same plan, same run numbers and seeds; needs --seed")
    add_gate_arguments(parser)
    parser.add_argument("--executor", choices=["local", "ray"],
                        help="local processes (default), or a Ray task per run "
                             "(pip install 'chaosproxy[ray]')")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="the Ray cluster to use (default: $RAY_ADDRESS, else a local one)")
    parser.add_argument("--ray-num-cpus", type=float, metavar="N",
                        help="CPUs each run's Ray task reserves (default 1)")


def add_merge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR",
                        help="the folders of `chaosproxy drill --shard I/N` runs of one drill")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="the merged drill's folder")


def merge_main(args: argparse.Namespace) -> int:
    """Merge the shards of one drill into one folder, as if it had run unsharded."""
    from chaosproxy.records.drill_folder import DrillFolderError, merge, write_merged

    try:
        drill = merge(args.shards)
        for warning in drill.warnings:
            print(f"chaosproxy merge: warning: {warning}", file=sys.stderr)
        write_merged(drill, args.out)
    except DrillFolderError as exc:
        print(f"chaosproxy merge: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(f"merged {len(args.shards)} shard(s), {len(drill.results)} runs, into {args.out}/; "
          f"the report: chaosproxy report {args.out} --html report.html")
    return 0


def main(args: argparse.Namespace) -> int:
    import asyncio

    try:
        if args.replay is not None:
            return _replay(args)
        return _plan(args) if args.plan is not None else _drill(args)
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("chaosproxy drill: stopped; the runs' processes were ended, finished runs are in results.jsonl",
              file=sys.stderr)
        return EXIT_STOPPED


def _config(args: argparse.Namespace) -> Any:
    from chaosproxy.drill.config import DrillConfig, load_config

    return load_config(args.file, {key: getattr(args, key, None) for key in DrillConfig.model_fields})


def _plan(args: argparse.Namespace) -> int:
    """The run matrix, and what it costs, without running anything."""
    import json

    from chaosproxy.drill.drill import plan
    from chaosproxy.drill.plan import Shard
    from chaosproxy.engine.scenario import ScenarioError

    try:
        config = _config(args)
        seed, specs, chosen = plan(config, args.shard)
    except (ScenarioError, ValueError) as exc:
        print(exc if isinstance(exc, ScenarioError) else f"chaosproxy drill: {exc}", file=sys.stderr)
        return EXIT_INVALID
    shard = args.shard or Shard(0, 1)
    positions = {spec.name: position for position, spec in enumerate(specs)}
    rows = [{"run": spec.name, "shard": f"{positions[spec.name] % shard.count}/{shard.count}",
             "kind": spec.kind, "scenario": spec.label, "seed": spec.seed} for spec in chosen]
    if args.plan != "-":
        with open(args.plan, "w", encoding="utf-8") as out:
            for row, spec in zip(rows, chosen, strict=True):
                out.write(json.dumps({**row, "root_seed": seed, "scenario_text": spec.scenario_text}) + "\n")
    else:
        widths = {key: max(len(key), *(len(str(row[key])) for row in rows)) for key in rows[0]}
        print("  ".join(key.ljust(width) for key, width in widths.items()).rstrip())
        for row in rows:
            print("  ".join(str(row[key]).ljust(width) for key, width in widths.items()).rstrip())
    kinds = collections.Counter(spec.kind for spec in chosen)
    which = f"{len(specs)} runs"
    if args.shard is not None:
        which = f"shard {args.shard}: {len(chosen)} of the plan's {which}"
    print(f"{which} ({', '.join(f'{n} {kind}' for kind, n in kinds.items())}), root seed {seed}, "
          f"at most {config.timeout:g} s each, {config.jobs} at a time"
          + (f"; written to {args.plan}" if args.plan != "-" else ""), file=sys.stderr)
    return 0


def _drill(args: argparse.Namespace) -> int:
    from chaosproxy.drill.drill import run_drill
    from chaosproxy.engine.scenario import ScenarioError
    from chaosproxy.report.command import gate
    from chaosproxy.report.profile import build_profile

    try:
        folder, results = run_drill(_config(args), args.shard)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    except (FileExistsError, ValueError) as exc:
        print(f"chaosproxy drill: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(summary(results, folder))
    print(f"\nruns and logs in {folder}/; the report: chaosproxy report {folder} --html report.html")
    if args.fail_under and (status := gate(build_profile(results), args.fail_under, [], [])):
        return status
    return 1 if any(result["status"] == "error" for result in results) else 0


def _replay(args: argparse.Namespace) -> int:
    from chaosproxy.drill.drill import replay

    if not (args.replay / "run.json").is_file():
        print(f"chaosproxy drill: {args.replay} is not a drill run's folder (no run.json)", file=sys.stderr)
        return EXIT_INVALID
    try:
        folder, result, original = replay(args.replay, args.agent, args.upstream)
    except ValueError as exc:
        print(f"chaosproxy drill: {exc}", file=sys.stderr)
        return EXIT_INVALID
    was = original["status"] if original else "unknown"
    print(f"{args.replay}: replayed in {folder}: {result['status']} (the original run: {was})")
    return 1 if result["status"] == "error" else 0


def summary(results: list[dict[str, object]], folder: Path) -> str:
    """Passed out of runs per configuration, in plan order, each named with the faults its scenario
    injects (read from its first run's scenario.yaml in the drill's `folder`)."""
    from chaosproxy.drill.plan import injected_faults

    by_label: dict[str, collections.Counter[str]] = {}
    names: dict[str, str] = {}
    for result in results:
        label = str(result["label"])
        if label not in names:
            try:
                faults = injected_faults((folder / str(result["run"]) / "scenario.yaml").read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                faults = []
            names[label] = f"{label} ({', '.join(faults)})" if faults else label
        by_label.setdefault(label, collections.Counter())[str(result["status"])] += 1
    width = max(len(name) for name in names.values())
    lines = []
    for label, counts in by_label.items():
        others = ", ".join(f"{counts[s]} {s}" for s in ("failed", "timeout", "error") if counts[s])
        line = f"{names[label].ljust(width)}  {counts['passed']}/{counts.total()} passed"
        lines.append(f"{line} ({others})" if others else line)
    return "\n".join(lines)
