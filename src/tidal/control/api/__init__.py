"""The HTTP API (FastAPI): thin routes over :mod:`tidal.control.jobs` and :mod:`tidal.control.agents`."""
