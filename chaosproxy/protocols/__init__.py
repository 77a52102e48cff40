"""The protocols the engine understands, as views it reads and rewrites: JSON-RPC and MCP, the model APIs
(`llm`), SSE and body streams. No sockets here. May import: telemetry (operational log) only."""
