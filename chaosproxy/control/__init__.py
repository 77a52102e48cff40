"""The control plane of a running proxy: its HTTP API and console (`api`), scenario reloading, and the
wiring of a run (`runtime`). May import: the engine, adapters, telemetry, faults, protocols; never
drill, report or cli."""
