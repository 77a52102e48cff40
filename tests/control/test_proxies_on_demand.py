"""Proxies made on demand through the control API: each its own listener, upstream, scenario, seed and log
marks; made, changed and deleted at run time, and leaving nothing behind."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import os
import urllib.request

import pytest

from chaosproxy.client import ControlError
from chaosproxy.embedded import EmbeddedProxy
from tests.helpers.support import http_status as status

TEAPOT = {"rules": [{"name": "teapot", "match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 418}}]}




def test_a_proxy_made_on_demand_has_its_own_listener_scenario_seed_and_log(upstream: str, tmp_path):
    with EmbeddedProxy(upstream, log_path=tmp_path / "run.jsonl") as run:
        made = run.control.create_proxy("p1", upstream, scenario=TEAPOT, seed=99)
        assert (made["name"], made["seed"], made["rules"], made["enabled"]) == ("p1", 99, ["teapot"], True)
        url = f"http://{made['listen']}"
        assert url != run.url
        assert status(url + "/api/weather") == 418 and status(run.url + "/api/weather") == 200
        p1 = run.control.for_proxy("p1")
        p1.patch_rule("teapot", enabled=False)
        assert status(url + "/api/weather") == 200
        assert [call["status"] for call in p1.calls()] == [418, 200]
        assert [call["status"] for call in run.calls(proxy="p1")] == [418, 200]
        # its lines are the run's, marked with it and with its own seed
        marked = [line for line in run.log_lines("call") if line.get("proxy") == "p1"]
        assert [(line["seed"], line["status"]) for line in marked] == [(99, 418), (99, 200)]
        # a scope of a proxy made on demand
        scoped = p1.scoped("t1", TEAPOT)
        assert status(url + "/api/weather", scoped.headers) == 418
        assert [call["scope"] for call in p1.calls(scope="t1")] == ["t1"]
        listed = json.loads(urllib.request.urlopen(run.control_url + "/proxies", timeout=10).read())
        assert [proxy["name"] for proxy in listed["proxies"]] == ["p1"]
        run.control.delete_proxy("p1")
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/api/weather", timeout=5)
        with pytest.raises(ControlError) as gone:
            p1.get_scenario()
        assert gone.value.status == 404


def test_a_proxy_is_disabled_and_enabled_on_the_same_port(upstream: str):
    with EmbeddedProxy(upstream) as run:
        url = f"http://{run.control.create_proxy('p1', upstream)['listen']}"
        connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        connection.request("GET", "/health")
        assert connection.getresponse().read() == b"ok"
        change = urllib.request.Request(run.control_url + "/proxies/p1", data=b'{"enabled": false}', method="PATCH")
        assert json.loads(urllib.request.urlopen(change, timeout=10).read())["enabled"] is False
        with pytest.raises(OSError):  # its open connection is cut, and nothing listens
            connection.request("GET", "/health")
            connection.getresponse().read()
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)
        change = urllib.request.Request(run.control_url + "/proxies/p1", data=b'{"enabled": true}', method="PATCH")
        urllib.request.urlopen(change, timeout=10).close()
        assert status(url + "/health") == 200


@pytest.mark.parametrize("body, reason", [
    ({"name": "p1"}, "missing required field: upstream"),
    ({"name": "bad name", "upstream": "127.0.0.1:1"}, "a proxy's name is"),
    ({"name": "p1", "upstream": "ftp://x"}, "expected an http"),
    ({"name": "p1", "upstream": "127.0.0.1:1", "listen": "nowhere"}, "listen is HOST:PORT"),
    ({"name": "p1", "upstream": "127.0.0.1:1", "scenario": "rules: [{name: x}]"}, "invalid scenario"),
    ({"name": "p1", "upstream": ["127.0.0.1:1"]}, "upstream is a URL"),
    ({"name": "p1", "upstream": "127.0.0.1:1", "listen": 8080}, "listen is HOST:PORT"),
    ({"name": "p1", "upstream": "127.0.0.1:1", "scope_header": "X-A\r\nX-B: 1"}, "scope_header is a header's name"),
    ({"name": "p1", "upstream": "127.0.0.1:1", "seed": "7"}, "seed is a whole number"),
])
def test_a_proxy_that_cannot_be_made_is_refused_with_the_reason(upstream: str, body, reason):
    with EmbeddedProxy(upstream) as run:
        request = urllib.request.Request(run.control_url + "/proxies", data=json.dumps(body).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        with refused.value as error:
            assert error.code == 400 and reason in json.loads(error.read())["error"]


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_thousand_proxies_made_and_deleted_leave_nothing_behind(upstream: str, record_property):
    """Each proxy is made, answers a call through a new connection, and is deleted; file descriptors,
    the proxy loop's tasks and memory are back where they were."""
    with EmbeddedProxy(upstream) as run:
        loop = run._loop
        assert loop is not None

        def cycle(n: int) -> None:
            for i in range(n):
                made = run.control.create_proxy(f"p{i}", upstream, scenario=TEAPOT)
                assert status(f"http://{made['listen']}/api/weather") == 418
                run.control.delete_proxy(f"p{i}")

        def tasks() -> int:
            return asyncio.run_coroutine_threadsafe(_count_tasks(), loop).result(10)

        cycle(100)  # warm up: pools, caches, the allocator's arenas
        gc.collect()
        files, task_count, rss = open_files(), tasks(), _rss_kib()
        cycle(1000)
        gc.collect()
        grown_kib = _rss_kib() - rss
        record_property("rss_growth_kib", grown_kib)
        assert open_files() == files
        assert tasks() == task_count
        # the journal keeps each cycle's call and fault lines (~2.5 KiB; bounded, at 10,000 lines): the rest
        # of a proxy, gone with it, adds well under a KiB a cycle
        assert grown_kib < 4 * 1024, f"RSS grew {grown_kib} KiB over 1,000 proxies"
        assert json.loads(urllib.request.urlopen(run.control_url + "/proxies", timeout=10).read()) == {"proxies": []}


async def _count_tasks() -> int:
    return len(asyncio.all_tasks()) - 1  # less this one


def _rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
