"""`chaosproxy report` and `chaosproxy export`: their flags and what they write."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaosproxy.report.gate import EXIT_GATE, parse_points, parse_thresholds

if TYPE_CHECKING:
    from chaosproxy.records.drill_folder import Drill

EXIT_INVALID = 2
DESCRIPTION = """\
The robustness profile of a drill, the agent's behaviour from a log, two drills compared, and gates for CI.

chaosproxy report DRILL_DIR_OR_LOG [--html F --md F --json F]     one drill (or a log's behaviour)
chaosproxy report BASE_DIR NEW_DIR [--html F --md F --json F]     two drills side by side
chaosproxy report SHARD_DIR... --merge [...]                      the shards of one drill as one
--fail-under NAME=RATE[,...]   exit 3 when a perturbed success rate is under its minimum (the new drill's)
--max-regression PTS           with BASE_DIR NEW_DIR: exit 3 when a difference is wholly below -PTS
A gate asked of a drill whose results fall short of its plan cannot be checked: exit 3, saying why.
"""


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources",
        type=Path,
        nargs="+",
        metavar="LOG_OR_DRILL_DIR",
        help="a perturbation log (agent behaviour) or a drill's folder (the profile too); "
        "two drills: BASE_DIR NEW_DIR, compared; with --merge: the shards of one drill",
    )
    parser.add_argument(
        "--merge", action="store_true", help="the folders are shards of one drill: report it whole"
    )
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML report")
    parser.add_argument("--md", type=Path, metavar="FILE", help="write the report as Markdown")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the numbers as JSON")
    add_gate_arguments(parser)
    parser.add_argument(
        "--max-regression",
        type=parse_points,
        metavar="PTS",
        help="with BASE_DIR NEW_DIR: exit 3 when a difference's whole interval is more than PTS "
        "percentage points worse",
    )


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-under",
        type=parse_thresholds,
        metavar="NAME=RATE[,...]",
        help="exit 3 when the success rate of runs where a fault of NAME (a component, a fault "
        "type, or overall) fired is under RATE, e.g. transition=0.8,overall=0.9",
    )


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, metavar="LOG_OR_DRILL_DIR")
    parser.add_argument(
        "--format",
        required=True,
        choices=["trajectories"],
        help="trajectories: one JSON line per session, its calls in order with their faults",
    )
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="default: standard output")


def _error(command: str, message: str) -> int:
    print(f"chaosproxy {command}: {message}", file=sys.stderr)
    return EXIT_INVALID


def _warn(command: str, warnings: list[str]) -> None:
    for warning in warnings:
        print(f"chaosproxy {command}: warning: {warning}", file=sys.stderr)


def read_drills(command: str, sources: list[Path], merged: bool) -> list[Drill]:
    """The drills named (or their merge), warnings printed. Raises ValueError naming the folder or file."""
    from chaosproxy.records.drill_folder import merge, read_drill

    drills = [merge(sources)] if merged else [read_drill(source) for source in sources]
    for drill in drills:
        _warn(command, drill.warnings)
    return drills


def report_main(args: argparse.Namespace) -> int:
    """Writes the files asked for; with none, prints the Markdown report. Then the gates."""
    sources: list[Path] = args.sources
    if missing := [source for source in sources if not source.exists()]:
        return _error("report", f"{missing[0]}: no such file or folder")
    comparing = len(sources) == 2 and not args.merge
    if len(sources) > 2 and not args.merge:
        return _error(
            "report", "give one drill (or log), BASE_DIR NEW_DIR to compare, or shards with --merge"
        )
    if args.max_regression is not None and not comparing:
        return _error("report", "--max-regression needs a base: chaosproxy report BASE_DIR NEW_DIR")
    if args.merge and any(source.is_file() for source in sources):
        return _error("report", "--merge takes drill folders (the shards of one drill)")
    try:
        if comparing:
            return _compare(args, *read_drills("report", sources, merged=False))
        if sources[0].is_file() and not args.merge:
            return _report_log(args, sources[0])
        [drill] = read_drills("report", sources, merged=args.merge)
    except ValueError as exc:
        return _error("report", str(exc))
    return _report_drill(args, drill)


def _write(args: argparse.Namespace, subject: Any, renderers: dict[str, Callable[[Any], str]]) -> None:
    if args.html is None and args.md is None and args.json is None:
        print(renderers["md"](subject))
        return
    for kind in ("html", "md", "json"):
        if (path := getattr(args, kind)) is not None:
            path.write_text(renderers[kind](subject), encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)


def _report_renderers() -> dict[str, Callable[[Any], str]]:
    import json

    from chaosproxy.report.build import report_json
    from chaosproxy.report.html import render_html
    from chaosproxy.report.markdown import render_markdown

    return {
        "html": render_html,
        "md": render_markdown,
        "json": lambda report: json.dumps(report_json(report), indent=2) + "\n",
    }


def _report_log(args: argparse.Namespace, path: Path) -> int:
    from chaosproxy.report.build import build_report

    if args.fail_under:
        return _error("report", f"{path}: --fail-under needs a drill's folder (a log has no success rates)")
    _write(args, build_report(path), _report_renderers())
    return 0


def _report_drill(args: argparse.Namespace, drill: Drill) -> int:
    from chaosproxy.report.build import drill_report

    report = drill_report(drill)
    _write(args, report, _report_renderers())
    assert report.profile is not None
    return gate(report.profile, args.fail_under, [], drill.gaps if args.fail_under else [])


def _compare(args: argparse.Namespace, base: Drill, new: Drill) -> int:
    import json

    from chaosproxy.report.compare import compare
    from chaosproxy.report.compare_output import (
        comparison_json,
        render_comparison_html,
        render_comparison_markdown,
    )
    from chaosproxy.report.gate import regressions
    from chaosproxy.report.profile import build_profile

    comparison = compare(base, new)
    _write(
        args,
        comparison,
        {
            "html": render_comparison_html,
            "md": render_comparison_markdown,
            "json": lambda c: json.dumps(comparison_json(c), indent=2) + "\n",
        },
    )
    regressed = regressions(comparison, args.max_regression) if args.max_regression is not None else []
    profile = build_profile(new.results) if args.fail_under else None
    # each gate reads its drills: --max-regression both, --fail-under the new one
    gaps = [*(base.gaps if args.max_regression is not None else []),
            *(new.gaps if args.max_regression is not None or args.fail_under else [])]
    return gate(profile, args.fail_under, regressed, gaps)


def gate(profile: Any, thresholds: dict[str, float] | None, regressed: list[str], gaps: list[str]) -> int:
    """Exit status 3 naming every threshold missed, every regression, and every gap of a gated drill
    (its results short of its plan: the gate cannot be checked); else 0."""
    from chaosproxy.report.gate import missed_thresholds

    missed = [*(missed_thresholds(profile, thresholds) if thresholds else []), *regressed,
              *(f"cannot be checked: {gap}" for gap in gaps)]
    for line in missed:
        print(f"chaosproxy: gate failed: {line}", file=sys.stderr)
    return EXIT_GATE if missed else 0


def export_main(args: argparse.Namespace) -> int:
    import orjson

    from chaosproxy.report.trajectories import trajectories

    source: Path | Drill = args.source
    if not args.source.is_file():
        try:
            [source] = read_drills("export", [args.source], merged=False)
        except ValueError as exc:
            return _error("export", str(exc))
    out = open(args.output, "wb") if args.output is not None else sys.stdout.buffer  # noqa: SIM115
    try:
        for line in trajectories(source):
            out.write(orjson.dumps(line) + b"\n")
    finally:
        if args.output is not None:
            out.close()
    return 0
