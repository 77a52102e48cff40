"""Adapters turn traffic into engine messages and carry out the actions the engine returns."""
