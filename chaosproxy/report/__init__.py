"""Reading perturbation logs and drill results back: robustness reports and trajectory exports.
May import: faults (their components), records (the log and drill folder formats) and the log's schema
(telemetry.log_schema); never the engine, adapters or drill: a report reads files, it runs nothing."""
