"""The `chaosproxy` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from chaosproxy import __version__
from chaosproxy.adapters import compiled
from chaosproxy.cassette import command as cassette_command
from chaosproxy.drill import command as drill_command
from chaosproxy.engine.scenario import (
    Scenario,
    ScenarioError,
    check_route,
    load_scenario,
    order_warnings,
    read_text,
)
from chaosproxy.errors import ConfigError
from chaosproxy.harness import command as inspect_command
from chaosproxy.report import command as report_command
from chaosproxy.telemetry.log import LOG_FORMATS, ops, setup_operational_log
from chaosproxy.telemetry.redact import redacted_url

EXIT_INVALID = 2
DESCRIPTION = """\
A fault-injecting proxy between an LLM agent and the servers it calls (tool APIs, MCP servers, its
model API): it injects the failures deployments have, per a YAML scenario, and logs each as a JSON line.
New here? `chaosproxy demo` shows all of it in a few seconds; docs/index.md says which mode you need."""
RUN_DESCRIPTION = """\
Reverse-proxy HTTP to the real server, injecting faults: REST tool APIs, MCP servers over streamable
HTTP or SSE (the agent's MCP URL becomes http://LISTEN/mcp), and an agent's model API (LLM gateway:
the SDK's base_url on the proxy, .../v1 for openai, the bare origin for anthropic).
Where to forward is required: --upstream URL, or --route PREFIX=URL (or routes: in the scenario)."""


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
    parser = argparse.ArgumentParser(prog="chaosproxy", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # (--version unwrapped)
    parser.add_argument("--version", action="version",
                        version=f"chaosproxy {__version__}, HTTP data plane {compiled.FORM}")
    parser.add_argument("-v", "--verbose", action="store_true", default=_env_flag("VERBOSE"),
                        help="debug-level operational log (CHAOSPROXY_VERBOSE=1)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=_env("LOG_FORMAT", "text"),
                        help="the proxy's own messages on stderr: text lines, or JSON objects for a log pipeline "
                             "(CHAOSPROXY_LOG_FORMAT=json)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="reverse-proxy HTTP (tool APIs, MCP over HTTP, model APIs), injecting faults",
                         description=RUN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="Every option also reads CHAOSPROXY_<OPTION> from the environment "
                                "(CHAOSPROXY_UPSTREAM, CHAOSPROXY_ROUTES=PREFIX=URL,..., ...).")
    run.add_argument("--upstream", default=_env("UPSTREAM"), type=_upstream_url, metavar="URL",
                     help="the real server's base URL (all paths not under a --route); this or --route "
                          "is required")
    run.add_argument("--route", action="append", type=_route, metavar="PREFIX=URL", dest="routes", default=[],
                     help="send paths under PREFIX to URL, the prefix taken off (repeatable; "
                          "CHAOSPROXY_ROUTES=PREFIX=URL,...)")
    run.add_argument("--listen", default=_env("LISTEN", "127.0.0.1:8800"), type=_listen_address,
                     metavar="HOST:PORT", help="where the agent connects (default 127.0.0.1:8800)")
    run.add_argument("--upstream-timeout", type=float, default=float(_env("UPSTREAM_TIMEOUT") or 300),
                     metavar="SECONDS", help="give up on an upstream that takes longer to accept a connection or "
                                             "to send a response head: 504 (default 300)")
    run.add_argument("--max-message-mib", type=float, default=float(_env("MAX_MESSAGE_MIB") or 16), metavar="MIB",
                     help="the largest body or SSE event rules look inside; larger ones pass as they are (default 16)")
    run.add_argument("--max-header-line", type=_positive(int), default=_env("MAX_HEADER_LINE", "8192"),
                     metavar="BYTES", help="the longest request line or header line an agent may send: 431 beyond "
                                           "(default 8192)")
    run.add_argument("--max-head", type=_positive(int), default=_env("MAX_HEAD", "65536"), metavar="BYTES",
                     help="the largest request head an agent may send: 431 beyond (default 65536)")
    run.add_argument("--client-header-timeout", type=_positive(float), default=_env("CLIENT_HEADER_TIMEOUT", "60"),
                     metavar="SECONDS", help="close a connection whose request head takes longer, answering 408 "
                                             "(default 60, as nginx)")
    run.add_argument("--keepalive-timeout", type=_positive(float), default=_env("KEEPALIVE_TIMEOUT", "75"),
                     metavar="SECONDS", help="close an agent's connection idle this long between requests "
                                             "(default 75, as nginx)")
    run.add_argument("--replay-cassette", type=Path, metavar="DIR",
                     help="the upstream is this cassette, replayed (chaosproxy replay), instead of --upstream")
    _add_run_options(run)
    cassette_command.add_record_arguments(run)
    run.add_argument("--toxiproxy-api", type=_listen_address, default=_env("TOXIPROXY_API"), metavar="HOST:PORT",
                     help="serve a Toxiproxy 2.x-compatible API here (loopback only), sharing --control's proxies")
    run.add_argument("--scope-header", default=_env("SCOPE_HEADER", "X-Chaosproxy-Scope"), metavar="NAME",
                     help="the request header naming a scope (PUT /scopes/NAME/scenario) (default X-Chaosproxy-Scope)")

    stdio = sub.add_parser(
        "stdio", help="run an MCP server command and relay its stdio, injecting faults",
        usage="chaosproxy stdio [--scenario FILE] [--seed N] [--log FILE] [...] -- COMMAND [ARGS...]",
        description="Put chaosproxy between an MCP host and a stdio MCP server: give the server's command after "
                    "--, as the host's MCP config gives it. Only protocol frames go to stdout.")
    _add_run_options(stdio)
    cassette_command.add_record_arguments(stdio)
    stdio.add_argument("server", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                       help="the MCP server command, exactly as the agent's MCP config gives it")

    mitm = sub.add_parser("mitm", help="intercept the agent's HTTPS traffic (HTTPS_PROXY) with mitmproxy, "
                                       "injecting faults on the listed hosts (the [mitm] extra)",
                          description="The agent's HTTPS proxy, for tool hosts it cannot be pointed away from. "
                                      "Needs the [mitm] extra: pip install 'chaosproxy[mitm]'.")
    mitm.add_argument("--listen", default=_env("LISTEN", "127.0.0.1:8080"), type=_listen_address,
                      metavar="HOST:PORT", help="the agent's HTTPS_PROXY / HTTP_PROXY (default 127.0.0.1:8080)")
    mitm.add_argument("--hosts", default=_env("HOSTS"), metavar="GLOB,...",
                      help="hosts to intercept and fault, e.g. api.example.com,*.corp; all others are tunnelled "
                           "untouched (default: every host)")
    mitm.add_argument("--confdir", type=Path, default=_env("CONFDIR"), metavar="DIR",
                      help="mitmproxy's CA directory; the agent trusts DIR/mitmproxy-ca-cert.pem "
                           "(default ~/.mitmproxy, made on first use)")
    mitm.add_argument("--upstream-ca", type=Path, default=_env("UPSTREAM_CA"), metavar="PEM",
                      help="CA bundle to check the tool servers' certificates against (default: certifi's)")
    _add_run_options(mitm)

    validate = sub.add_parser("validate", help="check scenario files (exit 0 valid, 2 invalid)")
    validate.add_argument("files", nargs="+", metavar="FILE")
    _add_scenario_dir(validate)

    sub.add_parser("faults", help="list the fault types, their component, level and parameters")
    schema = sub.add_parser("schema", help="print the scenario JSON Schema (for editors and check-jsonschema)")
    schema.add_argument("--suite", action="store_true",
                        help="the drill suite schema: pick, and !range/!choice draws as lists")
    toxiproxy = sub.add_parser("toxiproxy", help="serve a Toxiproxy 2.x-compatible API: its clients make "
                                                 "chaosproxy listeners and faults (loopback only)")
    toxiproxy.add_argument("--listen", default=_env("LISTEN", "127.0.0.1:8474"), type=_listen_address,
                           metavar="HOST:PORT", help="where the Toxiproxy API listens (default 127.0.0.1:8474)")
    toxiproxy.add_argument("--seed", type=_seed, default=_env("SEED"), help="root seed of the proxies made "
                                                                            "(default: random, logged)")
    toxiproxy.add_argument("--log", type=Path, default=_env("LOG"), help="perturbation log (default: stderr)")
    toxiproxy.add_argument("--control", type=_listen_address, default=_env("CONTROL"), metavar="HOST:PORT",
                           help="also serve chaosproxy's control API (journal, scopes, scenarios) here")
    toxiproxy.add_argument("--control-token", metavar="TOKEN", help="the control API's bearer token")
    demo_help = ("the bundled example: a REST tool API, an MCP server and a model API behind one proxy, three "
                 "scripted agents, a summary and an HTML report")
    demo = sub.add_parser("demo", help=demo_help, description=f"Run {demo_help} (a few seconds, nothing to give).")
    demo.add_argument("--log", type=Path, metavar="FILE", help="where to write the perturbation log "
                                                               "(default: a new file in the temporary folder, "
                                                               "named at the end; the HTML report goes beside it)")
    demo.add_argument("--a2a", action="store_true", help="the A2A act instead: an agent delegating to a remote "
                                                         "agent whose card drifts, whose streams drop, which asks "
                                                         "again, goes silent and fails")

    drill_command.add_arguments(sub.add_parser(
        "drill", help="run an agent against the proxy over scenarios x repetitions, clean baselines included",
        description=drill_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    drill_command.add_merge_arguments(sub.add_parser(
        "merge", help="merge the shards of one drill (drill --shard I/N) into one drill's folder"))
    report_command.add_report_arguments(sub.add_parser(
        "report", help="robustness profile and agent behaviour from a drill's folder or a log; "
                       "two drills compared; gates for CI", description=report_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter))
    report_command.add_export_arguments(sub.add_parser(
        "export", help="write a log's perturbation-annotated call sequences, e.g. as training data"))
    inspect_command.add_arguments(sub.add_parser(
        "import-inspect", help="an Inspect AI eval of a chaos task as a drill's folder (report, merge, gates)",
        description=inspect_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    cassette_command.add_replay_arguments(sub.add_parser(
        "replay", help="serve a cassette (recorded with --record, or VCR.py's) as the upstream",
        description=cassette_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter), _listen_address)
    cassette_command.add_cassette_arguments(sub.add_parser(
        "cassette", help="compare a cassette with the live upstream (drift); convert VCR.py cassettes",
        description=cassette_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter), _upstream_url)
    return parser


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"CHAOSPROXY_{name}") or default


def _env_flag(name: str) -> bool:
    """A switch set from the environment: CHAOSPROXY_<NAME>=1 (or true, yes, on)."""
    return (_env(name) or "").strip().lower() in ("1", "true", "yes", "on")


def _route(value: str) -> tuple[str, str]:
    prefix, sep, url = value.partition("=")
    try:
        if not sep:
            raise ValueError(f"expected PREFIX=URL, got {value!r}")
        check_route(prefix.strip(), url.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return prefix.strip(), url.strip()


def _positive[T: (int, float)](kind: Callable[[str], T]) -> Callable[[str], T]:
    def parse(value: str) -> T:
        try:
            number = kind(value)
        except ValueError:
            number = None
        if number is None or not number > 0 or not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {value!r}")
        return number
    return parse


def _seed(value: str) -> int:
    """--seed (or CHAOSPROXY_SEED): a whole number every part of the proxy takes as it is."""
    from chaosproxy.engine.scenario import check_seed

    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    try:
        return check_seed(seed)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_scenario_dir(parser: argparse.ArgumentParser) -> None:
    from_env = [Path(folder) for folder in (_env("SCENARIO_DIR") or "").split(os.pathsep) if folder]
    parser.add_argument("--scenario-dir", type=Path, action="append", default=from_env, dest="scenario_dirs",
                        metavar="DIR", help="a folder the files a scenario names (a paraphrase mapping:) may also "
                                            "lie in, besides the scenario's own; the only ones for a scenario "
                                            "sent over the control API (repeatable; CHAOSPROXY_SCENARIO_DIR=DIR:DIR)")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS,
                        help="as before the command: text lines or JSON objects for the proxy's own messages")
    parser.add_argument("--scenario", type=Path, default=_env("SCENARIO"), metavar="FILE",
                        help="scenario YAML (default: no faults)")
    _add_scenario_dir(parser)
    parser.add_argument("--seed", type=_seed, default=_env("SEED"), metavar="N",
                        help="root seed (default: the scenario's, else random)")
    parser.add_argument("--log", type=Path, default=_env("LOG"), metavar="FILE",
                        help="perturbation log, JSON lines (default: stderr)")
    parser.add_argument("--control", type=_listen_address, default=_env("CONTROL"), metavar="HOST:PORT",
                        help="serve the control API here (scenario swaps, live events, metrics); off by default")
    parser.add_argument("--control-token", metavar="TOKEN",
                        help="bearer token the control API requires; needed off loopback. Prefer "
                             "$CHAOSPROXY_CONTROL_TOKEN or --control-token-file: a flag shows in ps")
    parser.add_argument("--control-token-file", type=Path, default=_env("CONTROL_TOKEN_FILE"), metavar="FILE",
                        help="read the control API's bearer token from FILE (its first line)")
    parser.add_argument("--session-ttl", type=_positive(float), default=_env("SESSION_TTL", "1800"), metavar="SECONDS",
                        help="forget an agent session's state after it is idle this long (default 1800)")
    parser.add_argument("--max-sessions", type=_positive(int), default=_env("MAX_SESSIONS", "10000"), metavar="N",
                        help="hold state for at most N sessions, the least recently used going first "
                             "(default 10000)")
    parser.add_argument("--session-lines", choices=("summary", "each"), default=_env("SESSION_LINES", "summary"),
                        help="log sessions dropped idle or evicted in a line per reason every 10 s (summary, the "
                             "default) or a line each")
    parser.add_argument("--watch", action="store_true", default=_env_flag("WATCH"),
                        help="reload the scenario file when it changes (SIGHUP always reloads it)")
    parser.add_argument("--otel", action="store_true", default=_env_flag("OTEL"),
                        help="export a span per call over OTLP/HTTP (on by itself when "
                             "OTEL_EXPORTER_OTLP_ENDPOINT is set; default endpoint http://localhost:4318)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_operational_log(args.verbose, args.log_format)
    match args.command:
        case "run":
            return _run(args)
        case "stdio":
            return _stdio(args)
        case "mitm":
            return _mitm(args)
        case "validate":
            return _validate(args.files, args.scenario_dirs)
        case "faults":
            return _print_to_pipe(faults_table())
        case "schema":
            from chaosproxy.engine.editor_schema import scenario_schema
            return _print_to_pipe(json.dumps(scenario_schema(suite=args.suite), indent=2))
        case "toxiproxy":
            from chaosproxy.control.toxiproxy import main as toxiproxy_main
            return toxiproxy_main(args)
        case "demo" if args.a2a:
            from chaosproxy.demo.a2a_story import run_a2a_demo
            return run_a2a_demo(args.log)
        case "demo":
            from chaosproxy.demo import run_demo
            return run_demo(args.log)
        case command if command in ELSEWHERE:
            return ELSEWHERE[command](args)
    return EXIT_INVALID


# The commands whose bodies live in their own packages, by name.
ELSEWHERE: dict[str, Callable[[argparse.Namespace], int]] = {
    "drill": drill_command.main, "merge": drill_command.merge_main, "report": report_command.report_main,
    "export": report_command.export_main, "import-inspect": inspect_command.main,
    "replay": cassette_command.replay_main, "cassette": cassette_command.cassette_main,
}


def _run(args: argparse.Namespace) -> int:
    from chaosproxy.adapters.h1 import ClientLimits
    from chaosproxy.adapters.http import HttpProxy

    try:
        scenario = load_scenario(args.scenario, args.scenario_dirs) if args.scenario else Scenario()
        replayed = cassette_command.replayed_upstream(args)
        from_env = [_route(r) for r in (_env("ROUTES") or "").split(",") if r.strip()] if not args.routes else []
        routes = _routes(scenario.routes, args.routes or from_env, replayed.url if replayed else args.upstream)
        recorder = cassette_command.http_recorder(args, list(routes.values()))
    except (ScenarioError, ValueError, argparse.ArgumentTypeError) as exc:
        print(exc if isinstance(exc, ScenarioError) else f"chaosproxy: {exc}", file=sys.stderr)
        return EXIT_INVALID
    targets = ", ".join(f"{prefix} {redacted_url(url)}" for prefix, url in routes.items())
    limits = ClientLimits(max_line=args.max_header_line, max_head=args.max_head,
                          head_timeout=args.client_header_timeout, idle_timeout=args.keepalive_timeout)

    def make_proxy(engine: Any) -> Any:
        return HttpProxy(engine, routes, upstream_timeout=args.upstream_timeout,
                         max_message_bytes=int(args.max_message_mib * (1 << 20)), limits=limits, recorder=recorder)
    try:
        return _serve(args, scenario, replayed.fronted(make_proxy) if replayed else make_proxy,
                      lambda host, port: f"listening on http://{host}:{port} -> {targets}")
    finally:
        if recorder is not None:
            recorder.close()


def _serve(args: argparse.Namespace, scenario: Scenario, make_proxy: Callable[[Any], Any],
           describe: Callable[[str, int], str]) -> int:
    """Run a listening proxy (run, mitm) with the control API and reloading until SIGINT/SIGTERM."""
    from chaosproxy.control.runtime import (
        open_engine,
        raise_open_files_limit,
        run_async,
        settle_heap,
        wait_for_stop_signal,
    )

    host, port = args.listen
    open_files = raise_open_files_limit()  # each relayed stream holds two
    try:
        with open_engine(args.scenario, scenario=scenario, seed=args.seed, log_path=args.log,
                         session_ttl=args.session_ttl, max_sessions=args.max_sessions,
                         each_session=args.session_lines == "each", otel=args.otel) as engine:
            async def serve() -> None:
                async with _controlled(engine, args) as control:
                    proxy = make_proxy(engine)
                    if control is not None:
                        control.attach(proxy)  # its scopes
                    try:
                        bound = await proxy.start(host, port)
                        ops.info("%s (seed %d, %d rules, %s open files)", describe(host, bound), engine.seed,
                                 len(engine.scenario.rules), open_files or "unlimited")
                        settle_heap()
                        await wait_for_stop_signal()
                    finally:
                        ops.info("stopping")
                        await proxy.stop()
            try:
                run_async(serve())
            except (ConfigError, OSError) as exc:  # the log's run line must not read as a run
                engine.log.error(error=f"did not start: {exc.strerror if isinstance(exc, OSError) else exc}")
                raise
    except ConfigError as exc:
        print(_said(exc), file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"chaosproxy {args.command}: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


@contextlib.asynccontextmanager
async def _controlled(engine: Any, args: argparse.Namespace) -> AsyncIterator[Any]:
    """The control API (--control; yielded, or None), the Toxiproxy API (run --toxiproxy-api), scenario
    reloading (SIGHUP, --watch) and the log's periodic flush, as every proxy command has them."""
    from chaosproxy.control.reload import reloading

    roots = [*([args.scenario.parent] if args.scenario else []), *args.scenario_dirs]
    control: contextlib.AbstractAsyncContextManager[Any] = contextlib.nullcontext()
    toxiproxy = getattr(args, "toxiproxy_api", None)
    if args.control is not None or toxiproxy is not None:  # (aiohttp's server, prometheus: loaded when asked for)
        from chaosproxy.control.toxiproxy import serve_apis
        control = serve_apis(engine, args.control, _control_token(args), file_roots=roots, toxiproxy=toxiproxy,
                             scope_header=getattr(args, "scope_header", "X-Chaosproxy-Scope"))
    flusher = asyncio.create_task(engine.log.flush_periodically())
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, engine.log.reopen)  # logrotate: the log file again, by name
    try:
        async with control as server, reloading(engine, args.scenario, watch=args.watch,
                                                scenario_dirs=args.scenario_dirs):
            yield server
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        flusher.cancel()


def _said(problem: ConfigError) -> str:
    """A ConfigError as the command line says it: a scenario's FILE:LINE problems as they are."""
    return str(problem) if isinstance(problem, ScenarioError) else f"chaosproxy: {problem}"


def _control_token(args: argparse.Namespace) -> str | None:
    """--control-token, else the first line of --control-token-file (else serve_control reads the environment)."""
    from chaosproxy.control.api import ControlConfigError

    if args.control_token or args.control_token_file is None:
        return args.control_token
    try:
        token = args.control_token_file.read_text(encoding="utf-8").partition("\n")[0].strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ControlConfigError(f"--control-token-file {args.control_token_file}: cannot read it: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise ControlConfigError(f"--control-token-file {args.control_token_file} is empty")
    return token


def _routes(in_scenario: dict[str, str], flags: list[tuple[str, str]], upstream: str | None) -> dict[str, str]:
    """All routes, from the scenario, --route flags and --upstream (as /); a prefix given twice is an error."""
    routes = dict(in_scenario)
    for prefix, url in [*flags, *([("/", upstream)] if upstream else [])]:
        if prefix in routes:
            raise ValueError(f"two routes for the prefix {prefix}: {routes[prefix]} and {url}")
        routes[prefix] = url
    if not routes:
        raise ValueError("nowhere to forward to: give --upstream URL or --route PREFIX=URL "
                         "(or routes: in the scenario)")
    return routes


def _stdio(args: argparse.Namespace) -> int:
    from chaosproxy.adapters.stdio import SpawnError, StdioRelay, claim_stdio, spawn
    from chaosproxy.control.runtime import open_engine, run_async

    command = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not command:
        print("chaosproxy stdio: give the server command after --, e.g.\n"
              "  chaosproxy stdio -- npx -y @modelcontextprotocol/server-everything", file=sys.stderr)
        return EXIT_INVALID
    recorder = None
    try:
        recorder = cassette_command.stdio_recorder(args, command)
        with open_engine(args.scenario, seed=args.seed, log_path=args.log, otel=args.otel,
                         scenario_dirs=args.scenario_dirs, session_ttl=args.session_ttl,
                         max_sessions=args.max_sessions) as engine:
            agent_in, agent_out = claim_stdio()

            async def relay() -> int:
                async with _controlled(engine, args):
                    server = spawn(command)  # inside: a refused control setting leaves no child behind
                    ops.info("stdio: relaying to %s (pid %d, seed %d, %d rules)", command[0], server.pid,
                             engine.seed, len(engine.scenario.rules))
                    return await StdioRelay(engine, server, recorder=recorder).run(agent_in, agent_out)
            return run_async(relay())
    except ConfigError as exc:
        print(_said(exc), file=sys.stderr)
        return EXIT_INVALID
    except SpawnError as exc:
        print(exc, file=sys.stderr)
        return exc.status
    except OSError as exc:
        print(f"chaosproxy stdio: {exc}", file=sys.stderr)
        return 1
    finally:
        if recorder is not None:
            recorder.close()


def _mitm(args: argparse.Namespace) -> int:
    try:
        from chaosproxy.adapters.mitm import CA_CERT, ConfdirError, HostPatterns, MitmProxy, ca_directory
    except ImportError as exc:
        print(f"chaosproxy mitm needs mitmproxy ({exc}): pip install 'chaosproxy[mitm]'", file=sys.stderr)
        return 1
    try:
        hosts = HostPatterns.parse(args.hosts)
        if args.upstream_ca is not None and not args.upstream_ca.is_file():
            raise ValueError(f"--upstream-ca {args.upstream_ca}: no such file")
        scenario = load_scenario(args.scenario, args.scenario_dirs) if args.scenario else Scenario()
        confdir = ca_directory(args.confdir)
    except (ScenarioError, ConfdirError, ValueError) as exc:
        print(f"chaosproxy mitm: {exc}" if not isinstance(exc, ScenarioError) else exc, file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"chaosproxy mitm: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return _serve(args, scenario,
                  lambda engine: MitmProxy(engine, hosts, confdir=confdir, upstream_ca=args.upstream_ca),
                  lambda host, port: f"mitm: proxy on {host}:{port} intercepting {hosts}; "
                                     f"the agent trusts {confdir / CA_CERT}")


def _validate(files: list[str], scenario_dirs: list[Path]) -> int:
    """Scenarios, and drill suites (files with `!range`/`!choice` draws or a `pick:` count)."""
    from chaosproxy.drill.suite import load_suite

    status = 0
    for name in files:
        try:
            if _is_suite(Path(name)):
                suite = load_suite(name)
                print(f"{name}: ok (suite, {len(suite.rules)} rule templates)")
            else:
                scenario = load_scenario(name, scenario_dirs)
                print(f"{name}: ok ({len(scenario.rules)} rules)")
                for warning in order_warnings(scenario, read_text(Path(name)), name):
                    print(warning, file=sys.stderr)
        except ScenarioError as exc:
            print(exc, file=sys.stderr)
            status = EXIT_INVALID
    return status


def _is_suite(path: Path) -> bool:
    from chaosproxy.engine.named_files import read_capped

    try:
        text = read_capped(path)
    except ValueError:
        return False  # load_scenario reports it
    return re.search(r"!range\b|!choice\b|^pick\s*:", text, re.MULTILINE) is not None


def _print_to_pipe(text: str) -> int:
    """Print for a reader that may stop early (`chaosproxy faults | head`): no BrokenPipeError traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush then writes nowhere
    return 0


FAULTS_WIDTH = 100  # `chaosproxy faults` lines: a terminal's width, not a table's


def faults_table() -> str:
    """Each fault type: a line with its component and level, its summary, then its parameters with their
    defaults (`name` alone: required), wrapped to FAULTS_WIDTH."""
    import textwrap

    from chaosproxy.faults import REGISTRY

    blocks = []
    for name, fault in sorted(REGISTRY.items()):
        params = ", ".join(
            key if info.is_required() else f"{key}={_show(info.get_default(call_default_factory=True))}"
            for key, info in fault.model_fields.items() if key != "type"
        )
        lines = [f"{name}  ({fault.component}, {fault.level})",
                 *textwrap.wrap(fault.summary(), FAULTS_WIDTH, initial_indent="  ", subsequent_indent="  "),
                 *textwrap.wrap(f"parameters: {params or '(none)'}", FAULTS_WIDTH, initial_indent="  ",
                                subsequent_indent="    ", break_on_hyphens=False)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _show(value: object) -> str:
    return "none" if value is None else str(value)
