"""What a run tells the world: the perturbation log and the operational log (`log`), Prometheus metrics,
spans and their OTLP exporter, and the redaction every one of them applies. May import: protocols
(to name what it describes); never the engine, adapters, control, drill, report or cli."""
