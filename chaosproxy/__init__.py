"""chaosproxy: a fault-injecting proxy between LLM agents and their tool servers."""

__version__ = "0.1.0"
