"""governor: a cgroup v2 resource governor and launcher for LLM engines on small boards."""

__version__ = "0.2.0"  # the one version: pyproject.toml reads it, the plan cache keys on it
