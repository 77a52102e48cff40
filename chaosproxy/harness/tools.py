"""Inspect's MCP tool sources with a proxy in front of each sample-epoch's sessions.

`mcp_server_http`, `mcp_server_sse` and `mcp_server_stdio` take Inspect's arguments and give a
server that, inside a `chaos_task`, reaches the real one through the running sample-epoch's proxy
(HTTP: its in-process proxy; stdio: the command run through `chaosproxy stdio`). Inspect keeps an
MCP session per asyncio task; here each sample-epoch has its own Inspect server object, so those
sessions stay as Inspect makes them. Each tool's calls are followed, in the transcript, by the
faults that hit them (an info event from `chaosproxy`).

A fault that fails a server's handshake (initialize, tools/list) does not error the sample, as a real
failure there does in Inspect: the sample goes on without that server's tools, as a host that cannot
start an MCP server goes on without it, the transcript saying which fault took them away. The model is
measured on what it does then (answer anyway, or say it cannot), and the sample-epoch counts as faulted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from inspect_ai.log import transcript
from inspect_ai.tool import Tool, ToolDef
from inspect_ai.tool._mcp._local import (
    MCPServerLocal,
    _stdio_client_forwarding_stderr,
    create_server_sse,
    create_server_streamablehttp,
)
from inspect_ai.tool._mcp._types import MCPServer
from mcp.client.stdio import StdioServerParameters
from pydantic import JsonValue

from chaosproxy.harness.sample import SampleChaos, current_sample
from chaosproxy.telemetry.log_schema import Key

Connect = Callable[[SampleChaos], Awaitable[MCPServer]]
Lines = Callable[[SampleChaos], Callable[[dict[str, Any]], bool]]  # which log lines are a server's


def _stdio_lines(_: SampleChaos) -> Callable[[dict[str, Any]], bool]:
    """A stdio server's lines: those of the stdio relays (each session its own process and run id)."""
    return lambda line: line.get(Key.TRANSPORT) == "stdio"


class ChaosMCPServer(MCPServerLocal):
    """An MCP server whose sessions go through the current sample-epoch's proxy.

    A subclass of Inspect's local server so that `mcp_tools(server, tools=[...])` and
    `mcp_connection` take it as one; every method goes to the sample-epoch's own server.
    """

    def __init__(self, name: str, connect: Connect, lines: Lines) -> None:
        super().__init__(_no_client, name=name, events=True)
        self._connect = connect
        self._lines = lines

    async def _server(self) -> tuple[SampleChaos, MCPServer]:
        chaos = current_sample()
        server = chaos.servers.get(self)
        if server is None:
            server = chaos.servers[self] = await self._connect(chaos)
        return chaos, server

    async def __aenter__(self) -> MCPServer:
        chaos, server = await self._server()
        if self not in chaos.unavailable:
            try:
                await server.__aenter__()
            except Exception as exc:
                if not self._taken_away(chaos, exc):
                    raise
            else:
                chaos.entered.add(self)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                        exc_tb: TracebackType | None) -> None:
        chaos, server = await self._server()
        if self in chaos.entered:  # (taken away after it was entered too: its session still ends here)
            chaos.entered.discard(self)
            await server.__aexit__(exc_type, exc_val, exc_tb)

    async def tools(self) -> list[Tool]:
        chaos, server = await self._server()
        if self in chaos.unavailable:
            return []
        try:
            listed = await server.tools()
        except Exception as exc:
            if not self._taken_away(chaos, exc):
                raise
            return []
        return [_reporting(tool, chaos) for tool in listed]

    def _taken_away(self, chaos: SampleChaos, exc: Exception) -> bool:
        """Whether a fault failed this server's handshake (then its tools are gone for the sample-epoch, and
        the transcript says why); False for any other failure, which is the sample's error as in Inspect."""
        faults = chaos.handshake_faults(self._lines(chaos))
        if not faults:
            return False
        chaos.unavailable.add(self)
        transcript().info(cast(JsonValue, {"server": self._name, "unavailable": _reason(exc), "faults": faults}),
                          source="chaosproxy")
        return True


def _reason(exc: BaseException) -> str:
    """What failed, from inside the task groups the MCP client wraps it in."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _no_client() -> Any:
    raise RuntimeError("a chaosproxy MCP server connects through its sample-epoch's own server")


def _reporting(tool: Tool, chaos: SampleChaos) -> Tool:
    """`tool`, followed in the transcript by the faults that hit its call (if any fired)."""
    definition = ToolDef(tool)

    async def execute(**arguments: Any) -> Any:
        try:
            return await definition.tool(**arguments)
        finally:
            if faults := chaos.faults_for(definition.name):
                transcript().info(cast(JsonValue, {"tool": definition.name, "faults": faults}), source="chaosproxy")

    return ToolDef(execute, name=definition.name, description=definition.description,
                   parameters=definition.parameters, parallel=definition.parallel, viewer=definition.viewer,
                   model_input=definition.model_input, max_output=definition.max_output,
                   options=definition.options).as_tool()


def mcp_server_http(*, name: str | None = None, url: str, authorization: str | None = None,
                    headers: dict[str, str] | None = None, timeout: float = 5,
                    sse_read_timeout: float = 60 * 5) -> MCPServer:
    """inspect_ai.tool.mcp_server_http (local execution), through each sample-epoch's proxy."""
    async def connect(chaos: SampleChaos) -> MCPServer:
        return create_server_streamablehttp(name=name or url, url=await chaos.proxy_url(url),
                                            headers=_headers(authorization, headers), timeout=timeout,
                                            sse_read_timeout=sse_read_timeout)
    return ChaosMCPServer(name or url, connect, lambda chaos: chaos.of_upstream(url))


def mcp_server_sse(*, name: str | None = None, url: str, authorization: str | None = None,
                   headers: dict[str, str] | None = None, timeout: float = 5,
                   sse_read_timeout: float = 60 * 5) -> MCPServer:
    """inspect_ai.tool.mcp_server_sse (local execution), through each sample-epoch's proxy (which
    rewrites the endpoint event, so the POSTs come back through it too)."""
    async def connect(chaos: SampleChaos) -> MCPServer:
        return create_server_sse(name=name or url, url=await chaos.proxy_url(url),
                                 headers=_headers(authorization, headers), timeout=timeout,
                                 sse_read_timeout=sse_read_timeout)
    return ChaosMCPServer(name or url, connect, lambda chaos: chaos.of_upstream(url))


def mcp_server_stdio(*, name: str | None = None, command: str, args: list[str] | None = None,
                     cwd: str | Path | None = None, env: dict[str, str] | None = None) -> MCPServer:
    """inspect_ai.tool.mcp_server_stdio, each session's command run through `chaosproxy stdio` with a
    seed of the sample-epoch's."""
    label = name or " ".join([command, *(args or [])])

    async def connect(chaos: SampleChaos) -> MCPServer:
        def session() -> Any:
            executable, argv, extra = chaos.stdio_command(command, list(args or []))
            parameters = StdioServerParameters(command=executable, args=argv, cwd=cwd,
                                               env={**(env or {}), **extra})
            return _stdio_client_forwarding_stderr(parameters, label)
        return MCPServerLocal(session, name=label, events=True)
    return ChaosMCPServer(label, connect, _stdio_lines)


def _headers(authorization: str | None, headers: dict[str, str] | None) -> dict[str, str] | None:
    """Inspect's own rule: a bearer token is one more header."""
    if authorization is None:
        return headers
    return {**(headers or {}), "Authorization": f"Bearer {authorization}"}
