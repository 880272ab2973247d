"""Tidal: preemptible, migratable, elastic deep-learning jobs."""

__version__ = "0.1.0"
