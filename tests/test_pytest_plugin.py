"""The pytest plugin: its fixtures used here directly, and from a user's test suite through pytester."""

from __future__ import annotations

import pytest

from tests.helpers.support import http_status as status

pytest_plugins = ["pytester"]

DOWN = {"match": {"path": "/api/*"}, "fault": {"type": "http_error", "status": 503}}




@pytest.fixture
def chaosproxy_upstream(upstream: str) -> str:
    return upstream


def test_the_fixture_proxies_and_faults_for_a_block(chaosproxy):
    weather = chaosproxy.url + "/api/weather"
    assert status(weather) == 200
    with chaosproxy.fault(DOWN) as name:
        assert status(weather) == 503
    assert status(weather) == 200
    assert chaosproxy.control.get_scenario() == {"rules": []}
    [fault] = chaosproxy.log_lines("fault")
    assert fault["rule"] == name and fault["path"] == "/api/weather"
    assert [call["status"] for call in chaosproxy.log_lines("call")] == [200, 503, 200]


@pytest.mark.chaosproxy(scenario={"rules": [{"name": "down", **DOWN}]}, seed=42)
def test_the_marker_gives_a_scenario_and_seed(chaosproxy):
    assert status(chaosproxy.url + "/api/weather") == 503
    assert chaosproxy.control.version()["seed"] == 42
    chaosproxy.control.patch_rule("down", enabled=False)
    assert status(chaosproxy.url + "/api/weather") == 200


def test_the_factory_starts_independent_proxies(chaosproxy_factory, upstream):
    calm = chaosproxy_factory(upstream)
    broken = chaosproxy_factory(upstream, "rules: [{name: down, fault: {type: http_error, status: 502}}]")
    assert calm.url != broken.url
    assert (status(calm.url + "/health"), status(broken.url + "/health")) == (200, 502)


@pytest.mark.slow
def test_a_user_suite_uses_the_plugin_through_its_entry_point(pytester, upstream):
    pytester.makepyfile(f"""
        import urllib.error, urllib.request
        import pytest

        def status(url):
            try:
                return urllib.request.urlopen(url, timeout=10).status
            except urllib.error.HTTPError as error:
                return error.code

        @pytest.mark.chaosproxy(upstream="{upstream}")
        def test_agent_meets_a_429(chaosproxy):
            with chaosproxy.fault({{"fault": {{"type": "http_error", "status": 429}}}}):
                assert status(chaosproxy.url + "/api/weather") == 429
            assert status(chaosproxy.url + "/api/weather") == 200

        def test_without_an_upstream(chaosproxy):
            pass
    """)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*the chaosproxy fixture needs an upstream*"])
