"""Record, replay, compare: the cassette's part of the command line.

  chaosproxy run --upstream http://127.0.0.1:9001 --record cassettes/everything     # record (HTTP, model APIs)
  chaosproxy stdio --record cassettes/time -- mcp-server-time                        # record (stdio)
  chaosproxy replay cassettes/everything --listen 127.0.0.1:9001 [--speed 4 | --no-delay]
  chaosproxy replay cassettes/time --stdio                                          # a stdio server
  chaosproxy run --replay-cassette cassettes/everything --scenario s.yaml           # faults on replayed traffic
  chaosproxy drill --agent ... --upstream http://127.0.0.1:9001/mcp --replay-cassette cassettes/everything
  chaosproxy cassette diff cassettes/everything --upstream http://staging:9001      # drift, for CI
  chaosproxy cassette convert tests/cassettes/test_x.yaml cassettes/x               # from VCR.py (or back)

`replay` and `--replay-cassette` read VCR.py cassettes (.yaml, .json) as they are.
`cassette diff` exits 0 when nothing drifted, 1 when something did, 2 on bad input and 3 when the
upstream answered none of the requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaosproxy.cassette.format import Cassette, CassetteError, CassetteWriter, new_header
from chaosproxy.cassette.reading import read_cassette
from chaosproxy.cassette.recorder import HttpRecorder, StdioRecorder
from chaosproxy.cassette.redact import Redactor, redacted_command
from chaosproxy.cassette.replay import ReplayServer
from chaosproxy.telemetry.log import ops

EXIT_DRIFT = 1
EXIT_INVALID = 2
EXIT_UNREACHABLE = 3


# recording

def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record", type=Path, metavar="DIR",
                        help="record what the upstream receives and sends into a cassette in DIR (a new folder)")
    parser.add_argument("--redact", action="append", default=[], metavar="NAME",
                        help="also redact headers, body fields and query keys of this name in the cassette "
                             "(repeatable; credentials are redacted by default)")


def http_recorder(args: argparse.Namespace, upstreams: list[str]) -> HttpRecorder | None:
    """The recorder `run --record DIR` asks for (None without it). Raises CassetteError."""
    if args.record is None:
        return None
    redactor = Redactor(args.redact)
    found: list[str] = []
    shown = [redactor.target(url, "upstream", found) for url in upstreams]
    return HttpRecorder(CassetteWriter(args.record, new_header("http", redactor.policy(), upstreams=shown)),
                        redactor)


def stdio_recorder(args: argparse.Namespace, command: list[str]) -> StdioRecorder | None:
    """The recorder `stdio --record DIR` asks for (None without it). Raises CassetteError."""
    if args.record is None:
        return None
    redactor = Redactor(args.redact)
    header = new_header("stdio", redactor.policy(), command=redacted_command(command, redactor))
    return StdioRecorder(CassetteWriter(args.record, header), redactor)


# `run --replay-cassette`

def replayed_upstream(args: argparse.Namespace) -> ReplayedUpstream | None:
    """The replayed upstream `run --replay-cassette DIR` asks for (None without it). Raises CassetteError."""
    if args.replay_cassette is None:
        return None
    if args.upstream is not None:
        raise CassetteError("give --upstream or --replay-cassette, not both: the cassette stands in for the upstream")
    return ReplayedUpstream(args.replay_cassette)


class ReplayedUpstream:
    """`run --replay-cassette DIR`: the cassette served, on a loopback port of its own in the proxy's
    process and loop, as the proxy's upstream; scenarios apply to its traffic as to a live upstream's."""

    def __init__(self, source: Path) -> None:
        cassette = _http_cassette(read_cassette(source))
        self.server = ReplayServer(cassette)
        self.url = f"http://127.0.0.1:{self.server.bind()}"

    def fronted(self, make_proxy: Callable[[Any], Any]) -> Callable[[Any], _Fronted]:
        """`make_proxy` (engine -> proxy) made to start and stop the replay with the proxy."""
        return lambda engine: _Fronted(self.server, make_proxy(engine))


class _Fronted:
    """A proxy and the replayed upstream it fronts, started and stopped together."""

    def __init__(self, server: ReplayServer, proxy: Any) -> None:
        self.server = server
        self.proxy = proxy

    async def start(self, host: str, port: int) -> int:
        await self.server.start()
        return int(await self.proxy.start(host, port))

    async def stop(self) -> None:
        await self.proxy.stop()
        await self.server.stop()


def _http_cassette(cassette: Cassette) -> Cassette:
    if cassette.kind != "http":
        raise CassetteError(f"{cassette.source}: a {cassette.kind} cassette; serve it with "
                            "`chaosproxy replay DIR --stdio` (as the command of `chaosproxy stdio`)")
    return cassette


# replay

def add_replay_arguments(parser: argparse.ArgumentParser, listen: Callable[[str], tuple[str, int]]) -> None:
    parser.add_argument("source", type=Path, metavar="DIR",
                        help="the cassette: a folder recorded with --record, or a VCR.py cassette file")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--listen", type=listen, default=("127.0.0.1", 8900), metavar="HOST:PORT",
                       help="serve an HTTP cassette here (default 127.0.0.1:8900)")
    where.add_argument("--stdio", action="store_true",
                       help="serve a stdio cassette on stdin/stdout, as the server command would")
    timing = parser.add_mutually_exclusive_group()
    timing.add_argument("--speed", type=float, default=1.0, metavar="N",
                        help="play the recorded timing N times as fast (default 1: as recorded)")
    timing.add_argument("--no-delay", action="store_true", help="answer at once, ignoring the recorded timing")


def replay_main(args: argparse.Namespace) -> int:
    from chaosproxy.control.runtime import run_async

    if not args.no_delay and not args.speed > 0:
        print(f"chaosproxy replay: --speed must be positive, got {args.speed}", file=sys.stderr)
        return EXIT_INVALID
    speed = None if args.no_delay else args.speed
    try:
        cassette = read_cassette(args.source)
        if args.stdio and cassette.kind != "stdio":
            raise CassetteError(f"{cassette.source}: an {cassette.kind} cassette: serve it with --listen")
        if not args.stdio:
            _http_cassette(cassette)
    except CassetteError as exc:
        print(f"chaosproxy replay: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.stdio:
        return run_async(_serve_stdio(cassette, speed))
    try:
        return run_async(_serve_http(cassette, args.listen, speed))
    except OSError as exc:
        host, port = args.listen
        print(f"chaosproxy replay: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1


async def _serve_http(cassette: Cassette, listen: tuple[str, int], speed: float | None) -> int:
    from chaosproxy.control.runtime import wait_for_stop_signal

    server = ReplayServer(cassette, speed=speed)
    host, port = listen
    bound = await server.start(host, port)
    timing = "no delay" if speed is None else f"{speed:g}x the recorded timing"
    ops.info("replaying %s (%d exchanges, %s) on http://%s:%d", cassette.source, len(cassette.exchanges), timing,
             host, bound)
    try:
        await wait_for_stop_signal()
    finally:
        await server.stop()
        replay = server.replay
        ops.info("replay: %d requests answered from the cassette, %d it does not hold", replay.served,
                 replay.unmatched_count)
    return 0


async def _serve_stdio(cassette: Cassette, speed: float | None) -> int:
    from chaosproxy.adapters.stdio import claim_stdio
    from chaosproxy.cassette.replay import StdioReplay

    agent_in, agent_out = claim_stdio()  # only frames reach stdout; a stray print goes to stderr
    with open(agent_in, "rb") as reading, open(agent_out, "wb", buffering=0) as writing:
        async def write(data: bytes) -> None:
            with contextlib.suppress(BrokenPipeError):  # the client left: nothing more to say
                writing.write(data)

        return await StdioReplay(cassette, speed=speed).serve(lambda: asyncio.to_thread(reading.readline), write)


# cassette diff / convert

def add_cassette_arguments(parser: argparse.ArgumentParser, url: Callable[[str], str]) -> None:
    sub = parser.add_subparsers(dest="cassette_command", required=True, metavar="COMMAND")
    diff = sub.add_parser("diff", help="send the recorded requests to the live upstream and report what drifted "
                                       "(exit 0 none, 1 drift, 2 bad input, 3 upstream unreachable)")
    diff.add_argument("source", type=Path, metavar="DIR")
    target = diff.add_mutually_exclusive_group(required=True)
    target.add_argument("--upstream", type=url, help="the live upstream of an HTTP cassette")
    target.add_argument("--command", dest="server_command", metavar="COMMAND",
                        help="the server command of a stdio cassette (run afresh)")
    diff.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                      help="a header to send with every request (credentials redacted from the cassette)")
    diff.add_argument("--skip-calls", action="store_true",
                      help="leave out tools/call requests (their side effects), compare discovery only")
    diff.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="per request (default 30)")
    diff.add_argument("--json", action="store_true", help="the report as JSON")
    convert = sub.add_parser("convert", help="a VCR.py cassette (.yaml/.json) to a cassette folder, or back")
    convert.add_argument("source", type=Path, metavar="SOURCE")
    convert.add_argument("dest", type=Path, metavar="DEST")


def cassette_main(args: argparse.Namespace) -> int:
    try:
        return _diff(args) if args.cassette_command == "diff" else _convert(args.source, args.dest)
    except CassetteError as exc:
        print(f"chaosproxy cassette: {exc}", file=sys.stderr)
        return EXIT_INVALID


def _diff(args: argparse.Namespace) -> int:
    import json

    from chaosproxy.cassette.drift import diff_http, diff_stdio

    headers = dict(_header(text) for text in args.header)
    cassette = read_cassette(args.source)
    if (cassette.kind == "http") != (args.upstream is not None):
        raise CassetteError(f"{cassette.source}: an {cassette.kind} cassette: compare it with "
                            + ("--upstream URL" if cassette.kind == "http" else "--command 'SERVER COMMAND'"))
    if cassette.kind == "http":
        report = asyncio.run(diff_http(cassette, args.upstream, headers=headers, skip_calls=args.skip_calls,
                                       timeout=args.timeout))
    else:
        report = asyncio.run(diff_stdio(cassette, shlex.split(args.server_command), skip_calls=args.skip_calls,
                                        timeout=args.timeout))
    changes = report.changes
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(f"cassette diff: {report.sent} requests sent again to {report.upstream} ({report.skipped} left out, "
              f"{report.failed} unanswered): {len(changes)} change{'s' if len(changes) != 1 else ''}")
        for change in changes:
            print(f"  {change.line()}")
    if report.sent == 0 and report.failed:
        return EXIT_UNREACHABLE
    return EXIT_DRIFT if changes else 0


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise CassetteError(f"--header {text!r}: expected 'NAME: VALUE'")
    return name.strip(), value.strip()


def _convert(source: Path, dest: Path) -> int:
    from chaosproxy.cassette.vcr import write_vcr

    cassette = read_cassette(source)
    if dest.suffix in (".yaml", ".yml", ".json"):
        for lost in write_vcr(cassette, dest):
            print(f"chaosproxy cassette convert: {dest} cannot carry {lost}", file=sys.stderr)
    else:
        writer = CassetteWriter(dest, cassette.header)
        for exchange in cassette.exchanges:
            writer.write(exchange)
        for frame in cassette.frames:
            writer.write(frame)
        writer.close()
    print(f"{source} -> {dest}: {len(cassette.exchanges) or len(cassette.frames)} "
          f"{'exchanges' if cassette.kind == 'http' else 'frames'}")
    return 0
