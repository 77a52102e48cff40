"""A2A calls' spans, exported to a real OTLP receiver on 127.0.0.1: named by the A2A method, with the task
and its state as the agent got it, and the fault that changed it."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.types.a2a_pb2 import GetTaskRequest

from chaosproxy.telemetry.tracing import OtlpTracing
from tests.helpers.a2a_support import JSONRPC, REST, a2a_client, events, final_task, question, remote_agent  # noqa: F401
from tests.helpers.llm_support import rules
from tests.helpers.otlp import Receiver
from tests.telemetry.test_otel import receiver  # noqa: F401


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_a2a_spans_name_the_method_task_and_state(remote_agent: Any, make_proxy: Any,  # noqa: F811
                                                        receiver: Receiver, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                                        binding: str):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    proxy = make_proxy(rules({"fault": {"type": "task_stuck"}}), to=remote_agent.url)
    tracing = proxy.engine.tracing = OtlpTracing(run_id="a2a", seed=7)
    async with a2a_client(proxy.url, binding, streaming=False) as client:
        task = final_task(await events(client, question()))
        await client.get_task(GetTaskRequest(id=task.id))
    tracing.shutdown()
    receiver.wait_for(lambda spans: any(s.name == "GetTask" for s in spans), timeout=10)
    (send,), (poll,) = receiver.named("SendMessage"), receiver.named("GetTask")
    for span, method in ((send, "SendMessage"), (poll, "GetTask")):
        assert span.attributes["a2a.method.name"] == method
        assert span.attributes["a2a.task.id"] == task.id
        assert span.attributes["a2a.task.state"] == "working"  # as the agent got it: stuck
        assert span.attributes["chaosproxy.fault.type"] == "task_stuck"
