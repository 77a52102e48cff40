"""A small offline agent benchmark in Inspect AI, under the RobustBench-TC suite: the per-component table.

Tasks over the bundled MCP server (weather, add, search), each solved by one tool call; two scripted
policies as Inspect's `mockllm` model (no network, no tokens counted: they set their own usage):
`naive` answers from the first tool result it gets, `retrying` calls again after a tool error, up to
three tries. Every sample-epoch meets what the plan draws for it (a fifth clean), so both policies
meet the same faults sample by sample.

  python examples/inspect_benchmark.py                       # both policies, MCP over HTTP
  python examples/inspect_benchmark.py --transport stdio --epochs 2 --samples 6
  python examples/inspect_benchmark.py --suite scenarios/suites/transient.yaml   # faults a retry rides out
  python examples/inspect_benchmark.py --model openai/gpt-4o-mini   # a real model (needs its API key)

Each eval's log is imported as a drill folder (OUT/<policy>), so `chaosproxy report OUT/naive` and
`chaosproxy report OUT/naive OUT/retrying` show the same numbers with their intervals.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    ChatMessageUser,
    GenerateConfig,
    Model,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, system_message, use_tools
from inspect_ai.tool import ToolInfo

from chaosproxy.harness import ChaosPlan, chaos_task, mcp_server_http, mcp_server_stdio

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "scenarios" / "suites" / "robustbench-tc.yaml"
# (prompt, target): each prompt names the call a model should make, so the scripted policies can read it.
PROBLEMS = [
    *[(f"What is the temperature in {city.title()} in degrees C? call weather(city={city})", str(temp))
      for city, temp in (("paris", 14), ("tokyo", 19), ("lima", 22), ("oslo", 3))],
    *[(f"What is {a} plus {b}? call add(a={a}, b={b})", str(float(a + b))) for a, b in ((2, 3), (40, 2), (7, 8))],
    *[(f"Find pages about {topic}. call search(query={topic}, limit=1)", f"{topic} result 1")
      for topic in ("retry budgets", "circuit breakers", "backoff")],
]
SYSTEM = "Answer with one tool call, then give the result you got. Use the tools; never guess."
USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
_CALL = re.compile(r"call (\w+)\((.*)\)")


def dataset(samples: int) -> list[Sample]:
    """The first `samples` problems (cycling through them), numbered 1, 2, ... as Inspect numbers them."""
    return [Sample(input=PROBLEMS[i % len(PROBLEMS)][0], target=PROBLEMS[i % len(PROBLEMS)][1], id=i + 1)
            for i in range(samples)]


def _arguments(text: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for part in filter(None, (item.strip() for item in text.split(","))):
        key, _, value = part.partition("=")
        arguments[key.strip()] = float(value) if re.fullmatch(r"-?\d+(\.\d+)?", value.strip()) else value.strip()
    return arguments


def _choose(name: str, tools: list[ToolInfo]) -> str | None:
    """The tool a literal-minded model would pick: the name itself (the last listed, as MCP clients keep
    the last of a duplicated name), else a listed name that contains it (a renamed `weather_v2`)."""
    exact = [tool.name for tool in tools if tool.name == name]
    if exact:
        return exact[-1]
    return next((tool.name for tool in tools if name in tool.name), None)


def _say(text: str) -> ModelOutput:
    output = ModelOutput.from_content("mockllm/model", text)
    output.usage = USAGE
    return output


def scripted(tries: int) -> Callable[[list[ChatMessage], list[ToolInfo], Any, GenerateConfig], ModelOutput]:
    """A policy that makes the prompt's call, answers with the first result that is not a tool error,
    and calls again after an error until it has made `tries` calls (1: the naive policy)."""
    def policy(messages: list[ChatMessage], tools: list[ToolInfo], tool_choice: Any,
               config: GenerateConfig) -> ModelOutput:
        prompt = next(m.text for m in messages if isinstance(m, ChatMessageUser))
        results = [m for m in messages if isinstance(m, ChatMessageTool)]
        if results and results[-1].error is None:
            return _say(results[-1].text)
        if len(results) >= tries:
            return _say("I could not get an answer from the tools.")
        found = _CALL.search(prompt)
        tool = _choose(found.group(1), tools) if found else None
        if found is None or tool is None:
            return _say("No tool fits this question.")
        output = ModelOutput.for_tool_call("mockllm/model", tool, _arguments(found.group(2)))
        output.usage = USAGE
        return output
    return policy


POLICIES = {"naive": 1, "retrying": 3}


def benchmark_task(plan: ChaosPlan, *, url: str | None = None, samples: int = len(PROBLEMS), epochs: int = 5) -> Task:
    """The benchmark as a chaos task: MCP over HTTP at `url`, else the bundled server over stdio."""
    server = (mcp_server_http(url=url) if url is not None else
              mcp_server_stdio(command=sys.executable, args=["-m", "chaosproxy.demo.mcp_server", "stdio"]))
    return chaos_task(Task(dataset=dataset(samples), solver=[system_message(SYSTEM), use_tools(server), generate()],
                           scorer=includes(), epochs=epochs, name="tool_robustness"), plan)


def policy_model(name: str) -> Model:
    return get_model("mockllm/model", custom_outputs=scripted(POLICIES[name]), memoize=False)


def serve_mcp_http() -> tuple[subprocess.Popen[bytes], str]:
    """The bundled MCP server over streamable HTTP on a free loopback port, once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "chaosproxy.demo.mcp_server", "http", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("the bundled MCP server did not start")


def component_table(folders: dict[str, Path]) -> str:
    """The per-component table, one column group per policy, from the imported drill folders."""
    from chaosproxy.records.drill_folder import read_drill
    from chaosproxy.report.fmt import drop_text, rate_text
    from chaosproxy.report.profile import build_profile

    profiles = {name: build_profile(read_drill(folder).results) for name, folder in folders.items()}
    header = "| component | " + " | ".join(f"{name}: faulted | {name}: drop" for name in profiles) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(profiles))]
    lines.append("| clean | " + " | ".join(f"{rate_text(p.overall.clean)} | " for p in profiles.values()) + " |")
    names = [row.name for row in next(iter(profiles.values())).by_component]
    for name in [*names, "any fault"]:
        cells = []
        for profile in profiles.values():
            row = profile.overall if name == "any fault" else next(r for r in profile.by_component if r.name == name)
            cells += [rate_text(row.perturbed), drop_text(row)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", choices=["http", "stdio"], default="http")
    parser.add_argument("--samples", type=int, default=len(PROBLEMS))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--suite", type=Path, default=SUITE, help="the suite drawn from (default RobustBench-TC)")
    parser.add_argument("--model", help="a real model instead of the scripted policies (e.g. openai/gpt-4o-mini)")
    parser.add_argument("--out", type=Path, default=Path("inspect-benchmark"))
    args = parser.parse_args()
    from chaosproxy.harness.importer import import_eval

    server, url = serve_mcp_http() if args.transport == "http" else (None, None)
    folders: dict[str, Path] = {}
    try:
        models = {args.model: get_model(args.model)} if args.model else {name: policy_model(name) for name in POLICIES}
        for name, model in models.items():
            plan = ChaosPlan(suite=args.suite, baseline=0.2, seed=args.seed, log_dir=args.out / "proxy-logs" / name)
            [log] = eval(benchmark_task(plan, url=url, samples=args.samples, epochs=args.epochs), model=model,
                         log_dir=str(args.out / "inspect-logs"), display="none", max_samples=8)
            folders[name.replace("/", "-")] = args.out / name.replace("/", "-")
            import_eval(Path(log.location), folders[name.replace("/", "-")])
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    print(component_table(folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
