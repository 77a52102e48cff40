"""A small REST tool server for the demo, the tests and the benchmark (aiohttp, loopback).

  POST /api/search     {"query": "..."} -> {"results": [...]}
  GET  /api/weather    ?city=... -> {"city": ..., "temp_c": ...}
  *    /echo/...       echoes the request: the body byte for byte, the method, raw path and headers
                       received in X-Echo-Method, X-Echo-Path and X-Echo-Headers (JSON pairs);
                       X-Echo-Status asks for a status
  GET  /sse            ?n=5&interval_ms=50: n events, the first at once, then one per interval
  GET  /big            ?bytes=1048576: a JSON document of that size, streamed in 64 KiB chunks
  GET  /health         "ok"
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from chaosproxy.demo.serving import serve

FORECASTS = {"paris": 14, "tokyo": 19, "lima": 22, "oslo": 3}


async def search(request: web.Request) -> web.Response:
    query = (await request.json()).get("query", "")
    results = [{"title": f"{query} — result {i}", "score": round(1 - i / 10, 2)} for i in range(1, 4)]
    return web.json_response({"query": query, "results": results})


async def weather(request: web.Request) -> web.Response:
    city = request.query.get("city", "paris").lower()
    return web.json_response({"city": city, "temp_c": FORECASTS.get(city, 18), "sky": "clear"})


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    headers = {"X-Echo-Method": request.method, "X-Echo-Path": request.raw_path,
               "Content-Type": request.headers.get("Content-Type", "application/octet-stream")}
    headers["X-Echo-Headers"] = json.dumps(list(request.headers.items()))
    status = int(request.headers.get("X-Echo-Status", "200"))
    return web.Response(status=status, body=body, headers=headers)


async def sse(request: web.Request) -> web.StreamResponse:
    count = int(request.query.get("n", "5"))
    interval = float(request.query.get("interval_ms", "50")) / 1000
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        for i in range(count):
            if i:
                await asyncio.sleep(interval)
            await response.write(f"id: {i}\nevent: tick\ndata: {json.dumps({'n': i})}\n\n".encode())
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away: the stream ends here
    return response


async def big(request: web.Request) -> web.StreamResponse:
    size = int(request.query.get("bytes", str(1 << 20)))
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = size
    await response.prepare(request)
    chunk = b"x" * (64 << 10)
    left = size
    while left > 0:
        piece = chunk[:left]
        await response.write(piece)
        left -= len(piece)
    await response.write_eof()
    return response


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/api/search", search)
    app.router.add_get("/api/weather", weather)
    app.router.add_route("*", "/echo{tail:.*}", echo)
    app.router.add_get("/sse", sse)
    app.router.add_get("/big", big)
    app.router.add_get("/health", health)
    return app


async def start(host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start the server; returns its runner (call `cleanup()` to stop) and the bound port."""
    return await serve(make_app(), host, port)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    web.run_app(make_app(), host=args.host, port=args.port, access_log=None)
