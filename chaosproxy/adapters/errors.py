"""What the HTTP/1.1 data plane raises when an upstream fails an exchange.

Kept apart from `h1` and `http`, which may be compiled (see `compiled`): a compiled module's classes
cannot be exception classes that others extend with builtin bases (`UpstreamTimeout` is a `TimeoutError`).
"""

from chaosproxy.errors import ChaosproxyError


class UpstreamError(ChaosproxyError):
    """The upstream broke the exchange: refused, closed early, or sent what HTTP does not allow."""


class UpstreamUnreachable(UpstreamError):
    """No connection to the upstream."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """The upstream took longer than --upstream-timeout to answer."""
