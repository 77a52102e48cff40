"""Adapters turn traffic into engine messages and carry out the actions the engine returns."""

from chaosproxy.adapters import compiled  # noqa: F401  (before h1 and http: which form of them runs)
