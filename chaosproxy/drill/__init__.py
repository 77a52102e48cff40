"""Chaos drills: an agent run against the proxy over scenarios x repetitions, clean baselines included."""
