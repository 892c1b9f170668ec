"""coder: a local-first autonomous coding agent driven by a task DAG."""

__version__ = "0.1.0"
