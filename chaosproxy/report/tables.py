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
    return [["incidents (a tool or model-API call disrupted by a fault)", str(n)],
            ["retried (the same tool or model called again)", share(recovery.retried, n)],
            ["recovered (a later call of it got through)", share(recovery.recovered, n)],
            ["gave up (never got it through)", share(recovery.gave_up, n)],
            ["time to recovery, median (max)",
             f"{ms_text(recovery.median_time_to_recovery_ms)} ({ms_text(recovery.max_time_to_recovery_ms)})"]]


def behaviour_table(b: Behaviour) -> Table:
    return ["agent behaviour", ""], [
        ["sessions", str(b.sessions)], ["tool calls", str(b.tool_calls)],
        ["disrupted calls", share(b.disrupted_calls, b.tool_calls)],
        *([["model-API calls (LLM-gateway mode)", str(b.model_calls)],
           ["disrupted model-API calls", share(b.disrupted_model_calls, b.model_calls)]] if b.model_calls else []),
        *_recovery_rows(b.recovery),
        ["calls to a tool that does not exist", str(b.made_up_tool_calls)],
        ["calls that never completed", str(b.incomplete_calls)],
        *([["faults attached to no call", str(b.unattached_faults)]] if b.unattached_faults else [])]


def recovery_table(b: Behaviour) -> Table:
    return ["component", "incidents", "retried", "recovered", "gave up", "median time to recovery"], [
        [name, str(r.incidents), share(r.retried, r.incidents), share(r.recovered, r.incidents),
         share(r.gave_up, r.incidents), ms_text(r.median_time_to_recovery_ms)]
        for name, r in b.recovery_by_component.items()]


def faults_table(b: Behaviour) -> Table:
    return ["fault", "fired"], [[name, str(n)] for name, n in b.faults_by_type.items()]
