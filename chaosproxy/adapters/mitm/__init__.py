"""HTTPS interception adapter (`chaosproxy mitm`): mitmproxy in regular (forward) mode with the engine as an addon.

For agents whose tool calls go to HTTPS APIs they cannot repoint: the agent sets HTTPS_PROXY to this
proxy and trusts mitmproxy's CA. Connections to hosts outside `--hosts` are tunnelled as they are
(never decrypted, mitmproxy's `allow_hosts`); each request to a listed host becomes a
`Message(transport="mitm", route=HOST)` and meets the same faults as under `chaosproxy run`, carried
out by the same executor (adapters/execute, adapters/shaping).

The modules: `hosts` (which hosts, the CA directory), `addon` (the hooks: requests and responses
through the engine), `bodies` (response bodies chunk by chunk), `wire` (the agent's connection, for
faults below HTTP), `proxy` (mitmproxy itself on chaosproxy's event loop).
"""

from chaosproxy.adapters.mitm.hosts import CA_CERT, ConfdirError, HostPatterns, ca_directory
from chaosproxy.adapters.mitm.proxy import MitmProxy

__all__ = ["CA_CERT", "ConfdirError", "HostPatterns", "MitmProxy", "ca_directory"]
