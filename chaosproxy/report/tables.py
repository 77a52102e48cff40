"""The report's tables as plain text cells, shared by the Markdown and the HTML renderers."""

from __future__ import annotations

from chaosproxy import __version__
from chaosproxy.report.behaviour import Behaviour, Recovery
from chaosproxy.report.build import Report
from chaosproxy.report.fmt import drop_text, ms_text, rate_text, share
from chaosproxy.report.profile import Profile, ProfileRow

Table = tuple[list[str], list[list[str]]]

PROFILE_NOTE = ("Success rate of clean baseline runs against runs where a fault of the kind fired, with 95% "
                "Wilson intervals; the drop (clean minus perturbed) in percentage points with Newcombe's "
                "interval. A drop whose interval stays above 0 is a real weakness at this sample size.")


CONFIGURATION_NOTE = ("Per configuration of the drill (clean, a scenario file, a sample): the success rate of its "
                      "runs (runs the drill's machinery failed, status error, count for nothing), how its runs "
                      "ended, and the faults that fired in them (fault lines, summed over its runs).")
RECOVERY_NOTE = "The incidents above by the POMDP component of the fault that disrupted the call."
FAULTS_NOTE = "Fault lines in the log by fault type: every time a fault fired, whatever call it hit."


def heading(report: Report) -> str:
    """Where the numbers come from."""
    text = f"{report.source} · generated {report.generated} · chaosproxy {__version__}"
    if (drill := report.drill) is not None:
        text += (f" · a drill of {drill.get('runs')} runs with root seed {drill.get('seed')}, "
                 f"agent: {drill.get('config', {}).get('agent')}")
    return text


def profile_table(rows: list[ProfileRow], first: str) -> Table:
    return [first, "clean", "perturbed", "drop"], [
        [row.name, rate_text(row.clean), rate_text(row.perturbed), drop_text(row)] for row in rows]


def configuration_table(profile: Profile) -> Table:
    return ["scenario", "kind", "success", "runs", "faults fired"], [
        [c.label, c.kind, rate_text(c.rate), ", ".join(f"{n} {s}" for s, n in c.statuses.items()),
         ", ".join(f"{name} ×{n}" for name, n in c.faults.items()) or "none"]
        for c in profile.by_configuration]


def profile_notes(profile: Profile) -> str:
    notes = []
    if profile.unexposed:
        notes.append(f"{profile.unexposed} run(s) of a faulty scenario saw no fault fire: neither clean nor "
                     "perturbed, they count in no row but their scenario's.")
    if profile.errors:
        notes.append(f"{profile.errors} run(s) failed in the drill's own machinery (status error) and count "
                     "for nothing; see their folders.")
    return " ".join(notes)


def _recovery_rows(recovery: Recovery) -> list[list[str]]:
    n = recovery.incidents
    recovered = ("n/a" if recovery.recovered is None else share(recovery.recovered, recovery.judged))
    return [
        ["incidents", str(n), "tool calls (and model-API calls) a fault disrupted"],
        ["retried", share(recovery.retried, n),
         "incidents the agent answered by making the same call again as its very next one (a tool it "
         "also repeats after calls that got through is its routine, not a retry; a model-API call: the "
         "same turn again)"],
        ["got through on a retry", share(recovery.got_through, n),
         "incidents where one of those repeats was answered undisrupted"],
        ["time to get through, median (max)",
         f"{ms_text(recovery.median_time_to_get_through_ms)} ({ms_text(recovery.max_time_to_get_through_ms)})",
         "from the end of the disrupted call to the end of the repeat that got through"],
        ["recovered", recovered,
         "incidents whose run reached its goal (a drill's verdict: passed) after the fault; n/a for a log "
         "alone, which holds no verdict"
         + (f" (out of {recovery.judged} incidents in runs with a verdict)" if 0 < recovery.judged != n else "")]]


def behaviour_table(b: Behaviour) -> Table:
    return ["agent behaviour", "", "what it counts"], [
        ["sessions", str(b.sessions), "MCP sessions, and agent addresses for plain HTTP"],
        ["tool calls", str(b.tool_calls),
         "MCP tools/call requests and plain HTTP (REST) requests; not MCP's own messages (initialize, "
         "tools/list, its GET streams)"],
        ["calls a fault changed", share(b.perturbed_calls, b.tool_calls),
         "tool calls at least one fault fired on (delayed, perturbed, or replaced)"],
        ["calls a fault disrupted", share(b.disrupted_calls, b.tool_calls),
         "tool calls where a fault kept the real answer from the agent (an error or stand-in, a broken "
         "exchange, no answer), or made the call fail (a request it changed, an answer it held up)"],
        ["calls failed by the upstream", share(b.failed_upstream_calls, b.tool_calls),
         "tool calls that failed (an error status, a broken exchange) with no fault to blame: the "
         "upstream's own errors, such as a 404"],
        *([["model-API calls", str(b.model_calls), "turns of the agent's loop to its model API (LLM-gateway mode)"],
           ["model-API calls a fault disrupted", share(b.disrupted_model_calls, b.model_calls),
            "as for tool calls"],
           ["model-API calls failed by the upstream", share(b.failed_upstream_model_calls, b.model_calls),
            "as for tool calls"]] if b.model_calls else []),
        *_recovery_rows(b.recovery),
        ["calls to a tool that does not exist", str(b.made_up_tool_calls),
         "calls of a name an unknown_tool fault misspelt, or of a made-up tool (tool_flood, distractor_tool)"],
        ["calls that never completed", str(b.incomplete_calls),
         "tool calls the agent got no answer to: a hang, a silent stream, or it gave up waiting"],
        *([["faults attached to no call", str(b.unattached_faults),
            "faults that fired on a reply no call line claims (a stream that never ended)"]]
          if b.unattached_faults else [])]


def recovery_table(b: Behaviour) -> Table:
    return ["component", "incidents", "retried", "got through on a retry", "recovered",
            "median time to get through"], [
        [name, str(r.incidents), share(r.retried, r.incidents), share(r.got_through, r.incidents),
         "n/a" if r.recovered is None else share(r.recovered, r.judged), ms_text(r.median_time_to_get_through_ms)]
        for name, r in b.recovery_by_component.items()]


def faults_table(b: Behaviour) -> Table:
    return ["fault", "fired"], [[name, str(n)] for name, n in b.faults_by_type.items()]
