"""The agent card: its URLs pointed back through the proxy, its validator, what the relay learns from it.

Without the rewrite, a client follows the card's interface URLs straight to the remote agent and the
proxy sees nothing after the card. v1.0 cards list `supportedInterfaces[].url`; v0.3 cards `url` and
`additionalInterfaces[].url` (a v1.0 server serving v0.3 clients sends both shapes): all are rewritten.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from yarl import URL

_HOST = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def proxy_base(host: str | None, prefix: str) -> str | None:
    """The base URL the agent reached the proxy at (its Host header, checked against the grammar of a
    host and port: what the agent sends is hostile), with the route's prefix; None when it is not one."""
    if host is None or not _HOST.fullmatch(host):
        return None
    return f"http://{host}{prefix}"


def interface_urls(card: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(object, key) of every URL a client may send its calls to over HTTP/1.1, in both card shapes. gRPC
    interfaces are left out: they speak HTTP/2, which the proxy does not relay (pointed at it, they would
    fail; left alone, the client calls the remote agent directly)."""
    found: list[tuple[dict[str, Any], str]] = []
    if isinstance(card.get("url"), str) and not _grpc(card.get("preferredTransport")):
        found.append((card, "url"))
    for key in ("supportedInterfaces", "additionalInterfaces"):
        interfaces = card.get(key)
        if isinstance(interfaces, list):
            found += [(one, "url") for one in interfaces if isinstance(one, dict) and isinstance(one.get("url"), str)
                      and not _grpc(one.get("protocolBinding", one.get("transport")))]
    return found


def _grpc(binding: Any) -> bool:
    return isinstance(binding, str) and binding.upper() == "GRPC"


def point_through(card: dict[str, Any], upstream: URL, base: str) -> list[str]:
    """Rewrite, in place, each interface URL under `upstream` (its origin and base path) to go through
    the proxy at `base`; returns the URLs that point elsewhere (a client calls those directly)."""
    elsewhere = []
    root = upstream.path.rstrip("/")
    for holder, key in interface_urls(card):
        try:
            url = URL(holder[key])
        except ValueError:
            elsewhere.append(holder[key])
            continue
        path = url.path
        if url.is_absolute() and url.origin() == upstream.origin() and (path == root or path.startswith(root + "/")):
            rest = url.raw_path[len(upstream.raw_path.rstrip("/")):]
            holder[key] = base + rest + (f"?{url.raw_query_string}" if url.raw_query_string else "")
        elif holder[key] != base and not holder[key].startswith(base + "/"):
            elsewhere.append(holder[key])
    return elsewhere


def etag(body: bytes) -> str:
    """The proxy's own weak validator for a card it changed (a hash of what the agent gets)."""
    return f'W/"chaosproxy-{hashlib.sha256(body).hexdigest()[:32]}"'


def if_none_match_hits(header: str | None, tag: str) -> bool:
    """Whether an If-None-Match header selects `tag` (weak comparison, RFC 9110 8.2.2 and 13.1.2)."""
    if not header:
        return False
    candidates = [candidate.strip().removeprefix("W/") for candidate in header.split(",")]
    return "*" in candidates or tag.removeprefix("W/") in candidates


def skills(card: dict[str, Any]) -> list[dict[str, Any]]:
    listed = card.get("skills")
    return [skill for skill in listed if isinstance(skill, dict)] if isinstance(listed, list) else []


def skill_ids(card: dict[str, Any]) -> list[str]:
    return [skill["id"] for skill in skills(card) if isinstance(skill.get("id"), str)]
