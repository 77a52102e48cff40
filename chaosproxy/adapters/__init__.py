"""Adapters turn traffic into engine messages and carry out the actions the engine returns: the HTTP/1.1
data plane (`h1`, `http`), the stdio relay, the mitmproxy addon (`mitm`), and what the HTTP transports
share: the JSON-RPC body relay (`jsonrpc`), the model-API and A2A relays (`llm_relay`, `a2a_relay`: a
protocol's view through the engine, what fired carried out on the body or stream; what they remember per
session, `session_memory`) and the executor of a request's and a response's actions (`execute`, with the
body stages of `shaping`).
May import: the engine, faults, protocols and telemetry; never control, drill, report or cli."""

from chaosproxy.adapters import compiled  # noqa: F401  (before h1 and http: which form of them runs)
