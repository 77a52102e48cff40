"""What the faults on caching hints (MCP 2026-07-28, server/utilities/caching) share: which results
carry `ttlMs` and `cacheScope`. Not a fault itself: it registers nothing."""

from __future__ import annotations

from typing import Any

from chaosproxy.engine.message import Message

# The results that carry caching hints (server/utilities/caching, "Cacheable Results")
CACHEABLE = frozenset({"server/discover", "tools/list", "prompts/list", "resources/list",
                       "resources/templates/list", "resources/read"})


def cacheable_result(msg: Message) -> dict[str, Any] | None:
    """The result of a cacheable reply in the 2026-07-28 era (`resultType: complete`: a handshake-era
    client caches nothing, and interim input_required results carry no hints), or None."""
    result = (msg.rpc or {}).get("result")
    if msg.method not in CACHEABLE or not isinstance(result, dict) or result.get("resultType") != "complete":
        return None
    return result
