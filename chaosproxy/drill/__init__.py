"""Chaos drills: an agent run against the proxy over scenarios x repetitions, clean baselines included.
May import: the engine, faults, adapters, control, telemetry, records (the drill folder and log formats),
report (a drill ends in a report) and
cassette (a drill may run offline on one); the
command line only from `fork_server`, the process that runs each proxy's command line."""
