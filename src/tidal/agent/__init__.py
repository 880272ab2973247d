"""The node agent: one process per node; registers, holds a lease, runs actions with the mechanism."""
