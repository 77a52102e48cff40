"""The `chaosproxy` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from chaosproxy import __version__
from chaosproxy.faults import REGISTRY
from chaosproxy.log import ops, setup_operational_log
from chaosproxy.scenario import Scenario, ScenarioError, load_scenario

EXIT_INVALID = 2


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _upstream_url(value: str) -> str:
    from yarl import URL
    url = URL(value)
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {value!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chaosproxy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"chaosproxy {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug-level operational log")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="reverse-proxy HTTP traffic to an upstream, injecting faults")
    run.add_argument("--upstream", required=True, type=_upstream_url, help="the real tool server's base URL")
    run.add_argument("--listen", default=("127.0.0.1", 8800), type=_listen_address, metavar="HOST:PORT",
                     help="where the agent connects (default 127.0.0.1:8800)")
    _add_run_options(run)

    validate = sub.add_parser("validate", help="check scenario files (exit 0 valid, 2 invalid)")
    validate.add_argument("files", nargs="+", metavar="FILE")

    sub.add_parser("faults", help="list the fault types, their component, level and parameters")
    sub.add_parser("schema", help="print the scenario JSON Schema")
    demo = sub.add_parser("demo", help="run the bundled example: tool server, proxy, scripted agent")
    demo.add_argument("--log", type=Path, help="perturbation log file (default: printed as it goes)")
    return parser


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", type=Path, help="scenario YAML (default: no faults)")
    parser.add_argument("--seed", type=int, help="root seed (default: the scenario's, else random)")
    parser.add_argument("--log", type=Path, help="perturbation log, JSON lines (default: stderr)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_operational_log(args.verbose)
    match args.command:
        case "run":
            return _run(args)
        case "validate":
            return _validate(args.files)
        case "faults":
            print(faults_table())
            return 0
        case "schema":
            print(json.dumps(Scenario.model_json_schema(), indent=2))
            return 0
        case "demo":
            from chaosproxy.demo import run_demo
            return run_demo(args.log)
    return EXIT_INVALID


def _run(args: argparse.Namespace) -> int:
    from chaosproxy.adapters.http import HttpProxy
    from chaosproxy.runtime import open_engine, run_async, wait_for_stop_signal

    host, port = args.listen
    try:
        with open_engine(args.scenario, seed=args.seed, log_path=args.log) as engine:
            async def serve() -> None:
                proxy = HttpProxy(engine, args.upstream)
                bound = await proxy.start(host, port)
                ops.info("listening on http://%s:%d -> %s (seed %d, %d rules)", host, bound, args.upstream,
                         engine.seed, len(engine.scenario.rules))
                try:
                    await wait_for_stop_signal()
                finally:
                    ops.info("stopping")
                    await proxy.stop()
            run_async(serve())
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"chaosproxy: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _validate(files: list[str]) -> int:
    status = 0
    for name in files:
        try:
            scenario = load_scenario(name)
        except ScenarioError as exc:
            print(exc, file=sys.stderr)
            status = EXIT_INVALID
        else:
            print(f"{name}: ok ({len(scenario.rules)} rules)")
    return status


def faults_table() -> str:
    rows = [("TYPE", "COMPONENT", "LEVEL", "PARAMETERS", "WHAT IT DOES")]
    for name, fault in sorted(REGISTRY.items()):
        params = ", ".join(
            key if info.is_required() else f"{key}={_show(info.get_default(call_default_factory=True))}"
            for key, info in fault.model_fields.items() if key != "type"
        )
        rows.append((name, fault.component, fault.level, params, fault.summary()))
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    )


def _show(value: object) -> str:
    return "none" if value is None else str(value)
