"""stdio adapter: spawns the MCP server command and relays newline-delimited JSON-RPC both ways.

The agent runs us in place of the server (we are the command in its MCP config): its stdin lines
go to the child's stdin, the child's stdout lines come back on our stdout, and the child's stderr is
ours. A line passes byte for byte unless a fault changes it, a line that is not JSON passes too,
and a line is held only while a fault holds it (within a byte bound). Every fault, wire or message
level, acts per line. The server runs in a process group of its own, which never outlives the relay.

The package: `relay` (StdioRelay, the lines and the faults on them) and `process` (the server's process
group and this process's own stdin and stdout). May import: the engine, protocols, telemetry and
adapters.jsonrpc.
"""

from __future__ import annotations

from chaosproxy.adapters.stdio.process import (
    EXIT_CRASHED,
    GUARDIAN,
    KILL_GRACE,
    ServerProcess,
    SpawnError,
    claim_stdio,
    exit_status,
    spawn,
)
from chaosproxy.adapters.stdio.relay import (
    CLOSE_GRACE,
    DRAIN_GRACE,
    HTTP_ERROR,
    LANE_BYTES,
    LANE_DEPTH,
    MAX_LINE,
    SESSION,
    TRANSPORT,
    FrameRecorder,
    StdioRelay,
)

__all__ = ["CLOSE_GRACE", "DRAIN_GRACE", "EXIT_CRASHED", "FrameRecorder", "GUARDIAN", "HTTP_ERROR",
           "KILL_GRACE", "LANE_BYTES", "LANE_DEPTH", "MAX_LINE", "SESSION", "ServerProcess", "SpawnError",
           "StdioRelay", "TRANSPORT", "claim_stdio", "exit_status", "spawn"]
