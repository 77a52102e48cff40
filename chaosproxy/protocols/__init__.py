"""The protocols the engine understands, as views it reads and rewrites: JSON-RPC and MCP, the model APIs
(`llm`), A2A (`a2a`), SSE and body streams. No sockets here, and no engine at work: the relays that ask the
engine about a protocol's messages and carry out what fired are adapters (`adapters.llm_relay`,
`adapters.a2a_relay`). May import: the engine's model (message, actions) and telemetry; never faults
(faults read these views: they sit above), adapters, control, drill, report or cli."""
