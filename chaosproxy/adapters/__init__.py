"""Adapters turn traffic into engine messages and carry out the actions the engine returns: the HTTP/1.1
data plane (`h1`, `http`), the stdio relay, the mitmproxy addon, and the JSON-RPC body relay they share.
May import: the engine, faults, protocols and telemetry; never control, drill, report or cli."""

from chaosproxy.adapters import compiled  # noqa: F401  (before h1 and http: which form of them runs)
