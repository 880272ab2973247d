"""Baseline policies, each faithful to its paper and run in the same engine as Tidal's policy."""
