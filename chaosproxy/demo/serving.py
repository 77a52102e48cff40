"""Serving the bundled servers (REST tools, MCP, scripted model) on loopback for the demo, tests and bench."""

from __future__ import annotations

from aiohttp import web


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start `app`; returns its runner (call `cleanup()` to stop) and the bound port (useful with port 0)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
