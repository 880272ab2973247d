"""Trace-driven discrete-event simulator: same policy code as the live system, a virtual clock."""
