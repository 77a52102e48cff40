"""`chaosproxy report` and `chaosproxy export`: their flags and what they write."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_INVALID = 2


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, metavar="LOG_OR_DRILL_DIR",
                        help="a perturbation log (agent behaviour) or a drill's folder (the profile too)")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML report")
    parser.add_argument("--md", type=Path, metavar="FILE", help="write the report as Markdown")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the numbers as JSON")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, metavar="LOG_OR_DRILL_DIR")
    parser.add_argument("--format", required=True, choices=["trajectories"],
                        help="trajectories: one JSON line per session, its calls in order with their faults")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="default: standard output")


def report_main(args: argparse.Namespace) -> int:
    """Writes the files asked for; with none, prints the Markdown report."""
    import json

    from chaosproxy.report.build import build_report, report_json
    from chaosproxy.report.html import render_html
    from chaosproxy.report.markdown import render_markdown

    if not args.source.exists():
        print(f"chaosproxy report: {args.source}: no such file or folder", file=sys.stderr)
        return EXIT_INVALID
    try:
        report = build_report(args.source)
    except ValueError as exc:
        print(f"chaosproxy report: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.html is None and args.md is None and args.json is None:
        print(render_markdown(report))
        return 0
    outputs = [(args.html, render_html), (args.md, render_markdown),
               (args.json, lambda r: json.dumps(report_json(r), indent=2) + "\n")]
    for path, render in outputs:
        if path is not None:
            path.write_text(render(report), encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
    return 0


def export_main(args: argparse.Namespace) -> int:
    import orjson

    from chaosproxy.report.trajectories import trajectories

    if not args.source.is_file() and not (args.source / "results.jsonl").is_file():
        print(f"chaosproxy export: {args.source}: neither a perturbation log nor a drill's folder",
              file=sys.stderr)
        return EXIT_INVALID
    out = open(args.output, "wb") if args.output is not None else sys.stdout.buffer  # noqa: SIM115
    try:
        for line in trajectories(args.source):
            out.write(orjson.dumps(line) + b"\n")
    finally:
        if args.output is not None:
            out.close()
    return 0
