"""Suite-wide test settings."""

from hypothesis import settings

# Property tests draw the same examples on every run and machine: a failure is reproducible, never luck.
settings.register_profile("tidal", derandomize=True, database=None, print_blob=True)
settings.load_profile("tidal")
