"""Turn an Inspect eval of a chaos task into a drill's folder, for report, compare, gates, merge and export.

  chaosproxy import-inspect logs/2026-12-01T10-00-00_task_abc.eval --out drills/inspect-run
  chaosproxy report drills/inspect-run --fail-under transition=0.8
  chaosproxy import-inspect shard-0.eval --shard 0/2 --out drills/s0     # an eval split over machines
  chaosproxy import-inspect shard-1.eval --shard 1/2 --out drills/s1
  chaosproxy merge drills/s0 drills/s1 --out drills/all

The eval must come from a task wrapped with chaosproxy.harness.chaos_task (its scores carry the
sample-epoch's chaos; the store, its log). Needs the [inspect] extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chaosproxy.drill.command import _shard

EXIT_INVALID = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, metavar="LOG.eval", help="an Inspect eval log (.eval or .json)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="the drill folder to write (new)")
    parser.add_argument("--scorer", metavar="NAME",
                        help="the chaos scorer to read (default: the first whose scores carry chaosproxy's metadata)")
    parser.add_argument("--shard", type=_shard, metavar="I/N",
                        help="the eval is shard I of N of one plan: merge the folders with `chaosproxy merge`")


def main(args: argparse.Namespace) -> int:
    try:
        from chaosproxy.harness.importer import InspectLogError, import_eval
    except ImportError as exc:
        print(f"chaosproxy import-inspect needs Inspect AI ({exc}): pip install 'chaosproxy[inspect]'",
              file=sys.stderr)
        return 1
    if not args.log.is_file():
        print(f"chaosproxy import-inspect: {args.log}: no such file", file=sys.stderr)
        return EXIT_INVALID
    try:
        runs = import_eval(args.log, args.out, scorer=args.scorer, shard=args.shard)
    except InspectLogError as exc:
        print(f"chaosproxy import-inspect: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(f"chaosproxy import-inspect: {runs} runs written to {args.out}", file=sys.stderr)
    return 0
