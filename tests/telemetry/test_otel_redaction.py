"""No secret leaves the proxy in a span, on stderr or in an error: the upstream's userinfo and the values
of a signed URL's query keys are redacted as the OpenTelemetry URL conventions say (REDACTED:REDACTED,
REDACTED), while the upstream still gets the request as the agent sent it. Real sockets, a real OTLP
receiver, and the command line as a user runs it."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from chaosproxy.telemetry.redact import redacted_url
from chaosproxy.telemetry.tracing import OtlpTracing
from tests.helpers.otlp import Receiver
from tests.helpers.support import free_port, wait_listening
from tests.telemetry.test_otel import receiver  # noqa: F401

SECRETS = ("PASSWORD", "AMZSIG", "AMZCRED", "AMZTOKEN", "AWSKEY", "CFSIG", "AZURESIG", "GOOGSIG")
SIGNED_QUERY = ("city=oslo&X-Amz-Signature=AMZSIG&X-Amz-Credential=AMZCRED&X-Amz-Security-Token=AMZTOKEN"
                "&AWSAccessKeyId=AWSKEY&Signature=CFSIG&sig=AZURESIG&X-Goog-Signature=GOOGSIG&Sig=kept")
REDACTED_QUERY = ("city=oslo&X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED&X-Amz-Security-Token=REDACTED"
                  "&AWSAccessKeyId=REDACTED&Signature=REDACTED&sig=REDACTED&X-Goog-Signature=REDACTED&Sig=kept")


def with_userinfo(url: str) -> str:
    return url.replace("http://", "http://svc:PASSWORD@")


@pytest.mark.parametrize("path", ["passthrough", "inspected"])
def test_url_full_carries_no_credentials_nor_signatures(make_proxy: Any, upstream: str,
                                                        receiver: Receiver, path: str):  # noqa: F811
    scenario = {"rules": [{"name": "never", "match": {"path": "/elsewhere"}, "fault": {"type": "latency",
                                                                                     "delay_ms": 1}}]}
    proxy = make_proxy(scenario if path == "inspected" else "rules: []", to=with_userinfo(upstream))
    proxy.engine.tracing = tracing = OtlpTracing(run_id="redact", seed=1, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"})
    with urllib.request.urlopen(f"{proxy.url}/echo/file?{SIGNED_QUERY}", timeout=10) as reply:
        assert reply.headers["X-Echo-Path"] == f"/echo/file?{SIGNED_QUERY}"  # relayed as the agent sent it
    tracing.shutdown()
    [span] = receiver.wait_for(lambda spans: any(s.name == "GET" for s in spans), timeout=10)
    assert span.attributes["url.full"] == f"{with_userinfo(upstream).replace('svc:PASSWORD', 'REDACTED:REDACTED')}" \
                                          f"/echo/file?{REDACTED_QUERY}"
    exported = repr(span)
    assert not [secret for secret in SECRETS if secret in exported], exported


def test_a_failed_upstream_is_named_without_its_credentials(make_proxy: Any, caplog: pytest.LogCaptureFixture):
    """The 502 the agent gets and the warning on stderr name the upstream, not its password."""
    proxy = make_proxy("rules: []", to=f"http://svc:PASSWORD@127.0.0.1:{free_port()}")
    with caplog.at_level(logging.WARNING, logger="chaosproxy"), pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(f"{proxy.url}/api/weather", timeout=10)
    body = failed.value.read().decode()
    assert failed.value.code == 502 and "REDACTED:REDACTED@127.0.0.1" in body
    assert "PASSWORD" not in body and "PASSWORD" not in caplog.text and "REDACTED:REDACTED@" in caplog.text


@pytest.mark.slow
def test_the_command_line_shows_no_secret_on_stderr(upstream: str, tmp_path: Path):
    """`chaosproxy run` with an upstream and a collector that carry credentials, a malformed OTLP header
    setting, and a signed-URL call that reaches a collector that is not there: stderr (the start-up
    line, the export warnings) and the log name them all without a secret."""
    port, log = free_port(), tmp_path / "log.jsonl"
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://otel:OTELPASSWORD@127.0.0.1:{free_port()}",
           "OTEL_EXPORTER_OTLP_HEADERS": "Authorization Bearer HEADERSECRET", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", with_userinfo(upstream),
                             "--listen", f"127.0.0.1:{port}", "--log", str(log)], stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_listening(port, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/weather?{SIGNED_QUERY}", timeout=10) as reply:
            assert json.loads(reply.read())["city"] == "oslo"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    [listening] = [line for line in stderr.splitlines() if "listening on" in line]
    assert f"-> / {with_userinfo(upstream).replace('svc:PASSWORD', 'REDACTED:REDACTED')}" in listening
    assert "exporting OpenTelemetry spans over OTLP/HTTP to http://REDACTED:REDACTED@127.0.0.1:" in stderr
    assert "OTEL_EXPORTER_OTLP_HEADERS: item 1 is not key=value" in stderr
    assert "spans not exported to http://REDACTED:REDACTED@" in stderr, stderr
    shown = stderr + log.read_text()
    assert not [secret for secret in (*SECRETS, "OTELPASSWORD", "HEADERSECRET") if secret in shown], shown


@pytest.mark.parametrize(("url", "shown"), [
    ("https://svc:PASSWORD@host:8443/a?b=1", "https://REDACTED:REDACTED@host:8443/a?b=1"),
    ("http://token@host/", "http://REDACTED:REDACTED@host/"),
    ("http://host/p@th?x=a@b", "http://host/p@th?x=a@b"),  # an @ past the authority is no userinfo
    ("http://a:b@c@host/", "http://REDACTED:REDACTED@host/"),
    ("http://host/?X-Goog-Signature=s&x-goog-signature=kept#sig=frag",
     "http://host/?X-Goog-Signature=REDACTED&x-goog-signature=kept#sig=frag"),  # case-sensitive, as specified
    ("http://host/?%73ig=s", "http://host/?%73ig=REDACTED"),  # a key percent-encoded is still that key
    ("http://host/?q=1&sig", "http://host/?q=1&sig=REDACTED"),
    ("http://host/a?q=sig", "http://host/a?q=sig"),
])
def test_redacted_url(url: str, shown: str):
    assert redacted_url(url) == shown
