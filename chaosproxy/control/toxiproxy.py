"""A Toxiproxy 2.x-compatible HTTP API over chaosproxy's proxies made on demand, so that suites written
against Toxiproxy (its Go and Node clients, Testcontainers modules) drive chaosproxy unchanged.

  GET /proxies, POST /proxies, POST /populate, GET|POST|DELETE /proxies/{proxy},
  GET|POST /proxies/{proxy}/toxics, GET|POST|DELETE /proxies/{proxy}/toxics/{toxic}, POST /reset, GET /version

with Toxiproxy 2.3's JSON shapes and status codes (updates by PATCH too, as later 2.x releases take them;
/version is 2.3's plain text). A proxy is a chaosproxy listener (an HTTP reverse
proxy: its upstream HOST:PORT is http://HOST:PORT); `enabled: false` closes it and its connections. A
toxic is a rule on it (control/toxics.py). `chaosproxy toxiproxy --listen 127.0.0.1:8474` serves this API
alone; `chaosproxy run --toxiproxy-api ADDR` beside a proxy, sharing its proxies with `--control`'s.

Toxiproxy's API has no authentication, and its clients send none: this one listens on loopback only,
and refuses browsers (as Toxiproxy does), cross-site requests and non-loopback Host names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from chaosproxy import __version__
from chaosproxy.control.api import (
    ControlConfigError,
    ControlServer,
    is_loopback,
    listen,
    read_json,
    serve_control,
)
from chaosproxy.control.proxies import ManagedProxy, ProxyError, ProxyRegistry
from chaosproxy.control.toxics import STREAMS, Toxic, ToxicError, changed, new_toxic
from chaosproxy.engine.core import Engine
from chaosproxy.engine.sessions import SCOPE_HEADER
from chaosproxy.telemetry.log import ops

API_VERSION = "2.3.0"  # the Toxiproxy API this one answers as


class ToxiproxyApi:
    """The Toxiproxy API over a registry of proxies made on demand, on a listener of its own."""

    def __init__(self, proxies: ProxyRegistry) -> None:
        self.proxies = proxies
        self._runner: web.AppRunner | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port. ControlConfigError for an address that is not loopback."""
        if not is_loopback(host):
            raise ControlConfigError(f"the Toxiproxy API has no authentication, so it listens on loopback only, not on "
                             f"{host or 'every interface'}")
        app = web.Application(middlewares=[_guard, _answers])
        app.router.add_post("/reset", self._reset)
        app.router.add_get("/proxies", self._index)
        app.router.add_post("/proxies", self._create)
        app.router.add_post("/populate", self._populate)
        app.router.add_get("/proxies/{proxy}", self._show)
        app.router.add_post("/proxies/{proxy}", self._update)
        app.router.add_patch("/proxies/{proxy}", self._update)  # (as later 2.x releases take it too)
        app.router.add_delete("/proxies/{proxy}", self._delete)
        app.router.add_get("/proxies/{proxy}/toxics", self._toxics)
        app.router.add_post("/proxies/{proxy}/toxics", self._add_toxic)
        app.router.add_get("/proxies/{proxy}/toxics/{toxic}", self._show_toxic)
        app.router.add_post("/proxies/{proxy}/toxics/{toxic}", self._update_toxic)
        app.router.add_patch("/proxies/{proxy}/toxics/{toxic}", self._update_toxic)
        app.router.add_delete("/proxies/{proxy}/toxics/{toxic}", self._delete_toxic)
        app.router.add_get("/version", self._version)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1)
        return await listen(self._runner, host, port, self.stop)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _index(self, _: web.Request) -> web.Response:
        return _json({name: _proxy_json(proxy) for name, proxy in self.proxies.proxies.items()})

    async def _create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        proxy = await self._make(body)
        return _json(_proxy_json(proxy), 201)

    async def _make(self, body: dict[str, Any], label: str = "") -> ManagedProxy:
        """A proxy from a POST /proxies body (enabled unless it says false); `label` says which of a list
        it is in an error ("at proxy 2")."""
        _check_required(body, label)
        return await self.proxies.create(body["name"], _text(body, "listen"), _text(body, "upstream"),
                                         enabled=body.get("enabled") is not False)

    async def _populate(self, request: web.Request) -> web.Response:
        """Make the proxies of a list, replacing those of the same name unless they listen and forward as
        asked; all checked before any is made, as Toxiproxy does."""
        made: list[ManagedProxy] = []
        try:
            wanted = await read_json(request, list)
            for index, body in enumerate(wanted, 1):
                _check_required(body, f" at proxy {index}")
            for body in wanted:
                made.append(await self._replace(body))
        except ProxyError as exc:  # (its "proxies": those made before, null for none, as Toxiproxy says it)
            return _json({"error": str(exc), "status": exc.status,
                          "proxies": [_proxy_json(proxy) for proxy in made] or None}, exc.status)
        return _json({"proxies": [_proxy_json(proxy) for proxy in made]}, 201)

    async def _replace(self, body: dict[str, Any]) -> ManagedProxy:
        existing = self.proxies.proxies.get(body["name"])
        if existing is not None:
            if _text(body, "listen") in ("", existing.address) and _text(body, "upstream") == existing.upstream:
                return existing
            await self.proxies.delete(existing.name)
        return await self._make(body)

    async def _show(self, request: web.Request) -> web.Response:
        return _json(_proxy_json(self._proxy(request)))

    async def _update(self, request: web.Request) -> web.Response:
        """POST /proxies/{proxy}: listen, upstream and enabled, each as it was when left out."""
        proxy = self._proxy(request)
        body = await read_json(request)
        enabled = body.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ProxyError("bad request body: enabled is true or false")
        listen = _text(body, "listen") or proxy.address
        upstream = _text(body, "upstream") or proxy.upstream
        await proxy.change(listen=None if listen == proxy.address else listen,
                           upstream=None if upstream == proxy.upstream else upstream, enabled=enabled)
        return _json(_proxy_json(proxy))

    async def _delete(self, request: web.Request) -> web.Response:
        await self.proxies.delete(request.match_info["proxy"])
        return web.Response(status=204)

    async def _toxics(self, request: web.Request) -> web.Response:
        return _json(_toxics_json(self._proxy(request)))

    async def _add_toxic(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = new_toxic(await read_json(request))
        if toxic.name in proxy.toxics:
            raise ToxicError("toxic already exists", 409)
        proxy.load(toxics={**proxy.toxics, toxic.name: toxic})
        proxy.engine.log.control(change="toxic added", toxic=toxic.name, type=toxic.type, stream=toxic.stream,
                                 toxicity=toxic.toxicity, attributes=toxic.attributes)
        return _json(toxic.as_json())

    async def _show_toxic(self, request: web.Request) -> web.Response:
        return _json(self._toxic(request)[1].as_json())

    async def _update_toxic(self, request: web.Request) -> web.Response:
        proxy, toxic = self._toxic(request)
        toxic = changed(toxic, await read_json(request))
        proxy.load(toxics={**proxy.toxics, toxic.name: toxic})
        proxy.engine.log.control(change="toxic updated", toxic=toxic.name, toxicity=toxic.toxicity,
                                 attributes=toxic.attributes)
        return _json(toxic.as_json())

    async def _delete_toxic(self, request: web.Request) -> web.Response:
        proxy, toxic = self._toxic(request)
        proxy.load(toxics={name: kept for name, kept in proxy.toxics.items() if name != toxic.name})
        proxy.engine.log.control(change="toxic removed", toxic=toxic.name)
        return web.Response(status=204)

    async def _reset(self, _: web.Request) -> web.Response:
        """Every proxy enabled, every toxic removed."""
        for proxy in list(self.proxies.proxies.values()):
            await proxy.enable()
            proxy.load(toxics={})
        self.proxies.engine.log.control(change="toxiproxy reset")
        return web.Response(status=204)

    async def _version(self, _: web.Request) -> web.Response:
        return web.Response(text=f"{API_VERSION}+chaosproxy.{__version__}", content_type="text/plain")

    def _proxy(self, request: web.Request) -> ManagedProxy:
        return self.proxies.get(request.match_info["proxy"])

    def _toxic(self, request: web.Request) -> tuple[ManagedProxy, Toxic]:
        proxy = self._proxy(request)
        toxic = proxy.toxics.get(request.match_info["toxic"])
        if toxic is None:
            raise ToxicError("toxic not found", 404)
        return proxy, toxic


def _proxy_json(proxy: ManagedProxy) -> dict[str, Any]:
    return {"name": proxy.name, "listen": proxy.address, "upstream": proxy.upstream, "enabled": proxy.enabled,
            "toxics": _toxics_json(proxy)}


def _toxics_json(proxy: ManagedProxy) -> list[dict[str, Any]]:
    """Upstream toxics first, then downstream ones, each in the order added (Toxiproxy's chains)."""
    toxics = sorted(proxy.toxics.values(), key=lambda toxic: STREAMS.index(toxic.stream))
    return [toxic.as_json() for toxic in toxics]


def _check_required(body: Any, label: str) -> None:
    if not isinstance(body, dict):
        raise ProxyError(f"bad request body: expected a JSON object{label}")
    for required in ("name", "upstream"):
        if not body.get(required):
            raise ProxyError(f"missing required field: {required}{label}")


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key) or ""
    if not isinstance(value, str):
        raise ProxyError(f"bad request body: {key} is a string")
    return value


@web.middleware
async def _guard(request: web.Request,
                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """No browsers (Toxiproxy's own rule), no cross-site requests, no DNS rebinding."""
    if request.headers.get("User-Agent", "").startswith("Mozilla/"):
        return _json({"error": "User agent not allowed", "status": 403}, 403)
    if request.headers.get("Origin") is not None or not is_loopback(request.url.host or ""):
        return _json({"error": "cross-site or non-loopback request refused", "status": 403}, 403)
    return await handler(request)


@web.middleware
async def _answers(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """A refusal in Toxiproxy's shape: {"error": MESSAGE, "status": CODE}."""
    try:
        return await handler(request)
    except (ProxyError, ToxicError) as exc:
        return _json({"error": str(exc), "status": exc.status}, exc.status)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


@contextlib.asynccontextmanager
async def serve_apis(engine: Engine, control: tuple[str, int] | None, token: str | None, *,
                     file_roots: Iterable[Path] = (), toxiproxy: tuple[str, int] | None = None,
                     scope_header: str = SCOPE_HEADER) -> AsyncIterator[ControlServer | None]:
    """The control API (`--control`) and the Toxiproxy API (`--toxiproxy-api`), each when given an address,
    sharing the proxies made on demand (closed at the end); yields the control API. ControlConfigError
    when one cannot listen as asked."""
    proxies = ProxyRegistry(engine, scope_header)
    try:
        async with serve_control(engine, control, token, file_roots=file_roots, proxies=proxies) as server:
            if toxiproxy is None:
                yield server
                return
            api = ToxiproxyApi(proxies)
            try:
                port = await api.start(*toxiproxy)
            except OSError as exc:
                raise ControlConfigError(f"cannot listen on {toxiproxy[0]}:{toxiproxy[1]} for the Toxiproxy API: "
                                         f"{exc.strerror or exc}") from None
            ops.info("Toxiproxy API on %s port %d", toxiproxy[0], port)
            try:
                yield server
            finally:
                await api.stop()
    finally:
        await proxies.close()


def main(args: argparse.Namespace) -> int:
    """`chaosproxy toxiproxy`: the Toxiproxy API alone (and the control API with --control), until
    SIGINT/SIGTERM; every proxy made through them is closed at the end."""
    from chaosproxy.control.runtime import open_engine, run_async, wait_for_stop_signal

    with open_engine(None, seed=args.seed, log_path=args.log) as engine:
        async def serve() -> None:
            flusher = asyncio.create_task(engine.log.flush_periodically())
            try:
                async with serve_apis(engine, args.control, args.control_token, toxiproxy=args.listen):
                    await wait_for_stop_signal()
            finally:
                flusher.cancel()
        try:
            run_async(serve())
        except ControlConfigError as exc:
            print(f"chaosproxy toxiproxy: {exc}", file=sys.stderr)
            return 2
    return 0
