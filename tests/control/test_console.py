"""The live console on the control port, in a real headless Chromium, and what other origins cannot do.

The console page talks to the control API with a per-process token it is given; a page from any
other origin, a non-loopback Host or a cross-site form gets nothing read and nothing changed.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from chaosproxy.control.api import CONSOLE_HEADER, ControlServer
from tests.helpers.browser import Tab, open_tab
from tests.helpers.support import RunningProxy, ServerLoop, http_exchange

BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/126.0 Safari/537.36"
SCENARIO = {"rules": [
    {"name": "weather-down", "match": {"path": "/api/weather"}, "fault": {"type": "http_error", "status": 503}},
    {"name": "slow-echo", "match": {"path": "/echo/*"}, "probability": 0.5,
     "fault": {"type": "latency", "delay_ms": 5}},
]}
SCREENSHOT_ENV = "CHAOSPROXY_CONSOLE_SCREENSHOT"  # where to keep the README's screenshot, when set


class Console:
    def __init__(self, proxy: RunningProxy, server: ControlServer, port: int) -> None:
        self.proxy = proxy
        self.server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, bytes]:
        return http_exchange(f"127.0.0.1:{self.port}", method, path, headers=headers, body=body)

    def rule(self, name: str) -> Any:
        return next(rule for rule in self.proxy.engine.scenario.rules if rule.name == name)


@pytest.fixture
def console(make_proxy: Any, server_loop: ServerLoop) -> Iterator[Any]:
    servers: list[ControlServer] = []

    def start(token: str | None = None) -> Console:
        proxy = make_proxy(SCENARIO)
        server = ControlServer(proxy.engine, token=token)
        port = server_loop.run(server.start("127.0.0.1", 0))
        servers.append(server)
        return Console(proxy, server, port)

    yield start
    for server in servers:
        server_loop.run(server.stop())


PICTURE = {"rules": [
    {"name": "weather-down", "match": {"path": "/api/weather"}, "every": 2,
     "fault": {"type": "http_error", "status": 503}},
    {"name": "search-typos", "match": {"path": "/api/search"}, "fault": {"type": "typos", "rate": 0.1}},
    {"name": "slow-echo", "match": {"path": "/echo/*"}, "fault": {"type": "latency", "delay_ms": 20}},
]}


def search(url: str, query: str) -> int:
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    try:
        conn.request("POST", "/api/search", body=json.dumps({"query": query}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def call(url: str, path: str) -> int:
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


ROWS = "[...document.querySelectorAll('#rules tr')].map(r => r.dataset.rule)"
FEED = "[...document.querySelectorAll('#feed div[data-rule]')].map(d => d.dataset.rule)"


async def test_the_console_shows_rules_and_faults_and_changes_rules(console: Any, tmp_path: Path):
    ctl = console()
    assert call(ctl.proxy.url, "/api/weather?city=oslo") == 503  # fired before the page opens: replayed
    async with open_tab(ctl.url) as tab:
        assert await tab.wait_for(f"{ROWS}.length == 2 && {ROWS}") == ["weather-down", "slow-echo"]
        assert await tab.wait_for(f"{FEED}.length == 1 && {FEED}") == ["weather-down"]
        assert await tab.evaluate("document.getElementById('seed').textContent") == "7"
        assert await tab.evaluate("document.getElementById('run-id').textContent") == "test"

        # a fault fires through the proxy and shows up in the live feed, and in the rule's counts
        assert call(ctl.proxy.url, "/api/weather?city=lima") == 503
        await tab.wait_for(f"{FEED}.length == 2")
        fired = "document.querySelector('tr[data-rule=\"weather-down\"] .fired').textContent"
        assert await tab.wait_for(f"{fired} == '2' && {fired}") == "2"
        line = await tab.evaluate("document.querySelector('#feed div[data-rule]').textContent")
        assert "http_error" in line and "status=503" in line

        # the filters: by component, by rule
        await tab.evaluate("(() => { const s = document.getElementById('filter-component'); s.value = 'observation';"
                           " s.dispatchEvent(new Event('change')); })()")
        assert await tab.evaluate(f"{FEED}.length") == 0
        await tab.evaluate("(() => { const s = document.getElementById('filter-component'); s.value = 'transition';"
                           " s.dispatchEvent(new Event('change')); })()")
        assert await tab.evaluate(f"{FEED}.length") == 2

        # the switch turns the rule off: traffic passes
        await tab.evaluate("document.querySelector('input[type=checkbox][data-rule=\"weather-down\"]').click()")
        await tab.wait_for("document.querySelector('tr[data-rule=\"weather-down\"]').classList.contains('disabled')")
        assert ctl.rule("weather-down").enabled is False
        assert call(ctl.proxy.url, "/api/weather?city=oslo") == 200

        # the probability field
        await tab.evaluate("(() => { const p = document.querySelector('input.prob[data-rule=\"slow-echo\"]');"
                           " p.value = '0.2'; p.dispatchEvent(new Event('change')); })()")
        await tab.wait_for("document.querySelector('tr[data-rule=\"slow-echo\"]') !== null")
        for _ in range(50):
            if ctl.rule("slow-echo").probability == 0.2:
                break
            await tab.evaluate("new Promise(r => setTimeout(r, 100))")
        assert ctl.rule("slow-echo").probability == 0.2

        # calls and faults per second, and active sessions
        await tab.wait_for("document.getElementById('calls').textContent == '3'")
        assert await tab.evaluate("document.getElementById('sessions').textContent") == "1"
        assert re.fullmatch(r"\d+\.\d", await tab.wait_for(
            "/\\d/.test(document.getElementById('calls-rate').textContent) && "
            "document.getElementById('calls-rate').textContent"))

        # the editor: a bad scenario is refused with FILE:LINE inline, nothing changes; a good one goes in
        await edit(tab, "rules:\n  - name: slow\n    fault: {type: latency, delay_ms: -5}\n")
        problems = await tab.wait_for("[...document.querySelectorAll('#problems li')].map(li => li.textContent)")
        assert problems == ["scenario.yaml:3: rules[0].fault.delay_ms: Input should be greater than or equal to 0"]
        assert await tab.evaluate("[...document.querySelectorAll('#gutter .bad')].map(s => s.textContent)") == ["3"]
        assert await tab.evaluate("document.getElementById('swap').disabled") is True
        await edit(tab, "rules:\n  - name: slow\n    fault: {type: latency, delay_ms: 5}\n")
        await tab.wait_for("!document.getElementById('swap').disabled")
        assert [rule.name for rule in ctl.proxy.engine.scenario.rules] == ["weather-down", "slow-echo"]
        await tab.evaluate("document.getElementById('swap').click()")
        assert await tab.wait_for(f"{ROWS}.length == 1 && {ROWS}") == ["slow"]
        assert [rule.name for rule in ctl.proxy.engine.scenario.rules] == ["slow"]

        # a richer scenario for the picture, with faults of two components in the feed
        await edit(tab, yaml.safe_dump(PICTURE, sort_keys=False))
        await tab.wait_for("!document.getElementById('swap').disabled")
        await tab.evaluate("document.getElementById('swap').click()")
        await tab.wait_for(f"{ROWS}.length == 3")
        await tab.evaluate("(() => { const s = document.getElementById('filter-component'); s.value = '';"
                           " s.dispatchEvent(new Event('change')); })()")
        for n in range(4):
            call(ctl.proxy.url, f"/api/weather?city={['paris', 'tokyo', 'lima', 'oslo'][n]}")
            call(ctl.proxy.url, f"/echo/{n}")
            search(ctl.proxy.url, ["chaos engineering", "agent retries", "mcp tools", "trace context"][n])
        await tab.wait_for(f"{FEED}.length >= 8")
        await tab.evaluate("new Promise(r => setTimeout(r, 1200))")  # a rate over a full second
        shot = tmp_path / "console.png"
        await tab.screenshot(shot, height=1000)
        assert shot.stat().st_size > 10_000
        if os.environ.get(SCREENSHOT_ENV):
            shutil.copy(shot, os.environ[SCREENSHOT_ENV])
        assert tab.problems == []
        assert await tab.evaluate("performance.getEntriesByType('resource').map(e => e.name)"
                                  ".filter(n => !n.startsWith(location.origin))") == []


async def edit(tab: Tab, text: str) -> None:
    """Type `text` into the scenario editor (as an input event, as typing gives)."""
    await tab.evaluate(f"(() => {{ const e = document.getElementById('scenario'); e.value = {json.dumps(text)};"
                       " e.dispatchEvent(new Event('input')); })()")


EVIL_PAGE = """<!doctype html><title>elsewhere</title>
<iframe name="sink" id="sink"></iframe>
<form id="form" method="POST" action="{control}/reset" target="sink"></form>
<form id="patch" method="POST" action="{control}/scenario" target="sink" enctype="text/plain">
  <input name='rules: []
#' value=''></form>
<script>
window.results = {{}};
async function attempt(name, run) {{
  try {{ window.results[name] = await run(); }} catch (error) {{ window.results[name] = "refused: " + error.name; }}
}}
(async () => {{
  await attempt("read page", async () => (await fetch("{control}/")).text());
  await attempt("read stats", async () => (await fetch("{control}/stats")).text());
  await attempt("read with a guessed token", async () =>
      (await fetch("{control}/stats", {{headers: {{"X-Chaosproxy-Console": "guess"}}}})).text());
  await attempt("reset no-cors", async () =>
      (await fetch("{control}/reset", {{method: "POST", mode: "no-cors"}})).type);
  await attempt("patch", async () => (await fetch("{control}/rules/weather-down", {{method: "PATCH",
      body: JSON.stringify({{enabled: false}})}})).status);
  document.getElementById("form").submit();
  await new Promise(r => setTimeout(r, 500));
  document.getElementById("patch").submit();
  await new Promise(r => setTimeout(r, 500));
  window.done = true;
}})();
</script>"""


async def test_another_origin_can_neither_read_nor_change_anything(console: Any, server_loop: ServerLoop):
    """A page on another port of 127.0.0.1, in the same browser: reads fail, changes are refused."""
    ctl = console()
    assert call(ctl.proxy.url, "/api/weather?city=oslo") == 503
    control = f"http://127.0.0.1:{ctl.port}"
    seen: list[str] = []

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=EVIL_PAGE.format(control=control), content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    server_loop.run(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    server_loop.run(site.start())
    evil_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    unsubscribe = ctl.proxy.engine.log.subscribe(lambda fields: seen.append(fields["event"]))
    try:
        async with open_tab(f"http://127.0.0.1:{evil_port}/") as tab:
            await tab.wait_for("window.done === true")
            results = await tab.evaluate("window.results")
    finally:
        unsubscribe()
        server_loop.run(runner.cleanup())
    assert results == {"read page": "refused: TypeError", "read stats": "refused: TypeError",
                       "read with a guessed token": "refused: TypeError", "reset no-cors": "opaque",
                       "patch": "refused: TypeError"}
    assert "control" not in seen  # no reset, no swap, no rule change
    assert ctl.rule("weather-down").enabled is True and len(ctl.proxy.engine.scenario.rules) == 2
    assert ctl.proxy.engine.rule_counts()["weather-down"] == (1, 1)  # the reset never happened


def test_the_console_token_is_what_lets_a_browser_in(console: Any):
    ctl = console()
    status, page = ctl.request("GET", "/", {"User-Agent": BROWSER})
    assert status == 200
    token = re.search(rb'name="chaosproxy-console" content="([^"]+)"', page).group(1).decode()
    assert token == ctl.server.console_token
    assert ctl.request("GET", "/stats", {"User-Agent": BROWSER})[0] == 403
    assert ctl.request("GET", "/stats", {"User-Agent": BROWSER, CONSOLE_HEADER: "wrong"})[0] == 403
    assert ctl.request("GET", "/stats", {"User-Agent": BROWSER, CONSOLE_HEADER: token})[0] == 200
    # a cross-site request carrying the token is still refused, as is a page under another name
    assert ctl.request("POST", "/reset", {"User-Agent": BROWSER, CONSOLE_HEADER: token,
                                          "Origin": "http://127.0.0.1:1"})[0] == 403
    assert ctl.request("GET", "/", {"User-Agent": BROWSER, "Host": f"evil.example:{ctl.port}"})[0] == 403
    assert ctl.request("GET", "/stats", {CONSOLE_HEADER: token, "Host": "evil.example"})[0] == 403
    # the page may not be framed, may run only its own script and fetch only from its own origin
    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=10)
    conn.request("GET", "/", headers={"User-Agent": BROWSER})
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.getheader("X-Frame-Options") == "DENY"
    policy = response.getheader("Content-Security-Policy")
    assert "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy and "default-src 'none'" in policy
    # another process's console token is another one
    assert console().server.console_token != token


def test_with_a_control_token_the_console_needs_it_too(console: Any):
    ctl = console(token="s3cret")
    assert ctl.request("GET", "/", {"User-Agent": BROWSER})[0] == 401
    assert ctl.request("GET", "/?token=wrong", {"User-Agent": BROWSER})[0] == 401
    status, page = ctl.request("GET", "/?token=s3cret", {"User-Agent": BROWSER})
    assert status == 200 and ctl.server.console_token.encode() in page
    assert ctl.request("GET", "/stats", {CONSOLE_HEADER: ctl.server.console_token})[0] == 200


def test_stats_check_and_recent_events(console: Any):
    ctl = console()
    for _ in range(3):
        call(ctl.proxy.url, "/api/weather?city=oslo")
    status, body = ctl.request("GET", "/stats")
    stats = json.loads(body)
    assert status == 200 and (stats["calls"], stats["faults"], stats["active_sessions"]) == (3, 3, 1)
    assert [(r["name"], r["matched"], r["fired"], r["component"]) for r in stats["rules"]] == [
        ("weather-down", 3, 3, "transition"), ("slow-echo", 0, 0, "transition")]
    status, body = ctl.request("POST", "/scenario/check?source=s.yaml", body=b"rules:\n  - name: x\n    fault: {}\n")
    checked = json.loads(body)
    assert status == 200 and checked["valid"] is False and checked["problems"][0].startswith("s.yaml:3: ")
    status, body = ctl.request("POST", "/scenario/check", body=b"rules: [{name: x, fault: {type: reset}}]")
    assert (status, json.loads(body)) == (200, {"valid": True, "rules": ["x"]})
    assert [rule.name for rule in ctl.proxy.engine.scenario.rules] == ["weather-down", "slow-echo"]
    status, body = ctl.request("GET", "/scenario?format=yaml")
    assert status == 200 and body.startswith(b"rules:\n- name: weather-down\n")
    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=10)
    conn.request("GET", "/events?event=fault&last=2")
    response = conn.getresponse()
    lines = [json.loads(response.readline()) for _ in range(2)]
    conn.close()
    assert [(line["event"], line["rule"], line["match_index"]) for line in lines] == [
        ("fault", "weather-down", 2), ("fault", "weather-down", 3)]
    assert ctl.request("GET", "/events?last=x")[0] == 400
