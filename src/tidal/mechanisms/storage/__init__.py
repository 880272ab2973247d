"""The checkpoint store: content-addressed, zstd-compressed, sha256-verified, atomically committed.

A local directory by default; any fsspec URL (``s3://``, ``gs://``, ``az://``, ``memory://``) through
the same interface. See :class:`CheckpointStore`.
"""

from tidal.mechanisms.storage.manifest import CheckpointInfo, Entry
from tidal.mechanisms.storage.reader import CheckpointReader
from tidal.mechanisms.storage.store import DEFAULT_CHUNK_SIZE, CheckpointStore
from tidal.mechanisms.storage.writer import CheckpointWriter

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "CheckpointInfo",
    "CheckpointReader",
    "CheckpointStore",
    "CheckpointWriter",
    "Entry",
]
