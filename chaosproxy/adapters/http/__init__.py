"""HTTP reverse proxy adapter: one listener, routes by path prefix, faults per request.

The wire is `h1` (asyncio Protocols + httptools). Each request is judged on its head alone
(`Interest.could_act`): when no rule could act on it or its response, it is relayed as it arrives by
callbacks (`Passthrough`, no task, no copy); otherwise it takes the inspecting path (`Inspection`,
one coroutine), which reads what rules need, asks the engine, and carries the actions out. A plain
request no rule could act on (whole in one read, nothing in its head to take out) that finds an idle
pooled connection takes the plain path first (`HttpProxy.relay_plain`, `PlainRelay`): relayed as
written with no Head or Passthrough made (with tracing on, its span opened and the proxy's context put
in its head and body), unless its exchange needs the general path.

Where a call starts and ends, for whoever wants to hook in (tracing): `HttpProxy.handle` builds the
`Call` once the head is known and before anything goes upstream (`Call.upstream_headers` are added to
the request sent there); `Call.finish` logs its call line, exactly once, whatever befell the call.

The paths, a module each: `plain` (PlainRelay), `passthrough` (Passthrough), `inspection` (Inspection);
what they share: `heads` (header lists, framing), `calls` (a call and its call line), `route` (an
upstream and its pool); `proxy` (HttpProxy) chooses among them. `traced` is the pass-through with
tracing on. All but `traced` and this file are compiled with mypyc at install (setup.py).
"""

from chaosproxy.adapters.http.proxy import HttpProxy

__all__ = ["HttpProxy"]
