"""Reading perturbation logs and drill results back: robustness reports and trajectory exports.
May import: faults (their components) and drill's folder format; never the engine or adapters: a report
reads files, it runs nothing."""
