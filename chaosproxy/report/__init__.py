"""Reading perturbation logs and drill results back: robustness reports and trajectory exports."""
