"""Reading perturbation logs and drill results back: robustness reports and trajectory exports.
May import: faults (their components) and records (the log and drill folder formats); never the engine,
adapters or drill: a report reads files, it runs nothing."""
