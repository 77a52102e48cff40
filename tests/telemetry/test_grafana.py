"""The example Grafana dashboard: valid JSON whose every PromQL metric and label a running proxy serves."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from chaosproxy.embedded import EmbeddedProxy

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana-dashboard.json"
METRIC = re.compile(r"\b(chaosproxy_[a-z_]+)\b")
GROUPING = re.compile(r"\bby \(([^)]*)\)\s*\((.*?)\b(chaosproxy_[a-z_]+)")  # sum by (L) (...metric
SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus when it scrapes
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",)}


def served_metrics(upstream: str) -> dict[str, set[str]]:
    """Sample names a running proxy's GET /metrics serves (after some calls and faults), with their labels."""
    scenario = {"rules": [{"name": "weather-down", "match": {"path": "/api/weather"},
                           "fault": {"type": "http_error", "status": 503}}]}
    with EmbeddedProxy(upstream, scenario) as proxy:
        for path in ("/api/weather?city=oslo", "/health"):
            try:
                urllib.request.urlopen(proxy.url + path, timeout=10).read()
            except urllib.error.HTTPError as exc:
                assert exc.code == 503
        text = urllib.request.urlopen(proxy.control_url + "/metrics", timeout=10).read().decode()
    served: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):  # a family with no samples yet still names them
            served.setdefault(family.name + suffix, set())
        for sample in family.samples:
            served.setdefault(sample.name, set()).update(sample.labels)
    return served


def test_the_dashboard_is_valid_and_asks_only_for_metrics_the_proxy_serves(upstream: str):
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    assert {"datasource", "job"} <= {variable["name"] for variable in dashboard["templating"]["list"]}
    titles = " ".join(panel["title"] for panel in panels)
    for topic in ("component", "type", "rule", "Calls", "latency", "Active sessions"):
        assert topic in titles
    served = served_metrics(upstream)
    expressions = [target["expr"] for panel in panels for target in panel["targets"]]
    assert expressions and all(panel["targets"] and panel["datasource"]["uid"] == "${datasource}" for panel in panels)
    groupings = 0
    for expr in expressions:
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        names = METRIC.findall(expr)
        assert names, expr
        for name in names:
            assert name in served, f"{name} (in {expr}) is not in /metrics: {sorted(served)}"
        for labels, _, name in GROUPING.findall(expr):
            if not served[name]:
                continue  # no samples yet (no fault has raised): its labels cannot be seen
            groupings += 1
            wanted = {label.strip() for label in labels.split(",")} - SCRAPE_LABELS - {"le"}
            assert wanted <= served[name], f"{expr}: {name} has labels {served[name]}"
    assert groupings >= 8  # faults by component, type and rule; calls by outcome, status; latency...
    # the metrics a dashboard needs most have samples after traffic, so their labels were checked
    for name in ("chaosproxy_faults_total", "chaosproxy_calls_total", "chaosproxy_call_duration_seconds_bucket"):
        assert served[name], name
